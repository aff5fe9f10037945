"""`launch.accelerator_check --dry_run`: the prepared GPU run parses and prints its plan here."""

import subprocess
import sys


def test_dry_run_prints_every_step_within_ten_minutes():
    out = subprocess.run(
        [sys.executable, "-m", "launch.accelerator_check", "--dry_run", "--export=runs/x/hf"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(600 s of limits in all)" in out.stdout
    for step in ("logits", "train_step", "decode", "sglang", "sglang_mtp"):
        assert f"- {step} (limit" in out.stdout
    assert "--model_path=runs/x/hf" in out.stdout and "--speculative=on" in out.stdout
    assert "launch.replay --endpoint=http://127.0.0.1:30000/v1" in out.stdout
