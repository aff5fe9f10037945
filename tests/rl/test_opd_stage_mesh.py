"""General OPD on 8 fake devices (data 2 x FSDP 4, in a subprocess) gives the losses of one device;
its own module so that it runs beside the other OPD tests."""

import json

import numpy as np
import pytest

from tests._devices import run_on_eight_devices


@pytest.mark.slow
def test_eight_devices_give_the_losses_of_one(tmp_path):
    run_on_eight_devices("tests.rl.opd_check", str(tmp_path))
    losses = json.loads((tmp_path / "losses.json").read_text())
    one, eight = losses["one"], losses["eight"]
    assert sorted(one) == sorted(eight) == ["1", "2", "3", "4"]
    np.testing.assert_allclose([eight[k] for k in sorted(eight)], [one[k] for k in sorted(one)],
                               rtol=2e-5)  # fmt: skip
