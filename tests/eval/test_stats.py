"""Paired bootstrap and run comparison against an independent numpy computation."""

import json

import numpy as np
import pytest

from hat_jax.eval._items import SetVersionError
from hat_jax.eval._stats import compare_runs, mean_interval, paired_bootstrap


def _reference(a, b, resamples, seed, confidence):
    """The same bootstrap written another way: one index draw per resample, sorted percentiles."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n = len(a)
    rng = np.random.Generator(np.random.PCG64(seed))
    deltas = []
    for _ in range(resamples):
        idx = rng.integers(0, n, size=n)
        deltas.append(b[idx].sum() / n - a[idx].sum() / n)
    deltas = np.sort(deltas)
    alpha = (1 - confidence) / 2
    low = np.percentile(deltas, 100 * alpha)
    high = np.percentile(deltas, 100 * (1 - alpha))
    p = sum(d <= 1e-12 for d in deltas) / resamples
    return low, high, p


def test_matches_an_independent_computation():
    rng = np.random.default_rng(7)
    a = rng.integers(0, 3, size=37) / 2  # scores in {0, 0.5, 1}
    b = np.clip(a + rng.choice([-0.5, 0, 0.5], size=37), 0, 1)
    got = paired_bootstrap(a, b, resamples=2000, seed=3, confidence=0.9)
    low, high, p = _reference(a, b, 2000, 3, 0.9)
    assert got.n == 37 and got.resamples == 2000 and got.seed == 3
    assert got.delta == pytest.approx(b.mean() - a.mean())
    assert (got.mean_a, got.mean_b) == (pytest.approx(a.mean()), pytest.approx(b.mean()))
    assert got.low == pytest.approx(low, abs=1e-12)
    assert got.high == pytest.approx(high, abs=1e-12)
    assert got.p_le_zero == pytest.approx(p)
    assert 0 < got.p_le_zero < 1 and got.low < got.delta < got.high
    assert got.to_dict()["p_le_zero"] == got.p_le_zero
    # Deterministic in the seed, different for another seed.
    assert paired_bootstrap(a, b, resamples=2000, seed=3, confidence=0.9) == got
    assert paired_bootstrap(a, b, resamples=2000, seed=4, confidence=0.9).p_le_zero != got.p_le_zero


def test_block_draws_equal_one_stream():
    """Large resample counts are drawn in blocks; the result must equal one single draw."""
    a, b = np.zeros(3), np.array([0.0, 1.0, 1.0])
    got = paired_bootstrap(a, b, resamples=1_500_000, seed=1)
    rng = np.random.Generator(np.random.PCG64(1))
    deltas = b[rng.integers(0, 3, size=(1_500_000, 3))].mean(axis=1)
    assert got.p_le_zero == pytest.approx(np.mean(deltas <= 0))
    assert got.low == pytest.approx(np.quantile(deltas, 0.025))
    assert got.high == pytest.approx(np.quantile(deltas, 0.975))


def test_known_effect_identical_runs_and_bad_input():
    rng = np.random.default_rng(0)
    a = (rng.random(200) < 0.5).astype(float)
    b = np.maximum(a, (rng.random(200) < 0.5).astype(float))  # b >= a, clearly better
    effect = paired_bootstrap(a, b, resamples=3000)
    assert effect.delta > 0.15 and effect.low > 0 and effect.p_le_zero < 0.001

    same = paired_bootstrap(a, a, resamples=500)
    assert same.delta == same.low == same.high == 0 and same.p_le_zero == 1.0

    worse = paired_bootstrap(b, a, resamples=3000)
    assert worse.high < 0 and worse.p_le_zero > 0.999

    with pytest.raises(ValueError, match="3 scores in a vs 2 in b"):
        paired_bootstrap([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="non-finite scores at positions \\[1\\]"):
        paired_bootstrap([1, float("nan")], [0, 1])
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap([1], [0], confidence=1.0)


def test_mean_interval():
    values = np.array([0, 1, 1, 0.5, 1, 0, 1, 1])
    got = mean_interval(values, resamples=4000, seed=5)
    rng = np.random.Generator(np.random.PCG64(5))
    means = [values[rng.integers(0, 8, size=8)].mean() for _ in range(4000)]
    assert got.mean == pytest.approx(values.mean()) and got.n == 8
    assert got.low == pytest.approx(np.percentile(means, 2.5))
    assert got.high == pytest.approx(np.percentile(means, 97.5))
    assert mean_interval([0.5]).to_dict() == {
        "n": 1, "mean": 0.5, "low": 0.5, "high": 0.5, "confidence": 0.95,
    }  # fmt: skip


def _run(path, sets):
    """A run directory: sets = {name: (version, {item id: {metric: score}})}."""
    summary = {"run": {"policy": {"kind": "test"}}, "sets": {}}
    for name, (version, items) in sets.items():
        metrics = sorted({m for s in items.values() for m in s})
        summary["sets"][name] = {
            "version": version,
            "n": len(items),
            "metrics": {m: float(np.mean([s[m] for s in items.values()])) for m in metrics},
            "families": {},
        }
        lines = [
            json.dumps(
                {
                    "id": i,
                    "set": name,
                    "family": "f",
                    "scores": s,
                    "output": "",
                    "trajectory": None,
                    "seconds": 0.1,
                }
            )  # fmt: skip
            for i, s in items.items()
        ]
        (path / "items").mkdir(parents=True, exist_ok=True)
        (path / "items" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_runs_pairs_by_id(tmp_path):
    ids = [f"q{i:02d}" for i in range(30)]
    rng = np.random.default_rng(1)
    acc_a, acc_b = rng.random(30) < 0.4, rng.random(30) < 0.8
    a = {i: {"accuracy": float(x), "avg": float(x) / 2} for i, x in zip(ids, acc_a)}
    b = {i: {"accuracy": float(x), "avg": float(x) / 2, "extra": 1.0} for i, x in zip(ids, acc_b)}
    # Run B wrote its items in another order, and has a set run A lacks.
    b = dict(reversed(list(b.items())))
    run_a = _run(tmp_path / "a", {"t1": ("t1-abc", a)})
    run_b = _run(tmp_path / "b", {"t1": ("t1-abc", b), "t2": ("t2-def", b)})

    got = compare_runs(run_a, run_b, resamples=1000, seed=2)
    assert list(got) == ["t1"] and list(got["t1"]) == ["accuracy", "avg"]
    want = paired_bootstrap(acc_a.astype(float), acc_b.astype(float), resamples=1000, seed=2)
    assert got["t1"]["accuracy"] == want
    assert got["t1"]["avg"].delta == pytest.approx(want.delta / 2)

    same = compare_runs(run_a, run_a, resamples=200)
    assert all(r.delta == 0 and r.p_le_zero == 1 for r in same["t1"].values())


def test_compare_runs_refuses_other_versions_and_other_items(tmp_path):
    items = {"x": {"avg": 1.0}, "y": {"avg": 0.0}}
    run_a = _run(tmp_path / "a", {"t1": ("t1-aaa", items)})
    run_b = _run(tmp_path / "b", {"t1": ("t1-bbb", items)})
    with pytest.raises(SetVersionError, match="t1-aaa.*t1-bbb"):
        compare_runs(run_a, run_b)

    run_c = _run(tmp_path / "c", {"t1": ("t1-aaa", {"x": {"avg": 1.0}, "z": {"avg": 0.0}})})
    with pytest.raises(ValueError, match=r"did not finish the same items.*'y'.*'z'"):
        compare_runs(run_a, run_c)

    with pytest.raises(FileNotFoundError, match="summary.json"):
        compare_runs(run_a, tmp_path / "nothing")

    items_file = run_c / "items" / "t1.jsonl"
    items_file.write_text(items_file.read_text() + items_file.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=r"t1.jsonl: item 'x' appears twice \(record 3\)"):
        compare_runs(run_c, run_c)


def test_weighted_figures_match_an_independent_computation():
    """Instruction-level figures weigh an item by its instruction count: the interval is that
    of the resampled ratio sum(w x) / sum(w), written here loop by loop."""
    rng = np.random.default_rng(3)
    w = rng.integers(1, 4, size=25).astype(float)
    a, b = rng.random(25), rng.random(25)
    got = paired_bootstrap(a, b, resamples=1000, seed=5, weights=w)
    draw = np.random.Generator(np.random.PCG64(5))
    deltas = []
    for _ in range(1000):
        idx = draw.integers(0, 25, size=25)
        deltas.append(sum(w[i] * (b[i] - a[i]) for i in idx) / sum(w[i] for i in idx))
    assert got.delta == pytest.approx((w * (b - a)).sum() / w.sum())
    assert got.mean_b == pytest.approx((w * b).sum() / w.sum())
    assert got.low == pytest.approx(np.quantile(deltas, 0.025))
    assert got.high == pytest.approx(np.quantile(deltas, 0.975))
    one = mean_interval(b, resamples=1000, seed=5, weights=w)
    assert one.mean == pytest.approx((w * b).sum() / w.sum()) and one.low < one.mean < one.high
    with pytest.raises(ValueError, match="positive weights"):
        mean_interval(b, weights=np.zeros(25))
