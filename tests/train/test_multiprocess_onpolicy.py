"""The on-policy stages as several JAX processes on one machine (a local coordinator, CPU
collectives, 4 fake devices in all): General OPD and HSA-RL each as 2 processes of 2 devices
(the shared small setups of `tests.rl.opd_check` and `tests.rl.rl_check`, via
`tests.rl.process_check`), and each run's step-1 checkpoint is resumed by a single process.
The resumed step samples and learns exactly what the several processes did: every process
gathers the step's prompts, samples the global batch with the weights spread over the job,
and trains on its share of it; the sources' positions re-split across process counts."""

import shutil

import numpy as np
import pytest

from hat_jax.metrics import read_metrics
from tests._devices import run_job

pytestmark = pytest.mark.slow

DEVICES = 4


def _figures(run_dir, step, keys):
    out = {}
    for record in read_metrics(run_dir):
        if record["step"] == step:
            out |= {k: record[k] for k in keys if k in record}
    return out


def _resume_under_one_process(run_dir, tmp_path, args_for):
    """`run_dir`'s step-1 checkpoint resumed by one process to step 2, in a copy."""
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    shutil.rmtree(resumed / "checkpoints" / "2")
    seconds = run_job(args_for(resumed), 1, devices=DEVICES, log_dir=resumed)
    return resumed, seconds


def _args(stage):
    return lambda run_dir: ["-m", "tests.rl.process_check", stage, str(run_dir), "2"]


def _data_files(run_dir, step):
    return sorted(p.name for p in (run_dir / "checkpoints" / str(step) / "data").glob("process_*"))


def test_opd_as_two_processes_resumes_under_one_with_the_same_step(tmp_path):
    """Two processes of two devices each: the batch is split over the processes and over each
    one's devices. (Four processes on this suite's two cores compiled every program four times
    at once; the several-process data positions of four processes are `test_multiprocess.py`'s.)"""
    run_dir = tmp_path / "p2"
    two = run_job(_args("opd")(run_dir), 2, devices=DEVICES, log_dir=run_dir)
    resumed, one = _resume_under_one_process(run_dir, tmp_path, _args("opd"))
    print(f"OPD: 2 processes {two:.0f} s; 1 process resuming {one:.0f} s")
    assert _data_files(run_dir, 2) == [f"process_{i}-of-2.json" for i in range(2)]
    assert _data_files(resumed, 2) == ["process_0-of-1.json"]  # step 2 ran as one process
    keys = ("loss", "kl", "grad_norm", "response_length", "eval/kl", "eval/response_length")
    want, got = _figures(run_dir, 2, keys), _figures(resumed, 2, keys)
    assert set(want) == set(got) == set(keys), (want, got)
    assert want["kl"] > 0.1  # the student is far from the teacher: a real comparison
    assert got["response_length"] == want["response_length"], "the same responses sampled"
    np.testing.assert_allclose([got[k] for k in keys], [want[k] for k in keys], rtol=2e-5)


def test_rl_as_two_processes_resumes_under_one_with_the_same_step(tmp_path):
    run_dir = tmp_path / "p2"
    two = run_job(_args("rl")(run_dir), 2, devices=DEVICES, log_dir=run_dir)
    resumed, one = _resume_under_one_process(run_dir, tmp_path, _args("rl"))
    print(f"RL: 2 processes {two:.0f} s; 1 process resuming {one:.0f} s")
    assert _data_files(resumed, 2) == ["process_0-of-1.json"]
    keys = ("grad_norm", "reward/accuracy", "segments/reply", "eval/reward/mean")
    want, got = _figures(run_dir, 2, keys), _figures(resumed, 2, keys)
    assert set(want) == set(got) == set(keys), (want, got)
    assert want["grad_norm"] > 0.1  # rewards differ within groups: a real update
    for k in ("reward/accuracy", "segments/reply", "eval/reward/mean"):
        assert got[k] == want[k], (k, got[k], want[k])  # the same rollouts
    np.testing.assert_allclose(got["grad_norm"], want["grad_norm"], rtol=2e-5)


def test_a_sampler_call_that_differs_between_processes_is_refused_naming_them(tmp_path):
    """Prompts sampled without gathering them first would run one program on mismatched
    inputs (an abort in the collectives, or a hang): the sampler refuses, naming process 1."""
    run_job(["-m", "tests.rl.process_check", "diverge"], 2, devices=DEVICES, log_dir=tmp_path)
    for i in range(2):
        log = (tmp_path / f"process_{i}.log").read_text()
        assert "refused: Sampler: the prompts, settings or seed of this call differ" in log, log
        assert "processes [1] hold other values than process 0" in log
