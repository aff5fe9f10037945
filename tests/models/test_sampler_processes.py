"""`models.Sampler` in a job of 2 JAX processes gives every process the same rows as 1 process
over the same 4 devices (a local coordinator, CPU collectives; `sampler_process_check`): the
weights span both processes, the rows are split over all 4 devices, and greedy tokens and
seeded sampled tokens after a shared prefix are equal, log-probs to 1e-6."""

import json

import numpy as np
import pytest

from tests._devices import run_job

pytestmark = pytest.mark.slow

DEVICES = 4


def test_two_processes_sample_the_rows_of_one(tmp_path):
    check = ["-m", "tests.models.sampler_process_check"]
    for n in (1, 2):
        out = tmp_path / f"p{n}"
        out.mkdir()
        run_job([*check, str(out)], n, devices=DEVICES, log_dir=out / "logs")
    want = np.load(tmp_path / "p1" / "rows_0.npz")
    for i in range(2):
        facts = json.loads((tmp_path / "p2" / f"facts_{i}.json").read_text())
        assert facts == {"processes": 2, "devices": 4, "params_span_processes": True,
                         "rows_split": 4}  # fmt: skip
        got = np.load(tmp_path / "p2" / f"rows_{i}.npz")
        assert sorted(got.files) == sorted(want.files)
        for key in want.files:
            if key.endswith(("tokens", "lengths")):
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"process {i} {key}")
            else:
                np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-6,
                                           err_msg=f"process {i} {key}")  # fmt: skip
    assert len(set(want["greedy_tokens"].ravel())) > 10  # real completions, not one token
