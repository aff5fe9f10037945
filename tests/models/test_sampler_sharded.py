"""Sharded sampling: `models.Sampler` on weights sharded over 8 devices (data 2 x fsdp 4)
gives the rows one device gives, and keeps its caches split by rows.

For both families (Qwen3.5: DeltaNet + attention; Qwen3-MoE: attention only), prompts of
mixed lengths: greedy rows, and sampled rows (same seed; top-k and top-p) after a shared
prefix, give identical tokens and lengths; log-probs agree to 1e-6 (the per-device programs
reduce in another order: measured differences up to 9.5e-7). The compiled program returns every cache (keys
and values, DeltaNet conv and recurrent states) split over (`data`, `fsdp`) on its batch
axis, and no buffer of the per-device program has a cache's global shape: the batch is never
gathered. Runs in a subprocess (`sampler_mesh_check.py`) with XLA's classic CPU runtime.
"""

import json

import numpy as np
import pytest

from tests._devices import run_on_eight_devices
from tests.models.sampler_mesh_check import CASES, FAMILIES

LOGPROB_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampler_mesh")
    run_on_eight_devices("tests.models.sampler_mesh_check", str(out))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES)
def test_sharded_sampling_equals_one_device(results, family, case):
    one = np.load(results / f"{family}_{case}_one.npz")
    mesh = np.load(results / f"{family}_{case}_mesh.npz")
    np.testing.assert_array_equal(mesh["tokens"], one["tokens"])
    np.testing.assert_array_equal(mesh["lengths"], one["lengths"])
    for key in ("logprobs", "policy_logprobs"):
        np.testing.assert_allclose(
            mesh[key], one[key], rtol=LOGPROB_TOLERANCE, atol=LOGPROB_TOLERANCE
        )


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_caches_are_split_by_rows(results, family):
    layout = json.loads((results / f"{family}_layout.json").read_text())
    rows = ["data", "fsdp"]
    assert layout["rows"] == 8  # 5 prompts, rounded up to the 8-way split
    assert layout["caches"], "the program returns its caches"
    for name, spec in layout["caches"].items():
        assert spec[1] == rows, f"cache {name}: batch axis {spec[1]}, not split by rows"
    assert layout["end"] == [rows] and layout["tokens"] == [rows]
    assert layout["gathered"] == [], f"caches gathered whole on a device: {layout['gathered']}"
    assert len(layout["split"]) == layout["cache_leaves"], layout
