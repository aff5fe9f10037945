"""`python -m launch.plan`: the memory-plan table for a config, as a user runs it."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _plan(tmp_path, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the script sets its own device count
    out = tmp_path / "plan.md"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.plan", "--config=configs/sft_demo.py",
         "--config.trainer.seq_len=128", f"--out={out}", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return proc, out


@pytest.mark.slow
def test_plan_table_for_the_demo_config(tmp_path):
    proc, out = _plan(
        tmp_path, "--setups=2x1,4x0.001", "--layouts=fsdp_bf16", "--devices_per_host=2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    launch = proc.stdout[proc.stdout.index("launching (one process per host of 2 devices") :]
    assert "4 devices = 2 host(s): 2 data shards, 1 rows each per step" in launch
    assert "srun --nodes=2 --ntasks-per-node=1 python -m launch.sft" in launch
    assert "--config=configs/sft_demo.py" in launch and "JAX_NUM_PROCESSES=2" in launch
    assert "2 devices = 1 host(s): 2 data shards" in launch
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and "GB |" in r]
    assert len(rows) == 2, out.read_text()
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert cells[0][0] == "2 x 1 GB" and cells[0][1] == "fsdp_bf16 (1, 2, 1, 1)"
    assert cells[1][1] == "fsdp_bf16 (1, 4, 1, 1)" and "bfloat16" in cells[0][2]
    assert cells[0][3] == "128" and int(cells[0][4]) >= 1
    # the tiny model fits 1 GB, not 1 MB
    assert [c[10] for c in cells] == ["yes", "no"]


@pytest.mark.slow
def test_plan_rejects_an_unknown_layout(tmp_path):
    proc, _ = _plan(tmp_path, "--setups=2x1", "--layouts=zigzag")
    assert proc.returncode != 0 and "unknown layout 'zigzag'" in proc.stderr


@pytest.mark.slow
def test_plan_of_an_opd_config_adds_the_teacher_and_the_sampling_phase(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = tmp_path / "plan.md"
    proc = subprocess.run(
        [sys.executable, "-m", "launch.plan", "--config=configs/opd_demo.py:random",
         "--setups=2x1", "--layouts=fsdp", f"--out={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = out.read_text()
    assert "sampling peak GiB" in table.splitlines()[0]
    row = next(r for r in table.splitlines() if r.startswith("| 2 x 1 GB"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 16 and cells[10] == "yes"  # the bytes: tests/rl/test_opd_stage.py
    # the sampler's caches per device, and the sampling phase's share of the device left free
    assert "sampling cache GiB" in table.splitlines()[0] and cells[15].endswith("%")
