"""Train the guardrails' learned injection detector and write it with its manifest.

  python -m launch.train_detector                       # data/guard/detector_v3.{npz,json}
  python -m launch.train_detector --out /tmp/detector   # elsewhere, e.g. to compare

Positives: `data/guard/attacks.yaml` expanded (en, zh-Hans, zh-Hant, mixed; obfuscated
copies). Negatives: every benign viewer text of the v0 and micro rooms' scenarios, every
string of the bundled world's JSON files, `data/guard/benign.yaml` expanded and the written
comments of `data/guard/benign_comments.yaml`, with obfuscated copies. The threshold is set above every negative (`detector_training.train`).
The manifest records the data's hashes (texts, and the detector's feature texts, which change
when the guardrails' normalisation does), the training figures and the held-out evaluation
(`dt.HELDOUT`, `dt.HELDOUT_BENIGN`; read after the model is fixed, never trained on).
"""

import collections
import json
import pathlib
from importlib import metadata

from absl import app, flags

from hat_jax import files, livestream
from hat_jax.harness import detector_training as dt
from rl import sim

_OUT = flags.DEFINE_string("out", str(dt.data_dir() / "detector_v3"), "Path without suffix.")
_PER_TEMPLATE = flags.DEFINE_integer("per_template", 30, "Fills of each template per language.")
_SHARE = flags.DEFINE_float("obfuscated_share", 0.5, "Texts that get an obfuscated copy.")
_NOTE = flags.DEFINE_string("note", "", "Provenance recorded in the manifest (what changed).")


def training_data(per_template: int, share: float, seed: int):
    """(positives, negatives, benign) as `dt.Example`s, in a fixed order: `benign` is the
    negatives without their obfuscated copies (the texts the threshold is set on)."""
    attacks = dt.expand(dt.data_dir() / "attacks.yaml", per_template=per_template, seed=seed)
    benign = dt.expand(dt.data_dir() / "benign.yaml", per_template=per_template, seed=seed + 1)
    benign += dt.written_benign()
    for room in ("v0", "micro"):
        texts, _ = dt.scenario_texts(sim.default_scenarios(room))
        benign += [dt.Example(t, "scenario", room) for t in texts]
    for path in sorted(livestream.default_world_dir().glob("*.json")):
        strings = dt.json_strings(json.loads(path.read_text(encoding="utf-8")))
        benign += [dt.Example(t, "world", path.stem) for t in dict.fromkeys(strings)]
    positives = dt.with_obfuscations(attacks, share=share, seed=seed + 2)
    negatives = dt.with_obfuscations(benign, share=share, seed=seed + 3)
    return positives, negatives, benign


def evaluate(det: dt.Detector) -> dict:
    """Held-out recall per family and language, and false positives on the held-out benign
    questions and on the v0 scenarios."""
    recall = {}
    for name in dt.HELDOUT:
        hits = collections.defaultdict(lambda: [0, 0])
        for e in dt.heldout_attacks(name):
            for key in (f"{e.family}/{e.lang}", e.family, e.lang, "all"):
                hits[key][0] += det.flagged(e.text)
                hits[key][1] += 1
        recall[name] = {k: f"{h}/{n}" for k, (h, n) in sorted(hits.items())}
    benign_q = [
        e.text for n in dt.HELDOUT_BENIGN for e in dt.heldout_benign(n) if det.flagged(e.text)
    ]
    v0 = sim.default_scenarios("v0")
    v0_benign, v0_attacks = dt.scenario_texts(v0)
    benign_scenarios = [s for s in v0 if not any(i.kind == "injection" for i in s.gold.intents)]
    texts = lambda s: [t for c in s.comments for t in (c.text, c.handle)]
    return {
        "heldout_recall": recall,
        "heldout_benign_flagged": benign_q,
        "v0_benign_texts_flagged": sum(det.flagged(t) for t in v0_benign),
        "v0_benign_texts": len(v0_benign),
        "v0_benign_scenarios_flagged": sum(
            any(map(det.flagged, texts(s))) for s in benign_scenarios
        ),
        "v0_benign_scenarios": f"{len(benign_scenarios)} of {len(v0)}",
        "v0_attack_texts_flagged": f"{sum(det.flagged(t) for t in v0_attacks)}/{len(v0_attacks)}",
    }


def main(argv):
    del argv
    config = dt.TrainConfig()
    positives, negatives, benign = training_data(_PER_TEMPLATE.value, _SHARE.value, config.seed)
    det, figures = dt.train(
        [e.text for e in positives],
        [e.text for e in negatives],
        config,
        benign=[e.text for e in benign],
    )
    out = pathlib.Path(_OUT.value)
    out.parent.mkdir(parents=True, exist_ok=True)
    dt.save(out.with_suffix(".npz"), det)
    count = collections.Counter
    manifest = {
        "format": "hat_jax.detector/1",
        "model": out.with_suffix(".npz").name,
        "note": _NOTE.value,
        "trained_with": {p: metadata.version(p) for p in ("scikit-learn", "opencc", "numpy")},
        "features": {"ngrams": list(dt.NGRAMS), "bits": config.bits, "window": dt.WINDOW},
        "train_config": vars(config)
        | {"per_template": _PER_TEMPLATE.value, "obfuscated_share": _SHARE.value},
        **dt.data_hashes(positives, negatives),
        "model_hash": dt.model_hash(det),
        "threshold": det.threshold,
        "training": figures,
        "positives": dict(count(f"{e.family}/{e.lang}" for e in positives)),
        "negatives": dict(count(f"{e.family}/{e.lang}" for e in negatives)),
        "evaluation": evaluate(det),
    }
    files.write_json(out.with_suffix(".json"), manifest)
    print(
        json.dumps(
            {k: manifest[k] for k in ("threshold", "training", "evaluation")},
            indent=1,
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    app.run(main)
