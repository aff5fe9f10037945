"""HSA-RL on 8 fake devices (data 2 x FSDP 4, in a subprocess) gives the rollouts and gradient
norms of one device; its own module so that it runs beside the other RL tests."""

import json

import numpy as np
import pytest

from tests._devices import run_on_eight_devices


@pytest.mark.slow
def test_eight_devices_give_the_losses_of_one(tmp_path):
    run_on_eight_devices("tests.rl.rl_check", str(tmp_path))
    figures = json.loads((tmp_path / "losses.json").read_text())
    one, eight = figures["one"], figures["eight"]
    assert sorted(one["loss"]) == sorted(eight["loss"]) and len(one["loss"]) == 3
    assert one["reward/accuracy"] == eight["reward/accuracy"], "the same rollouts"
    steps = sorted(one["loss"])
    for key, tol in (("grad_norm", dict(rtol=2e-5)), ("loss", dict(atol=1e-6))):
        np.testing.assert_allclose([eight[key][k] for k in steps], [one[key][k] for k in steps],
                                   **tol, err_msg=key)  # fmt: skip
    assert min(one["grad_norm"].values()) > 0.1
