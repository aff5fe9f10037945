"""Build the HSA-SFT teacher corpus: scenarios x K Harness states x a teacher, quality-filtered.

  python -m launch.make_corpus --out runs/corpus                        # HSA-SFT, scripted teacher
  python -m launch.make_corpus --out runs/micro/corpus --room micro     # the micro live room
  python -m launch.make_corpus --out runs/corpus_fixed --states original --states_per_scenario 1
  python -m launch.make_corpus --out runs/corpus --teacher openai \
      --base_url http://localhost:30000/v1 --model teacher-model --num_scenarios 500 \
      --server_extensions                                  # SGLang's request fields

For each scenario of each `--splits` split: K Harness states (the original plus K-1 fresh
augmentations, or only the original for the Fixed-Harness ablation), one teacher episode in each
through the simulator, the quality filter (Accuracy 1, Effectiveness >= --min_effectiveness), and
the retry-history policy (--retry_fraction of retried trajectories keep their full history).
Writes `<split>-NNNNN-of-MMMMM.array_record`, `<split>.jsonl`, `<split>.stats.md|json` and
`<split>.manifest.json` under --out; train with `data.PipelineConfig(sources=(out,), split=...)`.
"""

import os

from absl import app, flags

import data
from hat_jax import livestream
from hat_jax.metrics import Progress
from launch import _logs

_OUT = flags.DEFINE_string("out", "runs/corpus", "Corpus directory.")
_ROOM = flags.DEFINE_enum(
    "room", "v0", list(livestream.ROOMS), "Bundled live room: Harness v0, or the micro room."
)
_SPLITS = flags.DEFINE_list("splits", ["train"], "Scenario splits to generate (train, dev, test).")
_NUM = flags.DEFINE_integer(
    "num_scenarios", None, "Scenarios per split (seeded sample; all if unset)."
)
_SAMPLE = flags.DEFINE_enum(
    "sample",
    "uniform",
    list(data.CORPUS_SAMPLES),
    "How --num_scenarios are drawn: uniform over the split, or round-robin over families.",
)
_K = flags.DEFINE_integer("states_per_scenario", 4, "Harness states (episodes) per scenario.")
_STATES = flags.DEFINE_enum(
    "states", "original+augmented", list(data.STATE_MODES), "Which Harness states to use."
)
_DIMS = flags.DEFINE_string("hsa_dims", "all", "HSA dimensions: all, or e.g. skill_id,tool_def.")
_STRENGTH = flags.DEFINE_float("hsa_strength", 0.5, "HSA strength in [0, 1].")
_DIMS_PER = flags.DEFINE_integer(
    "dims_per_state", None, "Vary this many of --hsa_dims per augmented state (all if unset)."
)
_FAULTS = flags.DEFINE_float("fault_rate", 0.05, "Probability that a tool call fails.")
_MIN_EFF = flags.DEFINE_float("min_effectiveness", 1.0, "Quality filter: Effectiveness threshold.")
_RETRY = flags.DEFINE_float(
    "retry_fraction", 0.1, "Share of retried trajectories that keep their full retry history."
)
_TEACHER = flags.DEFINE_enum("teacher", "scripted", ["scripted", "openai"], "The teacher.")
_INJECT = flags.DEFINE_float(
    "inject_fraction", 0.15, "Scripted teacher: share of episodes with a Hook-caught mistake."
)
_BASE_URL = flags.DEFINE_string("base_url", "http://localhost:30000/v1", "OpenAI-compatible root.")
_MODEL = flags.DEFINE_string("model", "", "Teacher model name (--teacher openai).")
_KEY_ENV = flags.DEFINE_string("api_key_env", "OPENAI_API_KEY", "Env variable with the API key.")
_EXTENSIONS = flags.DEFINE_bool(
    "server_extensions",
    False,
    "Send SGLang's chat_template_kwargs and separate_reasoning (not for hosted APIs).",
)
_TEMPERATURE = flags.DEFINE_float("temperature", 0.7, "Teacher sampling temperature.")
_SHARDS = flags.DEFINE_integer("num_shards", 4, "ArrayRecord shards per split.")
_WORKERS = flags.DEFINE_integer("workers", 1, "Processes running episodes.")
_SEED = flags.DEFINE_integer("seed", 0, "Every draw derives from this seed.")


def _config(split: str) -> data.CorpusConfig:
    teacher = data.TeacherConfig(
        kind=_TEACHER.value,
        base_url=_BASE_URL.value if _TEACHER.value == "openai" else "",
        model=_MODEL.value,
        api_key=os.environ.get(_KEY_ENV.value),
        server_extensions=_EXTENSIONS.value,
        temperature=_TEMPERATURE.value,
        inject_fraction=_INJECT.value if _TEACHER.value == "scripted" else 0.0,
    )
    return data.CorpusConfig(
        room=_ROOM.value,
        split=split,
        num_scenarios=_NUM.value,
        sample=_SAMPLE.value,
        states_per_scenario=_K.value,
        states=_STATES.value,
        hsa_dims=_DIMS.value,
        hsa_strength=_STRENGTH.value,
        dims_per_state=_DIMS_PER.value,
        fault_rate=_FAULTS.value,
        min_effectiveness=_MIN_EFF.value,
        retry_fraction=_RETRY.value,
        teacher=teacher,
        seed=_SEED.value,
    )


def main(argv):
    del argv
    _logs.quiet()
    for split in _SPLITS.value:
        config = _config(split)
        total = len(data.corpus_scenario_ids(config))
        print(f"{split}: {total} scenarios x {config.states_per_scenario} states ({config.states})")

        bar = Progress(total, desc=f"corpus {split}", unit="scenario")
        try:
            manifest = data.write_corpus(config, _OUT.value, num_shards=_SHARDS.value,
                                         workers=_WORKERS.value, progress=bar.update)  # fmt: skip
        finally:
            bar.close()
        t, calls = manifest["stats"]["total"], manifest["stats"]["teacher_calls"]
        print(
            f"{split}: kept {t.get('kept', 0)} of {t.get('episodes', 0)} episodes "
            f"in {manifest['seconds']} s -> {_OUT.value}/{split}.stats.md"
        )
        if calls:
            print(
                f"{split}: teacher made {calls['calls']} calls, {calls['retries']} retries, "
                f"{calls['failures']} failed for good"
            )


if __name__ == "__main__":
    app.run(main)
