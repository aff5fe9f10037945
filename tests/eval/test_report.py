"""The run report: tables from a hand-written run directory, baseline comparisons and plots."""

import json

import numpy as np
import pytest

from hat_jax.eval._items import SetVersionError
from hat_jax.eval._report import write_report
from hat_jax.eval._stats import compare_runs

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(path, sets, *, policy="rule", checkpoint=None, config=False):
    """sets = {name: (version, [(id, family, {metric: score}), ...])}; summary means by hand.

    `config=True` records the sampling inside the run config, as `hat_jax.eval._run` does.
    """
    sampling = {"temperature": 0.0, "max_tokens": 512}
    summary = {
        "run": {
            "policy": {"kind": policy},
            "checkpoint": checkpoint,
            "harness": "v0",
            "created": "2025-01-01T00:00:00+00:00",
            **(
                {"config": {"sampling": sampling, "batch_size": 16}, "limits": {"max_turns": 8}}
                if config
                else {"sampling": sampling}
            ),
        },
        "sets": {},
    }
    for name, (version, items) in sets.items():
        metrics = list(items[0][2])
        mean = lambda rows, m: sum(s[m] for _, _, s in rows) / len(rows)
        families = {}
        for fam in sorted({f for _, f, _ in items}):
            rows = [r for r in items if r[1] == fam]
            families[fam] = {"n": len(rows), **{m: mean(rows, m) for m in metrics}}
        summary["sets"][name] = {
            "version": version,
            "n": len(items),
            "metrics": {m: mean(items, m) for m in metrics},
            "families": families,
            "policy_errors": 2 if config and name == "t1" else 0,
        }
        lines = [
            json.dumps(
                {
                    "id": i,
                    "set": name,
                    "family": f,
                    "scores": s,
                    "output": "ok",
                    "trajectory": None,
                    "seconds": 0.5,
                }
            )  # fmt: skip
            for i, f, s in items
        ]
        (path / "items").mkdir(parents=True, exist_ok=True)
        (path / "items" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def _t1(acc):
    """20 T1 items in two families; accuracy from `acc`, effectiveness fixed, avg their mean."""
    eff = [1.0, 0.5, 0.0, 1.0] * 5
    return [
        (f"t1-{i:02d}", "price" if i < 8 else "stock",
         {"accuracy": float(a), "effectiveness": e, "avg": (a + e) / 2})
        for i, (a, e) in enumerate(zip(acc, eff))
    ]  # fmt: skip


def _t3(tc):
    return [
        (f"t3-{i}", "timeout" if i % 2 else "error",
         {"tc": float(t), "rc": 0.5, "adr": 1.0, "avg": (t + 1.5) / 3})
        for i, t in enumerate(tc)
    ]  # fmt: skip


@pytest.fixture
def runs(tmp_path):
    acc_base = [1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0]  # 7/20
    acc_run = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1]  # 17/20
    base = _write_run(tmp_path / "base", {"t1": ("t1-aaaa", _t1(acc_base)),
                                          "t3_tool": ("t3_tool-bbbb", _t3([1, 0, 1, 0]))})  # fmt: skip
    run = _write_run(
        tmp_path / "run",
        {"t1": ("t1-aaaa", _t1(acc_run)), "t3_tool": ("t3_tool-bbbb", _t3([1, 1, 1, 0]))},
        policy="jax",
        checkpoint="/ckpt/step_100",
        config=True,
    )
    return base, run


