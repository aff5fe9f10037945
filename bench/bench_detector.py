"""The learned injection detector against the guardrails' lexicons, on the same texts.

Recall on each held-out attack set (`data/guard/heldout_attacks.yaml`, `_b.yaml`, `_c.yaml`, never
trained on; see attacks.yaml for which one measures which version cleanly) per family and
language, for the Harness v0 lexicons (`normalize_input.control_syntax` and
`detect_injection.patterns`, matched per field as the hooks do), the shipped detector, and
either of them (what the guardrails do together); false positives on every benign viewer text
of the v0 scenarios (counted per text and per scenario), of the micro room's scenarios, on
every string of the bundled world and on the held-out benign questions; per-field latency
(p50/p99 over every text above, the fold cache cleared before each pass so each call folds;
every call, and each field's fastest of three passes, which removes scheduling noise).

  python -m bench.bench_detector
"""

import collections
import json
import time

import numpy as np

from hat_jax import harness as hx
from hat_jax import livestream
from hat_jax.harness import detector_training as dt
from rl import sim


def _lexicon():
    hooks = hx.load(livestream.default_world_dir()).hooks
    control = hooks.rule("normalize_input").params["control_syntax"]
    patterns = hooks.rule("detect_injection").params["patterns"]
    return lambda text: bool(hx.find_all(control, text) or hx.find_all(patterns, text))


def _recall(attacks, methods) -> None:
    keys = sorted({(e.family, e.lang) for e in attacks})
    hits = collections.defaultdict(collections.Counter)
    for e in attacks:
        for name, fn in methods.items():
            flagged = fn(e.text)
            for key in ((e.family, e.lang), (e.family, "all"), ("all", e.lang), ("all", "all")):
                hits[key][name] += flagged
    totals = collections.Counter()
    for e in attacks:
        for key in ((e.family, e.lang), (e.family, "all"), ("all", e.lang), ("all", "all")):
            totals[key] += 1
    order = keys + sorted({(f, "all") for f, _ in keys}) + sorted({("all", lg) for _, lg in keys})
    print(f"{'held-out recall':28s}" + "".join(f"{n:>12s}" for n in methods))
    for key in [*order, ("all", "all")]:
        n = totals[key]
        cells = "".join(f"{f'{hits[key][m]}/{n}':>12s}" for m in methods)
        print(f"{key[0] + '/' + key[1]:28s}{cells}")


def _latency(fn, texts, passes: int = 3) -> np.ndarray:
    """Microseconds of each call: [passes, len(texts)], the fold cache cleared before each
    pass so every call folds its text."""
    times = np.zeros((passes, len(texts)))
    for p in range(passes):
        hx.fold.cache_clear()
        for i, t in enumerate(texts):
            start = time.perf_counter()
            fn(t)
            times[p, i] = time.perf_counter() - start
    return times * 1e6


def main() -> None:
    lexicon, detector = _lexicon(), hx.injection_flagged
    methods = {
        "lexicons": lexicon,
        "detector": detector,
        "either": lambda t: lexicon(t) or detector(t),
    }
    attacks = []
    for name in dt.HELDOUT:
        print(f"--- {name}")
        attacks += dt.heldout_attacks(name)
        _recall(dt.heldout_attacks(name), methods)

    v0 = sim.default_scenarios("v0")
    v0_benign, v0_attacks = dt.scenario_texts(v0)
    micro_benign, _ = dt.scenario_texts(sim.default_scenarios("micro"))
    world = sorted(
        {
            t
            for path in livestream.default_world_dir().glob("*.json")
            for t in dt.json_strings(json.loads(path.read_text(encoding="utf-8")))
        }
    )
    questions = [e.text for n in dt.HELDOUT_BENIGN for e in dt.heldout_benign(n)]
    benign_scenarios = [s for s in v0 if not any(i.kind == "injection" for i in s.gold.intents)]
    print(f"\n{'false positives':40s}" + "".join(f"{n:>12s}" for n in methods))
    sets = {
        "v0 benign texts": v0_benign,
        "micro benign texts": micro_benign,
        "world strings": world,
        "held-out benign questions": questions,
    }
    for name, texts in sets.items():
        cells = "".join(f"{f'{sum(map(fn, texts))}/{len(texts)}':>12s}" for fn in methods.values())
        print(f"{name:40s}{cells}")
    cells = ""
    for fn in methods.values():
        bad = sum(
            any(fn(t) for c in s.comments for t in (c.text, c.handle)) for s in benign_scenarios
        )
        cells += f"{f'{bad}/{len(benign_scenarios)}':>12s}"
    print(f"{'v0 benign scenarios (of ' + str(len(v0)) + ')':40s}{cells}")
    cells = "".join(
        f"{f'{sum(map(fn, v0_attacks))}/{len(v0_attacks)}':>12s}" for fn in methods.values()
    )
    print(f"{'v0 attack texts flagged (recall)':40s}{cells}")
    for e in (e for n in dt.HELDOUT_BENIGN for e in dt.heldout_benign(n)):
        if detector(e.text):
            print(f"  detector flags held-out benign ({e.lang}): {e.text}")

    fields = [*v0_benign, *micro_benign[:2000], *questions, *(e.text for e in attacks)]
    hx.injection_score("warm up")
    lexicon("warm up")
    print(f"\n{'per-field latency, us':36s}{'p50':>9s}{'p99':>9s}{'max':>9s}")
    for name, fn in (("lexicons", lexicon), ("detector", hx.injection_score)):
        t = _latency(fn, fields)
        # Every call, and each field's fastest of the passes (scheduling noise removed).
        for label, values in (("every call", t.ravel()), ("best of 3 per field", t.min(0))):
            row = "".join(f"{v:9.1f}" for v in np.percentile(values, [50, 99, 100]))
            print(f"{name + ', ' + label:36s}{row}")
    lengths = np.array([len(t) for t in fields])
    print(
        f"{'fields':28s}{len(fields):10d}  (chars p50 {np.median(lengths):.0f}, max {lengths.max()})"
    )


if __name__ == "__main__":
    main()
