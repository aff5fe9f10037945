"""`LLMRewriter`: paraphrases and names from any OpenAI-compatible model, cached on disk.

The paper rewrites Skill descriptions "by a strong language model". This rewriter asks any
`/v1/chat/completions` endpoint (SGLang, vLLM, a hosted API) for `variants` paraphrases of each
text and alternative names for each module, and keeps every answer in an on-disk cache keyed by
(model, kind, text, variant, prompt version). An augmentation draw picks the variant with its
own random stream, so a run is deterministic once the cache is warm, and a cache shipped with
a dataset replays offline. An answer that drops a placeholder, changes a format field, is
empty or far too long or short is rejected and the fallback rewriter (default: the bundled
bank) is used instead; rejections are counted in `stats`, as are the requests' retries and the
requests that failed for good (transient failures are retried, see `hat_jax.llm_client`).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
from collections.abc import Sequence
from typing import Any

import httpx

from hat_jax import llm_client
from hat_jax.hsa._bank import SKILL_NAME, TOOL_NAME, markers, normalize
from hat_jax.hsa._rewrite import NAME_KINDS, TEXT_KINDS, BankRewriter, Rewriter

PROMPT_VERSION = 1
_SYSTEM = (
    "You rewrite configuration text of a live-commerce AI host. Keep the meaning exactly: same "
    "facts, same obligations and prohibitions, same tools and Skills. Change wording and sentence "
    "structure. Copy every token in curly braces, such as {tool:get_price_promotion} or {detail}, "
    "unchanged. Answer with the rewritten text only, on one line."
)
_NAMES = (
    "Propose {n} alternative identifiers for the {kind} named {name!r} of a live-commerce AI host, "
    "described as: {description}. Use the style {style}. Answer with a JSON list of strings only."
)
_STYLE = {
    "skill": "lowercase words joined by hyphens (like order-help)",
    "tool": "snake_case or camelCase function names (like get_stock or getStock)",
}


class LLMRewriter:
    """Rewrites through an OpenAI-compatible chat endpoint with an on-disk cache.

    Args:
      base_url: API root, e.g. `http://localhost:30000/v1`.
      model: model name the server expects.
      cache_dir: folder for cached answers (created if missing).
      variants: paraphrases kept per text; a draw picks one.
      api_key: bearer token, if the endpoint needs one.
      fallback: used when the model's answer is rejected (default: `BankRewriter()`).
      descriptions: canonical name -> description, given to the model when naming modules.
      timeout_s: HTTP timeout per attempt.
      retry: how transient failures are retried (default: `llm_client.DEFAULT_RETRY`).
      transport: an `httpx` transport (tests).

    Attributes:
      stats: counts of `requests`, `cache_hits`, `rejected` answers, `retries` and `failures`
        (requests without an answer after their retries).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        cache_dir: str | os.PathLike,
        variants: int = 3,
        api_key: str | None = None,
        fallback: Rewriter | None = None,
        descriptions: dict[str, str] | None = None,
        timeout_s: float = 60.0,
        retry: llm_client.RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        if variants < 1:
            raise ValueError(f"variants must be >= 1, got {variants}")
        self.model, self.variants = model, variants
        self.cache_dir = pathlib.Path(cache_dir)
        self.fallback = fallback or BankRewriter()
        self.bank = getattr(self.fallback, "bank", None)
        self.descriptions = dict(descriptions or {})
        self.stats = {"requests": 0, "cache_hits": 0, "rejected": 0, "retries": 0, "failures": 0}
        self.retry = retry or llm_client.DEFAULT_RETRY
        self._calls = llm_client.CallStats()
        self._cache = llm_client.AnswerCache(cache_dir)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ Rewriter interface
    def rewrite(self, kind: str, text: str, rng: random.Random) -> str:
        if kind not in TEXT_KINDS:
            raise ValueError(f"unknown text kind {kind!r}; expected one of {TEXT_KINDS}")
        variant = rng.randrange(self.variants)
        key = {"kind": kind, "text": normalize(text), "variant": variant}
        answer = self._cached(key, lambda: self._complete(_SYSTEM, normalize(text), variant))
        if isinstance(answer, str) and _acceptable(answer, text):
            return normalize(answer)
        self.stats["rejected"] += 1
        return self.fallback.rewrite(kind, text, rng)

    def names(self, kind: str, canonical: str) -> Sequence[str]:
        if kind not in NAME_KINDS:
            raise ValueError(f"unknown name kind {kind!r}; expected one of {NAME_KINDS}")
        prompt = _NAMES.format(
            n=6,
            kind="Skill" if kind == "skill" else "tool",
            name=canonical,
            description=self.descriptions.get(canonical, "(no description)"),
            style=_STYLE[kind],
        )
        answer = self._cached(
            {"kind": f"names.{kind}", "text": canonical},
            lambda: self._complete("You name software modules.", prompt, 0),
        )
        pattern = SKILL_NAME if kind == "skill" else TOOL_NAME
        try:
            names = json.loads(_strip_fence(answer)) if isinstance(answer, str) else []
        except ValueError:
            names = []
        good = [n for n in names if isinstance(n, str) and pattern.match(n) and n != canonical]
        if not good:
            self.stats["rejected"] += 1
            return self.fallback.names(kind, canonical)
        return tuple(dict.fromkeys(good))

    # ------------------------------------------------------------------ cache and HTTP
    def _cached(self, key: dict[str, Any], compute) -> Any:
        full = {"model": self.model, "prompt_version": PROMPT_VERSION, **key}
        record = self._cache.get(full)
        if record is not None:
            self.stats["cache_hits"] += 1
            return record["answer"]
        answer = compute()
        if answer is not None:  # a failed request is retried next time, not cached
            self._cache.put(full, {"model": self.model, **key, "answer": answer})
        return answer

    def _complete(self, system: str, user: str, variant: int) -> str | None:
        self.stats["requests"] += 1
        payload = {
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": 0.9 if variant else 0.3,
            "seed": variant,
            "max_tokens": 512,
        }
        answer = llm_client.complete(
            self._client, "/chat/completions", payload, retry=self.retry, stats=self._calls
        )
        calls = self._calls.to_dict()
        self.stats.update(retries=calls["retries"], failures=calls["failures"])
        return answer


def _strip_fence(text: str) -> str:
    return re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())


def _acceptable(answer: str, source: str) -> bool:
    """A rewrite keeps the source's placeholders and fields and a sensible length."""
    answer = normalize(answer)
    if not answer or "\n" in answer or markers(answer) != markers(source):
        return False
    ratio = len(answer) / max(1, len(normalize(source)))
    return 0.4 <= ratio <= 2.5 and normalize(answer) != normalize(source)
