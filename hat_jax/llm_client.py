"""Best-effort calls to an OpenAI-compatible chat endpoint, with an on-disk answer cache.

Offline helpers that ask a language model for text (the HSA rewriter, the reward judge panel)
share one pattern: post a `/chat/completions` request, take the first choice's content, treat
any transport or format failure as "no answer" (the caller falls back or abstains), and keep
every answer in a JSON file keyed by a hash of everything that determines it, so that a run is
reproducible once the cache is warm and a cache shipped with a data set replays offline.

The policy client (`hat_jax.harness.OpenAICompatPolicy`) is different on purpose: a failed
policy turn is an error the agent loop must see, so it does not use `complete`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import httpx

from hat_jax import files

__all__ = ["AnswerCache", "complete"]


def complete(
    client: httpx.Client,
    url: str,
    payload: Mapping[str, Any],
    *,
    api_key: str | None = None,
) -> str | None:
    """Posts one chat-completions request; the first choice's content, or None on failure.

    Args:
      client: the HTTP client (its base URL, if any, is joined with `url`).
      url: `/chat/completions` under the client's base URL, or a full URL.
      payload: the request body (`model`, `messages`, sampling fields).
      api_key: sent as a bearer token when given.

    Returns:
      The content string, or None when the request failed, the server answered with an
      error status, or the body is not a chat completion with string content.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = client.post(url, json=dict(payload), headers=headers)
        response.raise_for_status()
        content = response.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None


class AnswerCache:
    """JSON answers on disk, one file per key, under `directory/<2 hex>/<sha256>.json`.

    A key is any JSON-serialisable value (it is serialised with sorted keys, so dict order
    does not matter). Files are written atomically; a missing directory is created on the
    first write.
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)

    def path(self, key: Any) -> pathlib.Path:
        """Where the answer for `key` is (or would be) stored."""
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.json"

    def get(self, key: Any) -> dict[str, Any] | None:
        """The stored record for `key`, or None if there is none.

        Raises:
          ValueError: the file exists but is not a JSON object (names the file).
        """
        path = self.path(key)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise ValueError(f"{path}: corrupt cache entry: {err}") from err
        if not isinstance(record, dict) or "answer" not in record:
            raise ValueError(f"{path}: cache entry is not an object with an 'answer' field")
        return record

    def put(self, key: Any, record: Mapping[str, Any]) -> pathlib.Path:
        """Stores `record` (which must hold an `answer` field) for `key`, atomically."""
        if "answer" not in record:
            raise ValueError("a cache record needs an 'answer' field")
        path = self.path(key)
        files.write_json(path, dict(record), indent=1)
        return path
