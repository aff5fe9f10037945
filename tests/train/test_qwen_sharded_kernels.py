"""The layout check of `test_qwen_sharded.py` with the production kernels: the shard-local
MoE dispatch (each device sorts its own tokens) and the expert-parallel dispatch, with flash
attention, on 8 fake devices, against the same one-device reference."""

import pytest

from tests.train.qwen_mesh_check import LAYOUTS
from tests.train.test_qwen_sharded import check_layout, run_layouts

KERNELS = [n for n in LAYOUTS if n.endswith(("_local", "_ep"))]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_layouts(tmp_path_factory, KERNELS)


@pytest.mark.slow
@pytest.mark.parametrize("layout", KERNELS)
def test_qwen_step_with_production_kernels_is_layout_invariant(results, layout):
    check_layout(results, layout)
