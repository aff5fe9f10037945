"""HSA-RL of the demo's tiny policy in the live room (one CPU machine).

  python -m launch.rl --config=configs/rl_demo.py            # HSA-RL from the demo's SFT policy
  python -m launch.rl --config=configs/rl_demo.py:agentic    # Agentic RL: the original Harness only

The policy starts from `runs/demo/sft/checkpoints` (the paper starts RL from HSA-SFT +
General OPD: point `policy.path` at an OPD run's checkpoints). Each rollout runs 4 scenarios
x 4 episodes through the real agent loop (Skills, tools, Hooks, faults); a step is one
minibatch update. The loop's wall-clock budgets are meaningless for a CPU rollout of a tiny
model: they are set out of the way (`sim.budget_s`), and each model call gets a token budget
(`rollout.max_tokens`). The demo Harness renders ~3.7K prompt tokens, hence 6K-token rows.
"""

import ml_collections

import configs

ARGS = ("hsa", "agentic")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "hsa"
    if variant not in ARGS:
        raise ValueError(f"rl_demo: unknown variant {variant!r}; choose one of {ARGS}")
    c = ml_collections.ConfigDict()
    c.stage = "rl"
    c.run_dir = f"runs/demo/rl_{variant}"
    c.model = ml_collections.ConfigDict(
        dict(
            preset="tiny",
            vocab_size=0,  # 0: the tokenizer's size rounded up to 128 (random policies only)
            dtype="float32",
            param_dtype="float32",
            moe_dispatch="auto",
            # Rollouts prefill a whole step's contexts at once: block-wise attention keeps
            # that O(T) in memory (dense scores of 16 x 4K-token prompts are gigabytes).
            attention_impl="flash",
            attention_block_size=0,  # 0: auto, 256 on CPU, 512 elsewhere
            remat="none",
        )
    )
    c.policy = ml_collections.ConfigDict(dict(kind="orbax", path="runs/demo/sft/checkpoints"))
    c.data = ml_collections.ConfigDict(dict(tokenizer_dir=""))
    c.sim = ml_collections.ConfigDict(
        dict(
            # the bundled live room: "v0" (Harness v0) or "micro" (the compact Harness the
            # miniature learns; `hat_jax.livestream.room`)
            room="v0",
            world="",  # "" = the bundled world (data/livestream) with the room's Harness; or a
            # world folder with its own harness/
            scenarios="",  # "" = generated from the world; or a scenario JSONL
            split="train",
            eval_split="dev",
            # HSA: the share of episodes under the original Harness (Agentic RL: all of them)
            original_fraction=0.25 if variant == "hsa" else 1.0,
            hsa_dims="all" if variant == "hsa" else "",
            hsa_strength=0.5,
            fault_timeout=0.05,
            fault_malformed=0.05,
            fault_denied=0.0,
            max_rounds=4,
            budget_s=1e6,  # wall-clock budget per episode (serving: 10 s)
            tool_timeout_s=60.0,  # per tool call (serving: 5 s)
        )
    )
    c.rollout = ml_collections.ConfigDict(
        dict(
            scenarios=4,
            group_size=4,
            epochs=1,
            temperature=1.0,
            top_p=1.0,
            max_tokens=96,
            enable_thinking=True,
            decode_moe_dispatch="dense",
            sample_chunk=0,  # conversations per sampler call (0: all of a barrier's at once)
            # > 0: self-speculative rollouts, this many MTP drafts verified per step (the same
            # distribution as plain sampling); the head: an MTP stage's `<run>/head` or an HF
            # checkpoint with mtp.* tensors (default: the policy's own, if HF and it has them).
            num_draft_tokens=0,
            draft_head="",
            # "lockstep": each round's calls sampled together at a barrier; "slots": continuous
            # batching (a call joins between decode steps, leaves when its row ends; plain
            # sampling, so num_draft_tokens and sample_chunk stay 0)
            engine="lockstep",
        )
    )
    c.advantages = ml_collections.ConfigDict(
        dict(length_weight=0.1, length_low=100.0, length_high=200.0, filter_atol=0.0)
    )
    c.gspo = ml_collections.ConfigDict(dict(eps_low=3e-4, eps_high=4e-4, token_level=False))
    c.kl_coef = 0.0  # > 0: a frozen reference (the starting policy) and a k3 KL to it
    c.kl_estimator = "k3"
    c.old_logprobs = "sampler"  # or "recompute": a forward pass before each rollout's updates
    c.aux_loss_coef = 0.0  # < 0: the model's router_aux_loss_coef
    c.logits_chunk = 0  # > 0: log-probs this many positions at a time (no [rows, T, V] logits)
    # The LLM judge panel for Accuracy and Effectiveness (rule rewards when empty): a list of
    # "base_url|model" entries (an odd number); on_failure "fail" or "rules" (never zero).
    c.judge = ml_collections.ConfigDict(dict(endpoints="", on_failure="fail", cache_dir=""))
    c.eval = ml_collections.ConfigDict(dict(scenarios=8, trajectories=3))
    c.keep_rollouts = 4
    c.trainer = configs.trainer(
        total_steps=12,
        batch_size=16,
        seq_len=6144,
        log_every=1,
        eval_every=6,
        checkpoint_every=6,
        keep_checkpoints=2,
    )
    c.optimizer = configs.optimizer(learning_rate=1e-4, warmup_steps=0, decay_steps=12)
    c.mesh = configs.mesh()
    return c
