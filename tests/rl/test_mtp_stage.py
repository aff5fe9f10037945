"""MTP draft-head adaptation: the stage loss against `rl.mtp` computed by hand, gradients
reach only the head, the rollout pool resumes exactly, and a grafted head adapted on rollouts
of a frozen policy drafts measurably better (simulated acceptance length before/after)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models
import rl
from hat_jax import sharding, train
from hat_jax.checkpoint import restore_params
from serve import restore_mtp

VOCAB = 256


def _config() -> models.QwenConfig:
    """A one-layer (full-attention) Qwen3.5-MoE: the draft head's layer kind, compiled fast."""
    return models.QwenConfig.preset("tiny").replace(
        vocab_size=VOCAB, num_layers=1, layer_types=("full_attention",)
    )


def _peaked_policy(config, scale: float = 40.0) -> models.Qwen:
    """A fixed random policy with a sharpened LM head: low-entropy, context-dependent rollouts
    (a near-uniform random policy would leave nothing for a draft head to learn)."""
    policy = models.Qwen(config, rngs=nnx.Rngs(0))
    policy.lm_head.set_value(policy.lm_head.get_value() * scale)
    return policy


def _rows(seed: int, batch: int = 2, length: int = 24) -> dict[str, np.ndarray]:
    """Two packed documents per row; the second half of each is 'sampled'."""
    rng = np.random.default_rng(seed)
    half = length // 2
    ids = rng.integers(0, VOCAB, (batch, length)).astype(np.int32)
    segs = np.repeat([[1] * half + [2] * half], batch, 0).astype(np.int32)
    pos = np.tile(np.concatenate([np.arange(half), np.arange(half)]), (batch, 1)).astype(np.int32)
    mask = np.tile(np.tile(np.r_[np.zeros(half // 2), np.ones(half - half // 2)], 2), (batch, 1))
    return {"input_ids": ids, "loss_mask": mask.astype(np.int32), "segment_ids": segs,
            "positions": pos}  # fmt: skip


def _by_hand(drafter, batch):
    """The head at t sees h_t and token t+1 and is scored on token t+2, via `rl.mtp`."""
    ids, pos, segs = batch["input_ids"], batch["positions"], batch["segment_ids"]
    policy = drafter.policy(ids, positions=pos, segment_ids=segs)
    next_ids = jnp.concatenate([ids[:, 1:], jnp.zeros_like(ids[:, :1])], axis=1)
    draft = drafter.head(policy.hidden, next_ids, drafter.policy, positions=pos,
                         segment_ids=segs).logits  # fmt: skip
    targets, mask = rl.mtp_targets(ids, batch["loss_mask"], segment_ids=segs)
    loss, _ = rl.mtp_loss(draft, targets, mask)
    alpha = rl.acceptance_probability(draft[:, :-1], policy.logits[:, 1:], temperature=0.7)
    alpha = jnp.pad(alpha, ((0, 0), (0, 1)))
    length = rl.acceptance_length(alpha, mask, num_draft_tokens=2)
    return loss, mask, jnp.sum(alpha * mask), length * jnp.sum(mask)


@pytest.mark.slow  # one compile of policy + head forward and the head's gradient (~20 s)
def test_stage_loss_is_the_masked_mtp_cross_entropy_and_trains_only_the_head():
    config = _config()
    drafter = rl.Drafter(_peaked_policy(config), models.MTPHead(config, rngs=nnx.Rngs(1)))
    graphdef, head_params, rest = nnx.split(drafter, nnx.All(nnx.Param, nnx.PathContains("head")),
                                            ...)  # fmt: skip
    assert set(head_params.keys()) == {"head"}
    batch = {k: jnp.asarray(v) for k, v in _rows(0).items()}

    @jax.jit
    def check(params, rest, batch):
        model = nnx.merge(graphdef, params, rest)
        out = rl.mtp_stage_loss(model, batch, None, temperature=0.7, num_draft_tokens=2)

        def objective(p):
            o = rl.mtp_stage_loss(nnx.merge(graphdef, p, rest), batch, None)
            return o.total / o.weight

        return out, _by_hand(model, batch), jax.grad(objective)(params)

    out, (loss, mask, acceptance, length), grads = check(head_params, rest, batch)
    assert float(out.weight) == float(mask.sum()) > 0
    np.testing.assert_allclose(float(out.total / out.weight), float(loss), rtol=1e-6)
    # Nothing crosses a document: the last two positions of each document are never counted.
    assert not np.asarray(mask)[:, 10:12].any() and not np.asarray(mask)[:, 22:].any()
    np.testing.assert_allclose(float(out.metrics["acceptance"]), float(acceptance), rtol=1e-5)
    np.testing.assert_allclose(float(out.metrics["acceptance_length"]), float(length), rtol=1e-5)
    # Gradients reach the head's parameters (the policy is not among the differentiated ones).
    norms = {"/".join(map(str, p)): float(jnp.linalg.norm(v.get_value()))
             for p, v in nnx.to_flat_state(grads)}  # fmt: skip
    assert norms["head/fc"] > 0 and norms["head/layer/mixer/q_proj"] > 0


def test_rollout_pool_cycles_epochs_and_resumes_exactly():
    keys = ("input_ids", "loss_mask", "segment_ids", "positions")
    rows = {k: np.arange(10 * 4).reshape(10, 4) for k in keys}
    pool = rl.RolloutPool(rows, batch_size=4, seed=3)
    seen = np.concatenate([next(pool)["input_ids"][:, 0] for _ in range(5)])  # 2 epochs
    assert sorted(seen[:10].tolist()) == list(range(0, 40, 4))  # each row once per epoch
    assert sorted(seen[10:20].tolist()) == list(range(0, 40, 4))
    state = pool.get_state()
    upcoming = [next(pool)["input_ids"] for _ in range(3)]
    again = rl.RolloutPool(rows, batch_size=4, seed=3)
    again.set_state(json.loads(json.dumps(state)))
    for want in upcoming:
        np.testing.assert_array_equal(next(again)["input_ids"], want)
    with pytest.raises(ValueError, match="seed 3"):
        rl.RolloutPool(rows, batch_size=4, seed=4).set_state(state)
    assert [len(b["input_ids"]) for b in pool.batches()] == [4, 4]  # whole batches, in order


def _prompts(seed: int):
    rng = np.random.default_rng(seed)
    while True:
        yield {"prompt_ids": rng.integers(0, VOCAB, (8, 8)).astype(np.int32),
               "prompt_lengths": np.full(8, 8, np.int32)}  # fmt: skip


@pytest.mark.slow
def test_adapted_head_drafts_better_on_held_out_rollouts(tmp_path):
    config = _config()
    mesh = sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1])
    stage = rl.MTPConfig(
        trainer=train.TrainerConfig(
            total_steps=24,
            batch_size=8,
            seq_len=40,
            log_every=8,
            eval_every=0,
            checkpoint_every=12,
            progress=False,
            plots=False,
        ),  # fmt: skip
        optimizer=train.OptimizerConfig(
            learning_rate=1e-2, warmup_steps=2, decay_steps=24, weight_decay=0.0
        ),  # fmt: skip
        rollout=rl.RolloutConfig(batches=3, eval_batches=1, max_new_tokens=32),
        num_draft_tokens=3,
    )
    # The stage owns (donates) the arrays init_policy returns: a fresh copy per run.
    fresh = lambda _: nnx.state(_peaked_policy(config), nnx.Param)  # noqa: E731
    run = dict(model_config=config, run_dir=tmp_path, init_policy=fresh,
               init_head=rl.MTP_RANDOM, mesh=mesh)  # fmt: skip
    result = rl.run_mtp(stage, prompts=_prompts(1), eval_prompts=_prompts(2), **run)
    before, after = result.before, result.after
    print(f"simulated acceptance length {before['acceptance_length']:.3f} -> "
          f"{after['acceptance_length']:.3f}; acceptance {before['acceptance']:.3f} -> "
          f"{after['acceptance']:.3f}")  # fmt: skip
    assert after["loss"] < before["loss"] - 1.0
    assert after["acceptance"] > before["acceptance"] + 0.15
    assert after["acceptance_length"] > before["acceptance_length"] + 0.3
    assert after["greedy_acceptance_length"] > before["greedy_acceptance_length"] + 0.3
    assert result.rollouts["rollouts"] == 24 and result.step == 24
    summary = json.loads(result.summary_path.read_text())
    assert summary["after"]["acceptance_length"] == after["acceptance_length"]
    assert "simulated acceptance length" in (tmp_path / "mtp_summary.md").read_text()
    # The adapted head is a head checkpoint serve.convert exports; stage checkpoints hold
    # the head alone (the frozen policy is never written).
    head = restore_mtp(result.head_dir, config)
    assert head.fc.get_value().shape == (2 * config.hidden_size, config.hidden_size)
    params, _ = restore_params(tmp_path / "checkpoints" / "24")
    assert set(params) == {"head"}
    # Resuming the finished run restores the head (no policy in the checkpoint) and reports
    # the same figures.
    again = rl.run_mtp(stage, prompts=iter(()), eval_prompts=iter(()), **run)
    assert again.resumed_from == 24 and again.before == before
    np.testing.assert_allclose(again.after["loss"], after["loss"], rtol=1e-6)


def test_agent_prompts_are_cut_from_training_rows():
    # Row 0: document 1 = prompt [5, 6, 7] then trained tokens; document 2 follows.
    # Row 1: its first document trains nothing (skipped). Row 2: padding only (skipped).
    # Row 3: a 4-token prompt.
    ids = np.array([[5, 6, 7, 8, 9, 3, 4, 0], [1, 2, 3, 4, 0, 0, 0, 0], [0] * 8,
                    [9, 9, 8, 8, 7, 7, 0, 0]])  # fmt: skip
    mask = np.array([[0, 0, 0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0], [0] * 8,
                     [0, 0, 0, 0, 1, 1, 0, 0]])  # fmt: skip
    segs = np.array([[1, 1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0, 0, 0], [0] * 8,
                     [1, 1, 1, 1, 1, 1, 0, 0]])  # fmt: skip
    rows = iter([{"input_ids": ids, "loss_mask": mask, "segment_ids": segs}])
    batches = list(rl.prompts_from_rows(rows, batch_size=2, max_prompt_len=5, pad_id=-1))
    assert len(batches) == 1
    np.testing.assert_array_equal(batches[0]["prompt_lengths"], [3, 4])
    np.testing.assert_array_equal(batches[0]["prompt_ids"], [[5, 6, 7, -1, -1], [9, 9, 8, 8, -1]])
    too_long = iter([{"input_ids": ids, "loss_mask": mask, "segment_ids": segs}])
    assert not list(rl.prompts_from_rows(too_long, batch_size=1, max_prompt_len=2, pad_id=0))
