"""Serving: HF <-> Orbax conversion (planned: the SGLang launch, a local OpenAI-compatible
server and the deployment replay benchmark). Never imported by training code.

Conversion (`serve.convert`): `load_hf`, `save_hf`, `to_hf` (an Orbax checkpoint to an HF
directory), `read_hf_tensors`, `HFCheckpointError`; the MTP draft head: `load_mtp`, `has_mtp`,
`restore_mtp`;
CLI `python -m serve.convert from-hf|to-hf`. Imported lazily, so `python -m serve.convert`
does not load the module twice.
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

__all__ = list(_CONVERT)


def __getattr__(name: str):
    if name in _CONVERT:
        from serve import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'serve' has no attribute {name!r}")
