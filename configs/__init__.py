"""ml_collections configs. Each module exposes `get_config(arg=None)`; no logic beyond
building configs. The blocks every stage config shares (`trainer`, `optimizer`, `mesh`)
are built here, with the fields a user sweeps spelled out."""

import ml_collections


def trainer(*, total_steps: int, batch_size: int, seq_len: int, **fields):
    """A `trainer` block (`hat_jax.train.TrainerConfig`'s fields)."""
    block = dict(
        total_steps=total_steps,
        batch_size=batch_size,
        seq_len=seq_len,
        micro_batches=1,
        seed=0,
        log_every=10,
        eval_every=0,
        eval_batches=2,
        checkpoint_every=100,
        keep_checkpoints=3,
        async_checkpoints=True,
        max_nonfinite_steps=10,
        progress=True,
        plots=True,
    )
    return ml_collections.ConfigDict(block | fields)


def optimizer(*, learning_rate: float, warmup_steps: int, decay_steps: int, **fields):
    """An `optimizer` block (`hat_jax.train.OptimizerConfig`'s fields: AdamW, warmup +
    cosine decay)."""
    block = dict(
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=decay_steps,
        min_learning_rate_ratio=0.1,
        b1=0.9,
        b2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        decay_embeddings=False,
    )
    return ml_collections.ConfigDict(block | fields)


def mesh(**fields):
    """A `mesh` block (`hat_jax.sharding.MeshConfig`): FSDP over every device by default."""
    return ml_collections.ConfigDict(dict(data=1, fsdp=-1, expert=1, tensor=1) | fields)
