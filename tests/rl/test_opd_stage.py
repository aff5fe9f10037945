"""General OPD: the loss and its gradient against numpy, zero KL and gradient for a student
equal to its teacher, a perturbed student pulled toward the teacher, kill-and-resume
equality (sampling included); the same losses on 1 and 8 devices: `test_opd_stage_mesh.py`."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rl
from hat_jax import sharding, train
from hat_jax.checkpoint import CheckpointManager, restore_params
from tests.rl import opd_check

ROOT = pathlib.Path(__file__).resolve().parents[2]
V = 7


class _Out:
    def __init__(self, logits):
        self.logits, self.hidden, self.aux_loss = logits, None, None


class _Bigram(nnx.Module):
    """logits[t] = table[token t]: a model whose logits are its parameters."""

    def __init__(self, table):
        self.table = nnx.Param(jnp.asarray(table, jnp.float32))

    def __call__(self, ids, **kwargs):
        return _Out(self.table[...][ids])


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _batch():
    ids = np.array([[3, 1, 4, 1, 5, 0], [2, 6, 5, 3, 5, 0]], np.int32)
    mask = np.array([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]], np.int32)  # sampled tokens
    segs = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]], np.int32)
    pos = np.tile(np.arange(6, dtype=np.int32), (2, 1))
    return {"input_ids": ids, "loss_mask": mask, "segment_ids": segs, "positions": pos}


def _grad(student, teacher, batch, estimator):
    def objective(table):
        model = nnx.Module()
        model.policy, model.teacher = _Bigram(table), _Bigram(teacher)
        out = rl.opd_loss(model, {k: jnp.asarray(v) for k, v in batch.items()}, None,
                          estimator=estimator)  # fmt: skip
        return out.total / out.weight, out

    return jax.grad(objective, has_aux=True)(jnp.asarray(student))


def test_reverse_kl_and_its_gradient_equal_a_numpy_computation():
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(V, V)) * 2, rng.normal(size=(V, V)) * 2
    batch = _batch()
    grad, out = _grad(student, teacher, batch, "exact")
    # Position t counts iff token t + 1 was sampled (and is in the same segment).
    ids, mask = batch["input_ids"], batch["loss_mask"]
    weights = mask[:, 1:].astype(np.float64)
    expected_grad = np.zeros((V, V))
    kl_sum = 0.0
    for b in range(2):
        for t in range(5):
            if not weights[b, t]:
                continue
            ls, lt = _log_softmax(student[ids[b, t]]), _log_softmax(teacher[ids[b, t]])
            p = np.exp(ls)
            kl = float(np.sum(p * (ls - lt)))
            kl_sum += kl
            expected_grad[ids[b, t]] += p * (ls - lt - kl)  # d KL(p || q) / d logits
    tokens = weights.sum()
    assert float(out.weight) == tokens == 6
    np.testing.assert_allclose(float(out.total / out.weight), kl_sum / tokens, rtol=1e-5)
    np.testing.assert_allclose(float(out.metrics["kl"]), kl_sum, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), expected_grad / tokens, rtol=1e-4, atol=1e-6)


def test_the_sampled_estimator_is_the_score_function_on_the_sampled_token():
    rng = np.random.default_rng(1)
    student, teacher = rng.normal(size=(V, V)), rng.normal(size=(V, V))
    batch = _batch()
    grad, out = _grad(student, teacher, batch, "sampled")
    ids, mask = batch["input_ids"], batch["loss_mask"]
    expected, k1 = np.zeros((V, V)), 0.0
    for b in range(2):
        for t in range(5):
            if not mask[b, t + 1]:
                continue
            y = ids[b, t + 1]
            ls, lt = _log_softmax(student[ids[b, t]]), _log_softmax(teacher[ids[b, t]])
            advantage = lt[y] - ls[y]
            k1 += ls[y] - lt[y]
            onehot = np.eye(V)[y]
            expected[ids[b, t]] += -advantage * (onehot - np.exp(ls))  # −A ∇ log π_S(y)
    np.testing.assert_allclose(float(out.total / out.weight), k1 / 6, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), expected / 6, rtol=1e-4, atol=1e-6)


def test_a_student_equal_to_its_teacher_has_zero_kl_and_zero_gradient(tmp_path):
    config = opd_check.model_config()
    teacher = opd_check.teacher_params(config)
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])

    def build():
        return models.Qwen(config, rngs=nnx.Rngs(0))

    def driver_for(student):
        return train.StageDriver(
            train.StageConfig(trainer=train.TrainerConfig(total_steps=1, batch_size=2,
                                                          seq_len=24, progress=False)),
            models={"policy": train.ModelSpec(build=build, init=lambda a: student),
                    "teacher": train.ModelSpec(build=build, init=lambda a: teacher,
                                               frozen=True)},
            loss_fn=rl.opd_loss, run_dir=tmp_path / str(id(student)), mesh=mesh,
            checkpoint_root="policy",
        )  # fmt: skip

    batch = _qwen_batch(config.vocab_size)
    figures = {}
    for name, student in (("equal", teacher), ("perturbed", opd_check.perturbed(teacher))):
        driver = driver_for(student)
        _, metrics = driver.step_fn(driver.initial_state(), sharding.global_batch(batch, mesh))
        figures[name] = {k: float(v) for k, v in jax.device_get(metrics).items()}
    equal, moved = figures["equal"], figures["perturbed"]
    print({k: (equal[k], moved[k]) for k in ("kl", "grad_norm")})
    assert abs(equal["kl"]) < 1e-6 and moved["kl"] > 0.05
    assert equal["grad_norm"] < 1e-6 * max(moved["grad_norm"], 1.0) + 1e-6


def _qwen_batch(vocab: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, (2, 24)).astype(np.int32)
    mask = np.zeros((2, 24), np.int32)
    mask[:, 10:20] = 1
    segs = np.ones((2, 24), np.int32)
    segs[:, 20:] = 0
    pos = np.tile(np.arange(24, dtype=np.int32), (2, 1))
    return {"input_ids": ids, "loss_mask": mask, "segment_ids": segs, "positions": pos}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("opd")
    return run_dir, opd_check.run(run_dir)


@pytest.mark.slow
def test_a_perturbed_student_moves_toward_the_teacher(uninterrupted):
    run_dir, result = uninterrupted
    before, after = result.before, result.after
    print(f"held-out KL per token {before['kl']:.4f} -> {after['kl']:.4f}; per response "
          f"{before['kl_per_response']:.3f} -> {after['kl_per_response']:.3f}")  # fmt: skip
    assert after["kl"] < 0.7 * before["kl"], (before, after)
    assert result.step == 12 and result.train["steps"] == 12
    evals = [r for r in _records(run_dir) if "eval/kl" in r]
    assert [r["step"] for r in evals] == [0, 6, 12]
    steps = [r for r in _records(run_dir) if "loss" in r]
    for key in ("kl", "kl_per_response", "response_length", "sampling_seconds",
                "data_seconds", "learn_seconds", "dropped_prompts"):  # fmt: skip
        assert all(key in r for r in steps), key
    # New weights every step, the same compiled sampler: a program per prompt-length bucket
    # (48, 64, 96 here) and sampling strategy (the greedy evaluation), not one per step.
    assert max(r["sampler_programs"] for r in steps) <= 4 < len(steps)
    summary = json.loads(result.summary_path.read_text())
    assert summary["after"]["kl"] == after["kl"]
    table = (run_dir / "opd_summary.md").read_text()
    assert "exact reverse KL to the teacher, per token" in table and "prompt-level loose" in table
    samples = [
        json.loads(x) for x in (run_dir / "samples" / "step_12.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 2 and {"prompt", "response", "strict", "loose"} <= set(samples[0])
    # Checkpoints hold the policy at their root (the teacher is never written): they restore
    # as an SFT checkpoint does.
    params, model_config = restore_params(run_dir / "checkpoints")
    assert "lm_head" in params and "teacher" not in params and "policy" not in params
    assert model_config["vocab_size"] == opd_check.model_config().vocab_size


def _records(run_dir):
    from hat_jax.metrics import read_metrics

    return read_metrics(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [5])
def test_kill_and_resume_gives_the_uninterrupted_losses(uninterrupted, tmp_path, kill_at):
    straight, _ = uninterrupted
    with pytest.raises(KeyboardInterrupt):
        opd_check.run(tmp_path, crash_at=kill_at)
    assert CheckpointManager(tmp_path / "checkpoints").latest_step() == 4
    result = opd_check.run(tmp_path)
    assert result.resumed_from == 4 and result.step == 12
    assert opd_check.step_losses(tmp_path) == opd_check.step_losses(straight)
    assert result.before == json.loads((straight / "opd_summary.json").read_text())["before"]


@pytest.mark.slow
def test_the_memory_plan_holds_the_teacher_and_the_sampling_phase(tmp_path):
    config = opd_check.model_config()
    stage = opd_check.stage_config(steps=2)
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    driver = rl.opd_driver(stage, student_config=config, teacher_config=config,
                           run_dir=tmp_path, mesh=mesh)  # fmt: skip
    sampler = lambda module: models.Sampler(module.policy).lower(  # noqa: E731
        stage.trainer.batch_size, stage.max_prompt_len, stage.max_new_tokens
    )
    plan = train.plan_stage_step(driver, sampler=sampler)
    weights = sum(x.size * 4 for x in jax.tree.leaves(driver.abstract.params))
    # Resident: the student, its two AdamW moments and the frozen teacher (no moments).
    assert 4 * weights <= plan.state_bytes < 4 * weights + 4096
    assert plan.sampling_peak > plan.state_bytes and plan.peak >= plan.sampling_peak
    assert plan.step_peak > plan.state_bytes


@pytest.mark.slow
def test_sampling_in_chunks_gives_the_rows_of_one_call():
    config = opd_check.model_config()
    policy = models.Qwen(config, rngs=nnx.Rngs(0))
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    whole, chunked = (rl.StudentSampler(pad_id=0, stop_tokens=(), chunk=c) for c in (0, 3))
    args = dict(max_new_tokens=6, sampling=models.GREEDY, seed=jax.random.key(0))
    a, b = whole(policy, prompts, **args), chunked(policy, prompts, **args)
    assert len(b.prompts) == 4 and b.tokens.shape == a.tokens.shape
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.policy_logprobs, b.policy_logprobs, rtol=1e-5, atol=1e-6)
