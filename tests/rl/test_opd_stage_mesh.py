"""General OPD on 8 fake devices (data 2 x FSDP 4, in a subprocess) gives the losses of one device;
its own module so that it runs beside the other OPD tests."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_eight_devices_give_the_losses_of_one(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_cpu_use_thunk_runtime=false"
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.rl.opd_check", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = json.loads((tmp_path / "losses.json").read_text())
    one, eight = losses["one"], losses["eight"]
    assert sorted(one) == sorted(eight) == ["1", "2", "3", "4"]
    np.testing.assert_allclose([eight[k] for k in sorted(eight)], [one[k] for k in sorted(one)],
                               rtol=2e-5)  # fmt: skip
