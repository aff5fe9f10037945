"""The SFT stage's model evaluations as several JAX processes on one machine (a local
coordinator, CPU collectives): `launch.sft` with the demo config's evaluations on (the eval
loss, the teacher-forced tool choice, the copying probe) as 2 processes of one device each
logs the same losses and figures as 1 process over 2 devices. The parameters are sharded over
every process's devices, so each forward pass of an evaluation is one program of the job:
every process runs it on the same rows and reads the whole result
(`hat_jax.eval.model_greedy_fn`, also checked alone on fixed rows, and its refusal of rows
that differ between processes)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hat_jax import livestream
from hat_jax.metrics import read_metrics
from tests._devices import run_job

pytestmark = pytest.mark.slow

DEVICES = 2
STEPS = 2
ROWS = livestream.room("micro").token_budget
EVAL_KEYS = ("eval/loss", "eval/accuracy", "eval/weight", "eval/tool_choice",
             "eval/tool_choice_first_turn", "eval/tool_choice_later_turns", "eval/tool_decision",
             "eval/skill_decision", "eval/copy")  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A micro-room corpus of 4 scenarios x 2 Harness states per split (train and dev): the
    demo's records and evaluations, in rows of the micro room's token budget."""
    out = tmp_path_factory.mktemp("corpus")
    cmd = [sys.executable, "-m", "launch.make_corpus", "--out", str(out), "--num_scenarios", "4",
           "--states_per_scenario", "2", "--splits", "train,dev", "--room", "micro"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return out


def _sft_args(corpus, run_dir):
    """The demo config as shipped (eval split, tool choice and copying on), made small, on the
    micro room's policy and rows."""
    return ["-m", "launch.sft", "--config=configs/sft_demo.py", f"--run_dir={run_dir}",
            f"--config.data.corpus={corpus}", f"--config.trainer.total_steps={STEPS}",
            "--config.model.preset=micro", f"--config.trainer.seq_len={ROWS}",
            "--config.trainer.batch_size=2", "--config.trainer.log_every=1",
            f"--config.trainer.eval_every={STEPS}", f"--config.trainer.checkpoint_every={STEPS}",
            "--config.trainer.eval_batches=1", "--config.data.tool_choice_records=2",
            "--config.data.copy_probe_samples=2", "--config.trainer.progress=False",
            "--config.trainer.plots=False"]  # fmt: skip


def _merged(run_dir):
    """The metrics of each step, the train and evaluation records merged."""
    out: dict[int, dict] = {}
    for record in read_metrics(run_dir):
        out.setdefault(record["step"], {}).update(record)
    return out


def test_sft_with_its_evaluations_as_two_processes_matches_one(corpus, tmp_path):
    seconds = {n: run_job(_sft_args(corpus, tmp_path / f"p{n}"), n, devices=DEVICES,
                          log_dir=tmp_path / f"p{n}") for n in (1, 2)}  # fmt: skip
    print(f"seconds by process count: {seconds}")
    one, two = _merged(tmp_path / "p1"), _merged(tmp_path / "p2")
    assert sorted(one) == sorted(two) and set(range(1, STEPS + 1)) <= set(one)
    losses = np.array([[one[s]["loss"], two[s]["loss"]] for s in range(1, STEPS + 1)])
    print(f"train losses (1 process, 2 processes): {losses.tolist()}")
    np.testing.assert_allclose(losses[:, 1], losses[:, 0], rtol=0, atol=1e-4)
    want, got = ({k: run[STEPS].get(k) for k in EVAL_KEYS} for run in (one, two))
    assert None not in want.values(), want
    print(f"evaluation at step {STEPS}: {want} / {got}")
    np.testing.assert_allclose(got["eval/loss"], want["eval/loss"], rtol=0, atol=1e-4)
    for k in EVAL_KEYS[1:]:  # counts of tokens and calls: equal (NaN equals NaN)
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-9, err_msg=k)


def _printed(log_dir, prefix, process=0):
    lines = (log_dir / f"process_{process}.log").read_text().splitlines()
    return [line[len(prefix) :].strip() for line in lines if line.startswith(prefix)]


def test_greedy_predictions_of_a_model_spread_over_two_processes(tmp_path):
    """Fixed rows through a randomly initialised model: both processes of a 2-process job
    print the argmax of 1 process over the same 2 devices; rows that differ are refused."""
    check = ["-m", "tests.eval.greedy_process_check"]
    for n in (1, 2):
        run_job([*check, "same"], n, devices=DEVICES, log_dir=tmp_path / f"p{n}")
    (want,) = _printed(tmp_path / "p1", "predicted:")
    assert len(set(np.ravel(json.loads(want)))) > 1  # a real argmax, not one constant token
    for i in range(2):
        assert _printed(tmp_path / "p2", "spans processes:", i) == ["True"]
        assert _printed(tmp_path / "p2", "predicted:", i) == [want]
    run_job([*check, "diverge"], 2, devices=DEVICES, log_dir=tmp_path / "diverge")
    for i in range(2):
        (refused,) = _printed(tmp_path / "diverge", "refused:", i)
        assert "greedy_fn rows differ between processes" in refused, refused
        assert "processes [1] hold other values than process 0" in refused
