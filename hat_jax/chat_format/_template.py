"""The shipped Jinja chat template: the same format as the Python renderer, for other runtimes.

Exported checkpoints and the demo tokenizer carry this template, so `transformers`,
SGLang and vLLM render conversations exactly as `hat_jax.chat_format.render` does.
"""

import pathlib

_PATH = pathlib.Path(__file__).with_name("chat_template.jinja")


def chat_template_path() -> pathlib.Path:
    """The path of `chat_template.jinja` inside the installed package."""
    return _PATH


CHAT_TEMPLATE: str = _PATH.read_text(encoding="utf-8")
