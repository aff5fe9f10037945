"""`--policy jax` flags for the launch scripts that run policies (`launch.agent`,
`launch.simulate`): `--checkpoint`, `--tokenizer_dir`, `--max_length`, loaded with
`serve.load_jax_policy` (an Orbax checkpoint or an HF directory; see `serve._jax_policy`).
"""

from __future__ import annotations


def define_jax_flags() -> tuple:
    """`--checkpoint`, `--tokenizer_dir` and `--max_length` for a script's `--policy jax`."""
    from absl import flags

    return (
        flags.DEFINE_string(
            "checkpoint", None, "--policy jax: an Orbax checkpoint or HF directory of a policy."
        ),
        flags.DEFINE_string(
            "tokenizer_dir", None, "--policy jax: tokenizer (default: the HF dir's, else demo)."
        ),
        flags.DEFINE_integer(
            "max_length", 8192, "--policy jax: cap on prompt + generated tokens per model call."
        ),
    )


def jax_from_flags(defined: tuple):
    """The `rl.JaxPolicy` of `--policy jax` (absl's UsageError when `--checkpoint` is missing)."""
    checkpoint, tokenizer_dir, max_length = (f.value for f in defined)
    if not checkpoint:
        from absl import app

        raise app.UsageError("--policy jax needs --checkpoint (an Orbax checkpoint or HF dir)")
    from serve import load_jax_policy

    policy, describe = load_jax_policy(
        checkpoint, tokenizer_dir=tokenizer_dir, max_length=max_length
    )
    print(f"policy: {describe}")
    return policy
