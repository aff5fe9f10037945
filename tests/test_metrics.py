"""Metrics records, resume rewinding, TensorBoard events and plots."""

import json

import pytest

from hat_jax.metrics import MetricsWriter, plot_metrics, read_metrics


def test_records_rewind_and_plots(tmp_path):
    writer = MetricsWriter(tmp_path)
    for step in range(1, 6):
        writer.write(step, {"loss": 5.0 - step, "grad_norm": 1.0})
    writer.write(4, {"loss": 1.5}, prefix="eval/")
    writer.write(6, {"loss": float("nan")})
    writer.rewind(3)
    writer.write(4, {"loss": 0.5})
    writer.close()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["loss"] == 0.5 and "eval/loss" not in records[-1]
    assert all(isinstance(r["time"], float) for r in records)
    events = list((tmp_path / "tensorboard").iterdir())
    assert events and all(e.stat().st_size > 0 for e in events)

    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write(5, {"loss": float("inf")}, prefix="eval/")
    writer.close()
    assert read_metrics(tmp_path)[-1]["eval/loss"] is None, "non-finite values are JSON null"

    paths = plot_metrics(tmp_path)
    assert {p.name for p in paths} == {"loss.png", "grad_norm.png", "overview.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert plot_metrics(tmp_path / "empty") == []


def test_a_corrupt_record_is_reported_with_its_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON record"):
        read_metrics(tmp_path)
