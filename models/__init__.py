"""Qwen MoE policy (Qwen3.5/3.6 MoE and Qwen3-MoE) in Flax NNX: config, layers, decoder, MTP
head, caches and sampler. Knows nothing of harnesses or RL."""
