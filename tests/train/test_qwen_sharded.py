"""The acceptance check on the real model: one SFT step of the tiny Qwen gives the same loss
and gradients on 1 device and on 8 devices laid out 8x1, 2x4 and with experts sharded, with
the block-loop dispatch (see `qwen_mesh_check.py`). The layouts with the production kernels
(shard-local and expert-parallel dispatch, flash attention) are `test_qwen_sharded_kernels.py`:
two modules, so the two halves run side by side."""

import numpy as np
import pytest

from tests._devices import run_on_eight_devices
from tests.train.qwen_mesh_check import LAYOUTS

PLAIN = [n for n in LAYOUTS if n != "reference" and not n.endswith(("_local", "_ep"))]


def run_layouts(tmp_path_factory, names: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """The reference and `names`, one SFT step each, in a subprocess of 8 fake devices."""
    out = tmp_path_factory.mktemp("qwen_mesh")
    run_on_eight_devices("tests.train.qwen_mesh_check", str(out), ",".join(names))
    return {name: dict(np.load(out / f"{name}.npz")) for name in ["reference", *names]}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_layouts(tmp_path_factory, PLAIN)


def check_layout(results, layout):
    ref, got = results["reference"], results[layout]
    assert int(got["sharded"]) > 0, "the layout must actually shard parameters"
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=2e-6)
    np.testing.assert_allclose(got["ce"], ref["ce"], rtol=2e-6)
    assert got["weight"] == ref["weight"]
    scale = np.abs(ref["grad"]).max()
    np.testing.assert_allclose(got["grad"], ref["grad"], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.slow
@pytest.mark.parametrize("layout", PLAIN)
def test_qwen_step_is_layout_invariant(results, layout):
    check_layout(results, layout)
