"""`make demo`: the HAT pipeline on the embedded default (tiny model, bundled world and Harness).

Stages, in order, each writing under `--workdir` (default `runs/demo`):

1. corpus  — the scripted teacher answers sampled scenarios under the original Harness and
             augmented Harness states in the live-room simulator; quality-filtered
             (`launch.make_corpus`, train and dev splits).
2. sft     — HSA-SFT of the tiny Qwen3.5-MoE on that corpus, with online HSA, checkpoints,
             metrics and plots (`launch.sft`, `configs/sft_demo.py`).
3. mtp     — MTP draft-head adaptation: the SFT policy frozen, a draft head trained on its
             own rollouts; acceptance before and after (`launch.mtp`, `configs/mtp_demo.py`).
4. export  — the SFT policy with the adapted head converted to a Hugging Face directory
             (`serve.convert to-hf --mtp`, with the `mtp.*` tensors SGLang reads), reloaded
             with `transformers` and its logits compared with ours.

`report.md` says what ran, how long it took, the figures, and where every output is. The
pipeline is resumable: a rerun reuses a finished corpus and resumes SFT and the MTP stage
from their checkpoints.

  python -m launch.demo [--workdir runs/demo] [--steps 24] [--num_scenarios 40]
"""

import json
import pathlib
import platform
import shutil
import time

from absl import app, flags

from hat_jax import files, host_memory
from launch import _logs

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Where the demo writes its outputs.")
_STEPS = flags.DEFINE_integer("steps", None, "SFT steps (default: configs/sft_demo.py's).")
_SCENARIOS = flags.DEFINE_integer("num_scenarios", 40, "Training scenarios in the corpus.")
_STATES = flags.DEFINE_integer("states_per_scenario", 3, "Harness states per scenario.")
_FRESH = flags.DEFINE_bool("fresh", False, "Delete the workdir first instead of resuming.")


def _environment(workdir: pathlib.Path) -> list[str]:
    import jax

    return [
        f"python {platform.python_version()}, jax {jax.__version__}",
        f"backend {jax.default_backend()}, {jax.device_count()} device(s)",
    ]


