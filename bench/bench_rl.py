"""HSA-RL steps: a single-turn GRPO/GSPO step, ours vs TRL's GRPOTrainer, and our multi-turn
agent step.

Single-turn (the work a peer can run too, no tools): B prompts x G completions of exactly N
tokens sampled with the policy at temperature 1, a reward on the completion's token ids,
group-normalised advantages, one AdamW update with GSPO's sequence-level ratio (clip range
3e-4 / 4e-4, no KL). Ours: `models.Sampler` over the policy's current weights (through
`rl.StudentSampler`), rows as `rl.rollout_rows` lays them out, `rl.grpo` advantages, the RL
stage's compiled step (`rl.rl_driver`); TRL: `GRPOTrainer` with
`importance_sampling_level="sequence"` (see `bench/_grpo_peer.py`). Both start from the same
Hugging Face directory (a random transformers Qwen3.5-MoE), fp32 on CPU, the same prompt ids.
Medians over the steps after the first.

Multi-turn: our RL stage's own step on the bundled live room (the real agent loop: Skills,
tools, Hooks, faults) with a random tiny policy: trajectories per second and where a
rollout's time goes (sampling; the loop's tool and Hook work and the rewards; the update),
once per rollout engine (`--engines`: the lockstep barrier, continuous batching on slots).

With `--draft_tokens K` (default 3; 0 skips it) our single-turn step runs a second time with
the policy sampling self-speculatively (`rollout.num_draft_tokens`) with an MTP draft head;
the table gains that column and its ratio to TRL. The head is random (so is the policy): its
acceptance and speed say nothing about a learned policy (at temperature 1 both distributions
are near uniform, so sampled drafts pass often); a learned policy's is measured by
`bench_decode --corpus` on the MTP stage's export.

    python -m bench rl                       # mid-size config, B=4, G=4, N=32
    python -m bench.bench_rl --tiny --steps 4 --skip_agent
    python -m bench.bench_rl --agent_only    # the multi-turn step, lockstep vs slots engine
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

import numpy as np


def _reward(ids) -> float:
    """The synthetic reward of both sides: the share of even token ids."""
    ids = list(ids)
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


def ours_step_times(
    policy_dir, prompts, *, group_size, max_new_tokens, steps, lr, tokenizer, draft_tokens=0
):
    """Per-step sampling / learning seconds of our single-turn GRPO/GSPO step
    (`draft_tokens` > 0: sampling self-speculatively with a random MTP head)."""
    import jax

    import models
    import rl
    from hat_jax import sharding, train
    from launch._common import init_source

    config = models.QwenConfig.from_hf(policy_dir, dtype="float32", param_dtype="float32",
                                       moe_dispatch="capacity")  # fmt: skip
    rows_per_step = len(prompts) * group_size
    rl_config = rl.RLConfig(
        trainer=train.TrainerConfig(total_steps=steps, batch_size=rows_per_step,
                                    seq_len=max(map(len, prompts)) + max_new_tokens,
                                    progress=False, plots=False),
        optimizer=train.OptimizerConfig(learning_rate=lr, warmup_steps=0, decay_steps=steps,
                                        min_learning_rate_ratio=1.0, weight_decay=0.0),
    )  # fmt: skip
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    with tempfile.TemporaryDirectory(prefix="bench_rl_") as run_dir:
        driver = rl.rl_driver(
            rl_config,
            model_config=config,
            run_dir=run_dir,
            mesh=mesh,
            init_policy=init_source(("hf", policy_dir), config, name="policy"),
        )
    state = driver.initial_state()
    head = None
    if draft_tokens:
        from flax import nnx

        head = models.MTPHead(config, rngs=nnx.Rngs(1))
    sampler = rl.StudentSampler(pad_id=tokenizer.pad_token_id, stop_tokens=(),
                                decode_overrides={"moe_dispatch": "dense"}, draft_head=head,
                                num_draft_tokens=draft_tokens)  # fmt: skip
    repeated = [p for p in prompts for _ in range(group_size)]
    groups = np.repeat(np.arange(len(prompts)), group_size)
    out = []
    for step in range(steps):
        start = time.perf_counter()
        sample = sampler(driver.model(state), repeated, max_new_tokens=max_new_tokens,
                         sampling=models.Sampling(temperature=1.0),
                         seed=jax.random.key(step))  # fmt: skip
        rewards = np.asarray([_reward(sample.completion(i)) for i in range(rows_per_step)])
        advantages = np.asarray(rl.grpo(rewards, groups, eps=1e-4))
        segments = [rl.Segment(episode=i, group=int(groups[i]), round=1, kind=rl.REPLY,
                               cot_length=0, prompt=np.asarray(sample.prompts[i]),
                               completion=np.asarray(sample.completion(i)),
                               logprobs=sample.policy_logprobs[i, : sample.lengths[i]])
                    for i in range(rows_per_step)]  # fmt: skip
        rows, _ = rl.rollout_rows(segments, advantages, seq_len=rl_config.trainer.seq_len,
                                  pad_id=tokenizer.pad_token_id)  # fmt: skip
        rows["fresh"] = np.ones_like(rows["loss_mask"])
        sampled = time.perf_counter()
        state, metrics = driver.step_fn(state, sharding.global_batch(rows, mesh))
        jax.block_until_ready(state.params)
        done = time.perf_counter()
        assert (sample.lengths == max_new_tokens).all()
        out.append({"step_s": done - start, "sampling_s": sampled - start,
                    "learning_s": done - sampled, "loss": float(metrics["loss"]),
                    "reward": float(rewards.mean()),
                    "acceptance_length": sample.acceptance_length or 1.0})  # fmt: skip
    return out


class _Rollouts:
    """An RL source that stops (StopIteration ends the trainer's loop) before its
    `limit + 1`-th rollout."""

    def __init__(self, source, limit: int):
        self.source, self.limit = source, limit

    def next_batch(self, model):
        s = self.source
        if s.rollouts >= self.limit and s.minibatch >= s.minibatches:
            raise StopIteration
        return s.next_batch(model)

    def get_state(self):
        return self.source.get_state()

    def set_state(self, state):
        self.source.set_state(state)


def agent_step(
    rollouts: int = 3, engine: str = "lockstep", room: str = "v0", policy: str = "",
    max_tokens: int = 64,
) -> dict[str, float]:  # fmt: skip
    """Our multi-turn RL step on a bundled live room (`room`), its calls decoded by `engine`
    (`rl.RLRolloutConfig.engine`): a random policy of the room's preset, or `policy` (a
    stage's Orbax checkpoints, e.g. an SFT run's `checkpoints`) at temperature 1."""
    import jax

    import models
    import rl
    from data.tokenizer import load_tokenizer
    from hat_jax import harness as hx
    from hat_jax import sharding, train
    from hat_jax.metrics import read_metrics
    from launch._common import init_source

    tokenizer = load_tokenizer()
    preset = "micro" if room == "micro" else "tiny"
    config = models.QwenConfig.preset(preset, vocab_size=-(-len(tokenizer) // 128) * 128,
                                      dtype="float32", param_dtype="float32",
                                      moe_dispatch="capacity", attention_impl="flash")  # fmt: skip
    seq_len = 2560 if room == "micro" else 6144  # the room's prompts and a reply
    rl_config = rl.RLConfig(
        trainer=train.TrainerConfig(total_steps=10_000, batch_size=16, seq_len=seq_len,
                                    log_every=1, checkpoint_every=0, progress=False,
                                    plots=False),
        rollout=rl.RLRolloutConfig(scenarios=4, group_size=4, max_tokens=max_tokens,
                                   decode_moe_dispatch="dense", engine=engine),
    )  # fmt: skip
    live_room = rl.LiveRoom(rl.SimConfig(room=room, limits=hx.Limits(
        max_rounds=4, budget_s=1e6, tool_timeout_s=60)))  # fmt: skip
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    init = init_source(("orbax", policy) if policy else ("random", ""), config, name="policy")
    with tempfile.TemporaryDirectory(prefix="bench_rl_agent_") as run_dir:
        driver = rl.rl_driver(rl_config, model_config=config, run_dir=run_dir, mesh=mesh,
                              init_policy=init)  # fmt: skip
        source = rl.RLSource(live_room, tokenizer, rollout=rl_config.rollout,
                             advantages=rl_config.advantages, batch_size=16, seq_len=seq_len,
                             run_dir=pathlib.Path(run_dir), seed=0)  # fmt: skip
        driver.run(_Rollouts(source, rollouts))
        records = read_metrics(run_dir)
    steps = [r for r in records if "loss" in r]
    firsts = [r for r in steps if "rollout_seconds" in r][1:]  # the first compiles
    if not firsts:
        return {}
    updates = [r for r in steps if r["step"] > firsts[0]["step"] - 1]
    mean = lambda rows, k: statistics.mean(r[k] for r in rows)  # noqa: E731
    rollout, sampling = mean(firsts, "rollout_seconds"), mean(firsts, "sampling_seconds")
    learn = sum(r["learn_seconds"] for r in updates) / len(firsts)  # per rollout
    total = rollout + learn
    return {
        "trajectories_per_second": mean(firsts, "trajectories_per_second"),
        "rounds": mean(firsts, "rounds"),
        "updates": len(updates) / len(firsts),
        "sampling_share": sampling / total,
        "loop_share": (rollout - sampling) / total,
        "learning_share": learn / total,
        "step_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the 4-layer test config")
    parser.add_argument("--batch", type=int, default=4, help="prompts per step (B)")
    parser.add_argument("--group", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="the first is a warm-up")
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--skip_agent", action="store_true", help="single-turn only")
    parser.add_argument("--draft_tokens", type=int, default=3, help="0: no speculative run")
    parser.add_argument(
        "--engines",
        default="lockstep,slots",
        help="the multi-turn step's rollout engines, each measured in turn",
    )
    parser.add_argument("--agent_only", action="store_true", help="the multi-turn step only")
    parser.add_argument("--room", default="v0", choices=("v0", "micro"),
                        help="the multi-turn step's live room (and model preset)")  # fmt: skip
    parser.add_argument(
        "--policy",
        default="",
        help="the multi-turn step's policy: Orbax checkpoints (default random)",
    )
    parser.add_argument("--rollouts", type=int, default=3, help="multi-turn rollouts per engine")
    parser.add_argument("--max_tokens", type=int, default=64, help="tokens per model call")
    args = parser.parse_args()
    agent = dict(room=args.room, policy=args.policy, rollouts=args.rollouts,
                 max_tokens=args.max_tokens)  # fmt: skip
    if args.agent_only:
        _print_agent_steps(args.engines.split(","), **agent)
        return

    from hat_jax.host_memory import retain_freed_memory

    retain_freed_memory(True)
    from bench._grpo_peer import grpo_step_times
    from bench.bench_opd import _model_dirs, print_step_table
    from data.tokenizer import load_tokenizer
    from hat_jax import chat_format

    tokenizer = load_tokenizer()
    questions = ["Is the blue jacket still in stock?", "How long does shipping take?",
                 "Can I use two coupons on one order?", "Does this serum suit dry skin?"]  # fmt: skip
    prompts = [
        tokenizer(chat_format.render([{"role": "user", "content": questions[i % 4]}],
                                     add_generation_prompt=True, enable_thinking=False),
                  add_special_tokens=False)["input_ids"]
        for i in range(args.batch)
    ]  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}; B={args.batch} prompts x G={args.group}, "
          f"N={args.new_tokens} new tokens, {args.steps} steps "
          f"({'tiny' if args.tiny else 'mid-size'} config), fp32")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_rl_models_") as root:
        policy, _ = _model_dirs(pathlib.Path(root), args.tiny, tokenizer)
        common = dict(group_size=args.group, max_new_tokens=args.new_tokens, steps=args.steps)
        ours = ours_step_times(policy, prompts, lr=args.learning_rate, tokenizer=tokenizer,
                               **common)  # fmt: skip
        theirs = grpo_step_times(policy, prompts, reward_fn=_reward,
                                 learning_rate=args.learning_rate, **common)  # fmt: skip
        spec = None
        if args.draft_tokens:
            spec = ours_step_times(policy, prompts, lr=args.learning_rate, tokenizer=tokenizer,
                                   draft_tokens=args.draft_tokens, **common)  # fmt: skip
    a, b = print_step_table(
        "single-turn GRPO/GSPO step", "TRL GRPO", ours, theirs["per_step"], spec,
        args.draft_tokens, learning="learning (rewards, advantages, fwd+bwd, update)",
    )  # fmt: skip
    ratio = b["step_s"] / a["step_s"]
    print(f"speed-up per step ours vs TRL GRPO: {ratio:.2f}x (target >= 3x: "
          f"{'met' if ratio >= 3 else 'not met'})")  # fmt: skip
    print(f"ours per step: {[round(r['step_s'], 3) for r in ours]}")
    print(f"TRL per step:  {[round(r['step_s'], 3) for r in theirs['per_step']]}")
    if not args.skip_agent:
        _print_agent_steps(args.engines.split(","), **agent)


def _print_agent_steps(engines: list[str], **agent_args) -> None:
    """The multi-turn step once per rollout engine, in one process (the same CPU state)."""
    rates = {}
    policy = agent_args.get("policy") or "random policy"
    for engine in engines:
        agent = agent_step(engine=engine, **agent_args)
        rates[engine] = agent["trajectories_per_second"]
        print(f"multi-turn agent step, {engine} engine ({agent_args.get('room', 'v0')} live "
              f"room, {policy}, 4 x 4 episodes): "
              f"{agent['trajectories_per_second']:.2f} trajectories/s "
              f"(rollout only), {agent['rounds']:.2f} rounds per episode, {agent['step_s']:.1f} "
              f"s per rollout and its {agent['updates']:.1f} updates: sampling "
              f"{agent['sampling_share']:.0%}, agent loop (tools, Hooks, rewards) "
              f"{agent['loop_share']:.0%}, learning {agent['learning_share']:.0%}")  # fmt: skip
    if len(rates) > 1:
        base = engines[0]
        print(" ".join(f"{e} / {base} trajectories/s: {rates[e] / rates[base]:.2f}x"
                       for e in engines[1:]))  # fmt: skip


if __name__ == "__main__":
    main()
