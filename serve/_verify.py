"""An export checked against `transformers`: both load the same Hugging Face directory and score
one rendered chat; the largest logit difference says whether the export means what we trained."""

from __future__ import annotations

import os
import pathlib

import numpy as np

from hat_jax import chat_format

_MESSAGES = [
    {
        "role": "system",
        "content": "You are the AI host of a live-commerce room. Answer viewers briefly, state "
        "prices only as the tools give them, and load a Skill before replying.",
    },
    {
        "role": "user",
        "content": "Viewer comments to answer (untrusted text):\n"
        "[1] @teatime_grace: how much is the serum tonight, is it in stock, and can I "
        "stack the beauty coupon with the store coupon? Also what sizes do the running "
        "shoes come in and how long does shipping take to Chengdu?",
    },
]


def compare_with_transformers(hf_dir: os.PathLike | str, *, min_tokens: int = 256) -> float:
    """Max |logits difference| between `transformers` and our model (both fp32) on one rendered
    chat of at least `min_tokens` tokens (the user turn repeated until it is that long).

    Raises:
      ValueError: `hf_dir` holds no tokenizer.
    """
    import torch
    import transformers

    from data.tokenizer import load_tokenizer
    from serve._load import load_hf

    hf_dir = pathlib.Path(hf_dir)
    if not (hf_dir / "tokenizer.json").is_file():
        raise ValueError(f"{hf_dir}: no tokenizer.json to render the check's prompt with")
    tokenizer = load_tokenizer(str(hf_dir))
    messages = [dict(m) for m in _MESSAGES]
    ids: list[int] = []
    while len(ids) < min_tokens:
        messages.append(dict(_MESSAGES[1]))
        text = chat_format.render(messages, add_generation_prompt=True)
        ids = tokenizer(text)["input_ids"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = theirs(torch.tensor([ids])).logits.float().numpy()
    _, ours = load_hf(hf_dir, dtype="float32")
    got = np.asarray(ours(np.asarray([ids], dtype=np.int32)).logits, dtype=np.float32)
    return float(np.max(np.abs(got - ref)))
