"""Reinforcement learning and distillation: live-room simulator, rewards, advantage and loss
math (pure functions), on-policy distillation and rollouts. Holds no mesh axis names."""
