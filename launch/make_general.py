"""Build the base stage's corpus: general verifiable instructions with programmatic answers.

  python -m launch.make_general --out runs/demo/base/corpus --train 4000 --dev 200
  python -m launch.sft --config=configs/base_demo.py     # then train the base on it

Writes `<out>/train.jsonl`, `<out>/dev.jsonl` and their `<split>.manifest.json` (`data._general`:
the topics, the constraint phrasings, the answers checked against every constraint; train and
dev draw from disjoint topics, neither from the evaluation's general set). A split whose
manifest already holds the same config is kept.
"""

import json

from absl import app, flags

import data

_OUT = flags.DEFINE_string("out", "runs/demo/base/corpus", "Corpus directory.")
_TRAIN = flags.DEFINE_integer("train", 4000, "Training records.", lower_bound=1)
_DEV = flags.DEFINE_integer("dev", 200, "Dev records (held-out topics; 0: no dev split).",
                            lower_bound=0)  # fmt: skip
_SEED = flags.DEFINE_integer("seed", 0, "Every draw derives from this seed.")
_LOOKUP = flags.DEFINE_float("lookup_share", 0.0, "Share of in-context lookup items "
                             "(answers copied from the prompt; data._lookup), in [0, 1).")  # fmt: skip


def main(argv):
    del argv
    manifests = data.write_general_corpus(
        _OUT.value,
        train=_TRAIN.value,
        dev=_DEV.value,
        seed=_SEED.value,
        lookup_share=_LOOKUP.value,
    )
    for split, m in manifests.items():
        floor = m["floor"]
        print(f"{split}: {m['records']} records on {m['topics']} topics -> {_OUT.value}/"
              f"{split}.jsonl; constraints {json.dumps(m['constraints'])}; unanswerable "
              f"prompts redrawn: {m['unanswerable_prompts']}; floor (on topic, instructions "
              f"ignored): prompt-strict {floor['prompt_strict']:.3f}, instruction-strict "
              f"{floor['instruction_strict']:.3f}")  # fmt: skip
        if "lookup" in m:
            print(
                f"{split}: lookup items (answers copied from the prompt) {json.dumps(m['lookup'])}"
            )


if __name__ == "__main__":
    app.run(main)