def _corpus(workdir: pathlib.Path) -> list[str]:
    import data
    from hat_jax.metrics import Progress

    out = workdir / "corpus"
    lines = []
    for split, scenarios in (("train", _SCENARIOS.value), ("dev", max(4, _SCENARIOS.value // 8))):
        manifest_path = out / f"{split}.manifest.json"
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text())
            lines.append(f"{split}: reused {manifest_path}")
        else:
            config = data.CorpusConfig(
                split=split, num_scenarios=scenarios, states_per_scenario=_STATES.value
            )
            bar = Progress(len(data.corpus_scenario_ids(config)), desc=f"corpus {split}",
                           unit="scenario")  # fmt: skip
            try:
                manifest = data.write_corpus(config, out, num_shards=2, progress=bar.update)
            finally:
                bar.close()
        total = manifest["stats"]["total"]
        lines.append(
            f"{split}: kept {total.get('kept', 0)} of {total.get('episodes', 0)} teacher episodes "
            f"({scenarios} scenarios x {_STATES.value} Harness states) -> {out}/{split}.stats.md"
        )
    return lines


def _sft(workdir: pathlib.Path) -> list[str]:
    from configs import sft_demo
    from launch import sft

    config = sft_demo.get_config()
    config.data.corpus = str(workdir / "corpus")
    if _STEPS.value:
        config.trainer.total_steps = _STEPS.value
        config.optimizer.decay_steps = _STEPS.value
        config.trainer.eval_every = config.trainer.checkpoint_every = max(1, _STEPS.value // 2)
    result = sft.run(config, run_dir=str(workdir / "sft"))
    if result.checkpoint_dir is None:
        raise RuntimeError("SFT finished without a checkpoint")
    files.write_text(workdir / "sft" / "LATEST", str(result.checkpoint_dir))
    records = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    curve = f"training loss {train[0]['loss']:.3f} (step {train[0]['step']}) -> "
    curve += f"{train[-1]['loss']:.3f} (step {train[-1]['step']})"
    evals = [r for r in records if "eval/loss" in r]
    if evals:
        curve += f"; dev loss {evals[0]['eval/loss']:.3f} -> {evals[-1]['eval/loss']:.3f}"
    return [curve, *sft.summary(result), f"overview plot: {result.plots_dir / 'overview.png'}"]


def _mtp(workdir: pathlib.Path) -> list[str]:
    from configs import mtp_demo
    from launch import mtp

    config = mtp_demo.get_config()
    config.policy.path = str(workdir / "sft" / "checkpoints")
    config.export.hf_dir = ""  # the export stage writes the policy and head together
    result = mtp.run(config, run_dir=str(workdir / "mtp"))
    files.write_text(workdir / "mtp" / "HEAD", str(result.head_dir))
    return mtp.summary(result)


def _export(workdir: pathlib.Path) -> list[str]:
    import numpy as np

    from serve import convert

    checkpoint = (workdir / "sft" / "LATEST").read_text().strip()
    head = (workdir / "mtp" / "HEAD").read_text().strip()
    out = workdir / "hf"
    if out.exists():
        shutil.rmtree(out)
    convert.main(
        ["to-hf", "--checkpoint", checkpoint, "--mtp", head, "--out", str(out),
         "--dtype", "float32",
         "--tokenizer_dir", str(pathlib.Path(__file__).parents[1] / "data" / "tokenizer")]
    )  # fmt: skip
    if not convert.has_mtp(out):
        raise RuntimeError(f"{out}: the export holds no mtp.* draft head")
    diff = _compare_with_transformers(out, np)
    return [
        f"Hugging Face directory: {out} (config.json, safetensors with the mtp.* draft head, "
        "tokenizer, chat template)",
        f"reloaded with transformers.AutoModelForCausalLM: max |logits diff| vs ours {diff:.2e}",
    ]


def _compare_with_transformers(hf_dir: pathlib.Path, np) -> float:
    """Max |logit difference| between transformers and our model on one rendered prompt."""
    import torch
    import transformers

    from data.tokenizer import load_tokenizer
    from hat_jax import chat_format
    from serve import convert

    tokenizer = load_tokenizer(str(hf_dir))
    messages = [{"role": "user", "content": "How much is the serum today, and is it in stock?"}]
    ids = tokenizer(chat_format.render(messages, add_generation_prompt=True))["input_ids"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = theirs(torch.tensor([ids])).logits.numpy()
    _, ours = convert.load_hf(hf_dir, dtype="float32")
    got = np.asarray(ours(np.asarray([ids], dtype=np.int32)).logits)
    return float(np.max(np.abs(got - ref)))


# (name, function(workdir) -> report lines), run in order.
STAGES = [
    ("environment", _environment),
    ("corpus", _corpus),
    ("sft", _sft),
    ("mtp", _mtp),
    ("export", _export),
]


def main(argv):
    del argv
    _logs.quiet()
    host_memory.retain_freed_memory()  # CPU: no page faults re-touching each step's buffers
    workdir = pathlib.Path(_WORKDIR.value)
    if _FRESH.value and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    report = ["# hat-jax demo report", ""]
    for name, stage in STAGES:
        print(f"[demo] stage {name} ...", flush=True)
        start = time.perf_counter()
        lines = stage(workdir)
        seconds = time.perf_counter() - start
        report += [f"## {name} ({seconds:.1f} s)", "", *[f"- {line}" for line in lines], ""]
        files.write_text(workdir / "report.md", "\n".join(report))
        for line in lines:
            print(f"[demo]   {line}", flush=True)
        print(f"[demo] stage {name} done in {seconds:.1f} s", flush=True)
    print(f"[demo] report: {workdir / 'report.md'}")


if __name__ == "__main__":
    app.run(main)