def _section(text, name):
    start = text.index(f"\n## {name}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_report_tables_and_plots(runs):
    _, run = runs
    path = write_report(run, resamples=500)
    assert path == run / "report.md"
    text = path.read_text()
    assert '- Policy: `{"kind": "jax"}`' in text and "- Checkpoint: /ckpt/step_100" in text
    assert "- Harness: v0" in text
    assert '- Sampling: `{"max_tokens": 512, "temperature": 0.0}`' in text
    assert '- Run config: `{"batch_size": 16}`' in text and '- limits: `{"max_turns": 8}`' in text
    assert "t1 `t1-aaaa` (n=20)" in text and "t3_tool `t3_tool-bbbb` (n=4)" in text

    t1 = _section(text, "t1")
    # 17/20 = 85.0; effectiveness (1 + .5 + 0 + 1) * 5 / 20 = 62.5; avg the mean of both = 73.75
    assert "| accuracy | 85.0 | " in t1 and "| effectiveness | 62.5 | " in t1
    assert "| avg | 73.8 | " in t1 and "| 20 |" in t1
    # Families: price = items 0-7 (accuracy 7/8), stock = items 8-19 (10/12).
    assert "| price | 8 | 87.5 | 62.5 | 75.0 |" in t1
    assert "| stock | 12 | 83.3 | 62.5 | 72.9 |" in t1
    assert "Policy errors (failed model calls): 2." in t1
    assert "Against the baseline" not in t1
    assert "![t1](plots/t1.png)" in t1

    t3 = _section(text, "t3_tool")
    assert (
        "| tc | 75.0 | " in t3
        and "| rc | 50.0 | " in t3
        and "| adr | 100.0 | 100.0 – 100.0 | 4 |" in t3
    )
    assert "| error | 2 | 100.0 | 50.0 | 100.0 | 83.3 |" in t3
    assert "| timeout | 2 | 50.0 | 50.0 | 100.0 | 66.7 |" in t3

    for name in ("t1", "t3_tool"):
        png = run / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000


def test_report_with_baseline(runs):
    base, run = runs
    text = write_report(run, baseline_dir=base, resamples=2000, seed=1).read_text()
    assert "Baseline:" in text and '- Policy: `{"kind": "rule"}`' in text
    assert text.count('- Sampling: `{"max_tokens": 512, "temperature": 0.0}`') == 2
    want = compare_runs(base, run, resamples=2000, seed=1)
    acc = want["t1"]["accuracy"]
    assert acc.delta == pytest.approx(0.5) and acc.low > 0
    t1 = _section(text, "t1")
    assert "### Against the baseline" in t1
    assert acc.p_le_zero == 0  # a 50-point gain on 20 items: no resample reverses it
    row = (
        f"| accuracy | 35.0 | 85.0 | +50.0 | {100 * acc.low:+.1f} – {100 * acc.high:+.1f} "
        "| < 0.0005 | 20 |"
    )
    assert row in t1
    assert "| effectiveness | 62.5 | 62.5 | +0.0 | +0.0 – +0.0 | 1.000 | 20 |" in t1
    t3 = _section(text, "t3_tool")
    assert "| tc | 50.0 | 75.0 | +25.0 |" in t3
    png = run / "plots" / "t1.png"
    assert png.read_bytes()[:8] == PNG


def test_report_baseline_mismatches(tmp_path, runs):
    base, run = runs
    other = _write_run(tmp_path / "other", {"t1": ("t1-zzzz", _t1([1] * 20))})
    with pytest.raises(SetVersionError, match="t1-zzzz.*t1-aaaa"):
        write_report(run, baseline_dir=other, resamples=100)
    assert not (run / "report.md").exists()

    partial = _write_run(tmp_path / "partial", {"t1": ("t1-aaaa", _t1([1] * 20)[:18]),
                                                "t2": ("t2-cccc", _t1([0] * 20))})  # fmt: skip
    with pytest.raises(ValueError, match=r"2 only in .*run: 't1-18', 't1-19'"):
        write_report(run, baseline_dir=partial, resamples=100)

    # A baseline with only some of the sets: compared where shared, noted elsewhere.
    only_t1 = _write_run(tmp_path / "only_t1", {"t1": ("t1-aaaa", _t1([0] * 20)),
                                                "t2": ("t2-cccc", _t1([0] * 20))})  # fmt: skip
    text = write_report(run, baseline_dir=only_t1, resamples=100).read_text()
    assert "The baseline did not evaluate this set." in _section(text, "t3_tool")
    assert "| accuracy | 0.0 | 85.0 | +85.0 |" in _section(text, "t1")
    assert "Sets only the baseline evaluated: t2." in text
    with pytest.raises(FileNotFoundError, match="summary.json"):
        write_report(tmp_path / "nowhere")


def test_interval_column_matches_the_items(runs):
    _, run = runs
    text = write_report(run, resamples=1000, seed=3).read_text()
    acc = np.array([1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1], float)
    rng = np.random.Generator(np.random.PCG64(3))
    means = [acc[rng.integers(0, 20, size=20)].mean() for _ in range(1000)]
    low, high = np.percentile(means, [2.5, 97.5])
    assert f"| accuracy | 85.0 | {100 * low:.1f} – {100 * high:.1f} | 20 |" in text
