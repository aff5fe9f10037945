"""One General-OPD step: ours (`rl.run_opd`'s stage on the stage driver) vs TRL's GKD trainer.

A step: sample B prompts x N new tokens with the student, teacher forward over prompt +
response, student forward + backward + AdamW update, with the exact full-vocabulary reverse
KL on the student's sampled tokens (TRL: `GKDTrainer`, lmbda=1, beta=1; see
`bench/_gkd_peer.py` for how that TRL version defines them and how its loss is normalised).
Both sides start from the same Hugging Face directories (random weights saved with
transformers' own classes: a student and a different teacher), fp32 on CPU, the same prompt
token ids every step, exactly N new tokens per row (no stop token), constant learning rate.

Ours runs the real stage: `rl.opd_driver` + `OPDSource` through the `Trainer` loop, the CPU
choices a user would make (the "capacity" MoE dispatch for training, "dense" for the
per-token decode steps, freed host memory retained); its per-step `data_seconds`
(sampling) and `learn_seconds` (the train step, awaited) come from the run's metrics. TRL's
split comes from wrapping its `generate`. Medians over the steps after the first (compile /
warm-up). The CPU may be shared: the load average is printed.

With `--draft_tokens K` (default 3; 0 skips it) our stage runs a second time sampling
self-speculatively (`sampling.num_draft_tokens`) with an MTP draft head, and the table gains
that column and its ratio to TRL. The head is random here (the student is random: there is
nothing for a head to learn): the acceptance length printed, and so the column's speed, say
nothing about a policy that has learned its task (at temperature 1 a random policy's and a
random head's distributions are both near uniform, so sampled drafts pass often); that is
measured by `bench_decode --corpus` on the MTP stage's export.

    python -m bench opd                     # mid-size config (bench_model's), B=8, N=64
    python -m bench.bench_opd --tiny --batch 4 --new_tokens 32 --steps 4
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import tempfile

import numpy as np


def _model_dirs(root: pathlib.Path, tiny: bool, tokenizer) -> tuple[str, str]:
    """Student (seed 1) and teacher (seed 2): random transformers Qwen3.5-MoE models."""
    import torch
    import transformers

    from bench.bench_model import hf_config
    from data.tokenizer import DEFAULT_DIR

    if tiny:
        config = transformers.Qwen3_5MoeTextConfig(
            vocab_size=-(-len(tokenizer) // 128) * 128, hidden_size=64, num_hidden_layers=4,
            layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=24, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                             "partial_rotary_factor": 0.25},
        )  # fmt: skip
    else:
        config = hf_config()
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    out = []
    for name, seed in (("student", 1), ("teacher", 2)):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        directory = root / name
        model.save_pretrained(directory)
        for f in pathlib.Path(DEFAULT_DIR).iterdir():
            if f.name.startswith("tokenizer"):
                shutil.copy(f, directory / f.name)
        out.append(str(directory))
    return out[0], out[1]


class _SamePrompts:
    """The same prompt batch every step (a prompt source with a trivial state)."""

    def __init__(self, prompts: list[list[int]], pad: int):
        width = max(len(p) for p in prompts)
        self.batch = {
            "prompt_ids": np.asarray([p + [pad] * (width - len(p)) for p in prompts], np.int32),
            "prompt_lengths": np.asarray([len(p) for p in prompts], np.int32),
        }

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


def ours_step_times(
    student_dir, teacher_dir, prompts, *, max_new_tokens, steps, lr, tokenizer, draft_tokens=0
):
    """Per-step sampling / learning seconds of our OPD stage on the HF directories
    (`draft_tokens` > 0: sampling self-speculatively with a random MTP head)."""
    import jax

    import models
    import rl
    from hat_jax import sharding, train
    from hat_jax.metrics import read_metrics
    from launch._common import init_source

    runtime = dict(dtype="float32", param_dtype="float32", moe_dispatch="capacity")
    config = models.QwenConfig.from_hf(student_dir, **runtime)
    longest = max(len(p) for p in prompts)
    opd = rl.OPDConfig(
        trainer=train.TrainerConfig(total_steps=steps, batch_size=len(prompts),
                                    seq_len=longest + max_new_tokens, log_every=1,
                                    checkpoint_every=0, progress=False, plots=False),
        optimizer=train.OptimizerConfig(learning_rate=lr, warmup_steps=0, decay_steps=steps,
                                        min_learning_rate_ratio=1.0, weight_decay=0.0),
        max_prompt_len=longest, max_new_tokens=max_new_tokens, decode_moe_dispatch="dense",
    )  # fmt: skip
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    with tempfile.TemporaryDirectory(prefix="bench_opd_") as run_dir:
        driver = rl.opd_driver(
            opd, student_config=config, teacher_config=config, run_dir=run_dir, mesh=mesh,
            init_student=init_source(("hf", student_dir), config, name="student"),
            init_teacher=init_source(("hf", teacher_dir), config, name="teacher"),
        )  # fmt: skip
        head = None
        if draft_tokens:
            from flax import nnx

            head = models.MTPHead(config, rngs=nnx.Rngs(1))
        sampler = rl.StudentSampler(pad_id=tokenizer.pad_token_id, stop_tokens=(),
                                    decode_overrides=opd.decode_overrides(), draft_head=head,
                                    num_draft_tokens=draft_tokens)  # fmt: skip
        source = rl.OPDSource(_SamePrompts(prompts, tokenizer.pad_token_id), sampler=sampler,
                              config=opd, seed=0)  # fmt: skip
        driver.run(source)
        records = [r for r in read_metrics(run_dir) if "loss" in r]
    assert all(r["response_length"] == max_new_tokens for r in records)
    return [
        {"step_s": r["data_seconds"] + r["learn_seconds"], "sampling_s": r["data_seconds"],
         "learning_s": r["learn_seconds"], "loss": r["loss"],
         "acceptance_length": r.get("acceptance_length", 1.0)}
        for r in records
    ]  # fmt: skip


def _medians(per_step: list[dict]) -> dict[str, float]:
    timed = per_step[1:]
    return {
        k: statistics.median(r[k] for r in timed) for k in ("step_s", "sampling_s", "learning_s")
    }


def print_step_table(title, peer, ours, theirs, spec, draft_tokens, *, learning):
    """Prints the per-step medians of ours, the peer's and (`spec`) ours sampling
    speculatively, with the peer's time over ours; returns the medians of ours and the peer."""
    a, b = _medians(ours), _medians(theirs)
    c = _medians(spec) if spec else None
    print(f"load average {os.getloadavg()[0]:.2f}")
    head = f"| {title} (median of steps 2..) | ours (JAX) | {peer} | peer / ours |"
    rule = "|---|---|---|---|"
    if c:
        head += f" ours, speculative k={draft_tokens} (random head) | peer / ours speculative |"
        rule += "---|---|"
    print(head)
    print(rule)
    for key, label in (
        ("step_s", "whole step"),
        ("sampling_s", "sampling"),
        ("learning_s", learning),
    ):
        row = f"| {label} | {a[key]:.3f} s | {b[key]:.3f} s | {b[key] / a[key]:.2f}x |"
        if c:
            row += f" {c[key]:.3f} s | {b[key] / c[key]:.2f}x |"
        print(row)
    if spec:
        accept = statistics.median(r["acceptance_length"] for r in spec[1:])
        print(f"speculative sampling: acceptance length {accept:.2f} of at most "
              f"{draft_tokens + 1} (random policy and head: at temperature 1 both are near "
              "uniform, so drafts pass often; not a figure of a learned policy, which "
              "bench_decode --corpus measures)")  # fmt: skip
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the 4-layer test config")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5, help="the first is a warm-up")
    parser.add_argument("--learning_rate", type=float, default=1e-5)
    parser.add_argument("--draft_tokens", type=int, default=3, help="0: no speculative run")
    args = parser.parse_args()

    from hat_jax.host_memory import retain_freed_memory

    retain_freed_memory(True)
    from bench._gkd_peer import gkd_step_times
    from data.tokenizer import load_tokenizer
    from hat_jax import chat_format

    tokenizer = load_tokenizer()
    questions = [
        "Is the blue jacket still in stock?", "How long does shipping take to Hangzhou?",
        "Can I use two coupons on one order?", "What sizes does the linen dress come in?",
        "I want to return my shoes, what do I do?", "Does this serum suit dry skin?",
        "Write a short poem about a rainy market.", "Explain what a live-stream host does.",
    ]  # fmt: skip
    prompts = [
        tokenizer(chat_format.render([{"role": "user", "content": questions[i % 8]}],
                                     add_generation_prompt=True, enable_thinking=False),
                  add_special_tokens=False)["input_ids"]
        for i in range(args.batch)
    ]  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}; B={args.batch} prompts of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, N={args.new_tokens} new "
          f"tokens, {args.steps} steps ({'tiny' if args.tiny else 'mid-size'} config), fp32")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench_opd_models_") as root:
        student, teacher = _model_dirs(pathlib.Path(root), args.tiny, tokenizer)
        common = dict(max_new_tokens=args.new_tokens, steps=args.steps)
        ours = ours_step_times(student, teacher, prompts, lr=args.learning_rate,
                               tokenizer=tokenizer, **common)  # fmt: skip
        theirs = gkd_step_times(student, teacher, prompts, learning_rate=args.learning_rate,
                                **common)  # fmt: skip
        spec = None
        if args.draft_tokens:
            spec = ours_step_times(student, teacher, prompts, lr=args.learning_rate,
                                   tokenizer=tokenizer, draft_tokens=args.draft_tokens,
                                   **common)  # fmt: skip
    a, b = print_step_table(
        "per step", "TRL GKD (PyTorch)", ours, theirs["per_step"], spec, args.draft_tokens,
        learning="learning (teacher fwd, student fwd+bwd, update)",
    )  # fmt: skip
    ratio = b["step_s"] / a["step_s"]
    print(f"speed-up per step ours vs TRL GKD: {ratio:.2f}x (target >= 3x: "
          f"{'met' if ratio >= 3 else 'not met'})")  # fmt: skip
    print(f"first-step loss: ours {ours[0]['loss']:.5f}, TRL {theirs['per_step'][0]['loss']:.5f} "
          "(the same weights, different samples)")  # fmt: skip
    print(f"ours per step: {[round(r['step_s'], 3) for r in ours]}")
    print(f"TRL per step:  {[round(r['step_s'], 3) for r in theirs['per_step']]}")


if __name__ == "__main__":
    main()
