"""Serving: HF <-> Orbax conversion, a local OpenAI-compatible server over the JAX policy,
the SGLang launch for exports, the deployment replay benchmark and release gates.
Never imported by training code.

Conversion (`serve.convert`): `load_hf`, `save_hf`, `to_hf` (an Orbax checkpoint to an HF
directory), `read_hf_tensors`, `HFCheckpointError`; the MTP draft head: `load_mtp`, `has_mtp`,
`restore_mtp`; CLI `python -m serve.convert from-hf|to-hf`.

A policy of a checkpoint: `load_jax_policy` (an `rl.JaxPolicy` over an Orbax or HF directory,
optionally decoding self-speculatively with its MTP head) and `tokenizer_for`.

The local server (`serve.server`): `python -m serve.server --checkpoint DIR` serves
`/v1/chat/completions` (streaming and not, tool calls, reasoning), `/v1/models`, `/health`
and `/get_server_info`, batching concurrent requests (`serve.server.create_app`,
`load_served_model`).

SGLang (`serve.sglang`): `sglang_command(SGLangConfig(...))`, `SGLangServer` (start, wait for
readiness, `server_info`, stop); CLI `python -m serve.sglang --model_path DIR [--dry_run]`.

The replay (`serve.replay`): `replay(cases, ctx, endpoint=, model=, run_dir=, config=)`,
`ReplayConfig`, `load_cases`; CLI `python -m launch.replay`.

The trajectory viewer and blind pairwise test (`serve.viewer`): `load_viewer`,
`create_viewer_app`, `read_run`, `read_report`, `BlindSession`, `binomial_two_sided`; CLI
`python -m launch.viewer`.

Checkpoint digests (`serve.digest`): `checkpoint_digest`, `verify_digest`, `write_digest`
(the export's `hat_digest.json`), `tokenizer_digest`; what an eval run, the server and a replay
record of the checkpoint they ran.

Release gates (`serve.release`): `release(Candidate(...), registry=, gates=GateConfig())`,
`current_release`; CLI `python -m launch.release`.

Imported lazily, so `python -m serve.convert` does not load the module twice.
"""

_CONVERT = (
    "HFCheckpointError",
    "has_mtp",
    "load_hf",
    "load_mtp",
    "read_hf_tensors",
    "restore_mtp",
    "save_hf",
    "to_hf",
)
_POLICY = ("load_jax_policy", "tokenizer_for")

__all__ = list(_CONVERT + _POLICY)


def __getattr__(name: str):
    if name in _CONVERT:
        from serve import convert

        return getattr(convert, name)
    if name in _POLICY:
        from serve import _jax_policy

        return getattr(_jax_policy, name)
    raise AttributeError(f"module 'serve' has no attribute {name!r}")
