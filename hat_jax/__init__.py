"""hat-jax core library: Harness runtime, HSA, chat format, sharding, training, checkpoints,
metrics and evaluation. Subpackages list their own public names."""

__version__ = "0.1.0"
