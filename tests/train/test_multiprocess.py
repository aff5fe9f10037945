"""Several JAX processes on one machine, exactly as on a cluster: `python -m launch.sft` run as
1 and 4 processes of one job (a local coordinator, CPU collectives, 4 fake devices in all)
trains on the same global batches to the same losses; the 4-process run's checkpoint resumes
under 2 processes with the same losses again; a killed process stops the others with an error
naming it."""

import json
import os
import shutil
import signal
import time

import numpy as np
import pytest

import data
from hat_jax.metrics import read_metrics
from tests._devices import run_job, start_processes, wait_all

pytestmark = pytest.mark.slow

STEPS = 4
DEVICES = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Short chat records as an SFT corpus (several fit in a 256-token row)."""
    out = tmp_path_factory.mktemp("corpus")
    records = [i.to_record() for i in data.load_instructions() if i.reference is not None]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "train.manifest.json").write_text(json.dumps({"config": {"states": "augmented"}}))
    return out


def _args(corpus, run_dir, steps=STEPS):
    return ["-m", "launch.sft", "--config=configs/sft_demo.py", f"--run_dir={run_dir}",
            f"--config.data.corpus={corpus}", "--config.data.eval_split=",
            "--config.data.online_hsa_probability=0", f"--config.trainer.total_steps={steps}",
            "--config.trainer.batch_size=8", "--config.trainer.seq_len=256",
            "--config.data.data_shards=4",
            "--config.trainer.log_every=1", "--config.trainer.checkpoint_every=2",
            "--config.trainer.keep_checkpoints=3", "--config.trainer.progress=False",
            "--config.trainer.plots=False", "--config.optimizer.warmup_steps=1"]  # fmt: skip


def _train(corpus, run_dir, processes, steps=STEPS):
    return run_job(_args(corpus, run_dir, steps), processes, devices=DEVICES, log_dir=run_dir)


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    seconds = {n: _train(corpus, root / f"p{n}", n) for n in (1, 4)}
    print(f"seconds per run by process count: {seconds}")
    return root


def test_one_and_four_processes_give_the_same_losses(runs):
    one, four = _losses(runs / "p1"), _losses(runs / "p4")
    assert sorted(one) == sorted(four) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([four[s] for s in one], list(one.values()), rtol=2e-5)
    assert one[STEPS] < one[1]


def test_checkpoints_hold_every_process_data_position_once(runs):
    for n in (1, 4):
        checkpoints = runs / f"p{n}" / "checkpoints"
        assert sorted(p.name for p in checkpoints.iterdir()) == ["2", "4"]
        files = sorted(p.name for p in (checkpoints / "4" / "data").glob("process_*"))
        assert files == [f"process_{i}-of-{n}.json" for i in range(n)]
        shards = set()
        for f in files:
            state = json.loads((checkpoints / "4" / "data" / f).read_text())["state"]
            assert not shards & set(state["shards"])
            shards |= set(state["shards"])
        assert shards == {str(s) for s in range(4)}


def test_a_checkpoint_of_four_processes_resumes_under_two(runs, corpus):
    """The 4-process run's step-2 checkpoint, resumed by 2 processes: steps 3 and 4 repeat
    the 1-process run's losses (each process takes its data shards' saved positions)."""
    run_dir = runs / "from4to2"
    shutil.copytree(runs / "p4", run_dir)
    shutil.rmtree(run_dir / "checkpoints" / str(STEPS))
    seconds = _train(corpus, run_dir, 2)
    print(f"2 processes resuming: {seconds:.0f} s")
    assert "resumed from step 2" in (run_dir / "process_0.log").read_text()
    got, want = _losses(run_dir), _losses(runs / "p1")
    np.testing.assert_allclose([got[3], got[4]], [want[3], want[4]], rtol=2e-5)


def test_a_killed_process_stops_the_others_with_an_error_naming_it(corpus, tmp_path):
    """Process 1 is killed once the job runs the stage (its checkpoint directory exists):
    process 0 exits with JAX's error naming task 1 after the heartbeat timeout, not hangs."""
    env = {"HAT_JAX_HEARTBEAT_TIMEOUT_S": "5"}
    procs = start_processes(
        _args(corpus, tmp_path, steps=10_000), 2, devices=DEVICES, env=env, log_dir=tmp_path
    )
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "checkpoints").is_dir() and time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), (tmp_path / "process_0.log").read_text()
            time.sleep(0.5)
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        code = procs[0].wait(timeout=120)
        waited = time.monotonic() - killed
    finally:
        wait_all(procs, timeout=1)
    log = (tmp_path / "process_0.log").read_text()
    assert code != 0
    assert "stopped sending heartbeats" in log and "\n1\n" in log, log[-3000:]
    print(f"the surviving process stopped {waited:.1f} s after the kill")
