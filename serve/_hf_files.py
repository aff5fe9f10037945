"""The JSON files of an HF export beside the weights: `config.json` and `generation_config.json`.

`config.json` is `QwenConfig.to_hf_dict` (every field SGLang reads, written explicitly: saving
through transformers drops `full_attention_interval` and rewrites rope theta) with the dtype of
the exported tensors. `generation_config.json` carries the model config's special tokens and the
recommended sampling, the defaults of transformers' `generate`; when the export is given a base
checkpoint's directory (its tokenizer source), that checkpoint's own sampling values are kept and
its end tokens added to the config's (an instruct checkpoint also stops on `<|im_end|>`).
Writing them is `serve._save`'s.
"""

from __future__ import annotations

from typing import Any

from models import QwenConfig

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

# REFERENCE.md gives no sampling recommendation for Qwen3.5, so these are the thinking-mode
# values of the Qwen3 model cards (temperature 0.6, top_p 0.95, top_k 20); thinking is the
# chat template's default (REFERENCE.md section 3).
RECOMMENDED_SAMPLING: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
}


def config_json(config: QwenConfig, *, layout: str, dtype: str) -> dict[str, Any]:
    """`config.json` of an export in `layout` ("vl" | "text") with tensors of `dtype`."""
    hf_config = config.to_hf_dict(layout=layout)
    hf_config["dtype"] = dtype
    if layout == "vl":
        hf_config["text_config"]["dtype"] = dtype
    return hf_config


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def generation_config_json(
    config: QwenConfig, base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`generation_config.json`: the special tokens the config sets (eos may be a list) and
    `RECOMMENDED_SAMPLING`; with `base` (a base checkpoint's generation config) its sampling
    values win and its end tokens join the config's."""
    base = base or {}
    eos = list(dict.fromkeys(_ids(config.eos_token_id) + _ids(base.get("eos_token_id"))))
    tokens = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None,
        "pad_token_id": config.pad_token_id,
    }
    sampling = {k: base.get(k, v) for k, v in RECOMMENDED_SAMPLING.items()}
    return {**{k: v for k, v in tokens.items() if v is not None}, **sampling}


def json_files(
    config: QwenConfig, *, layout: str, dtype: str, base_generation: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """File name -> JSON object of every config file of an export."""
    return {
        CONFIG_FILE: config_json(config, layout=layout, dtype=dtype),
        GENERATION_CONFIG_FILE: generation_config_json(config, base_generation),
    }
