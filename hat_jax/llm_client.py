"""Calls to OpenAI-compatible chat endpoints: retries, call counts, an on-disk answer cache.

`post_chat` posts one `/chat/completions` request and retries what is transient (HTTP 429 and
5xx, timeouts, dropped connections) with exponential backoff, honouring `Retry-After`; any
other error status fails at once. `CallStats` counts calls, retries and calls that failed for
good, so that a rate-limited endpoint is visible instead of silently producing less.

`complete` is the best-effort form used by offline helpers that ask a model for text (the HSA
rewriter, the reward judge panel): the first choice's content, or None once the retries are
spent (the caller falls back or abstains). `AnswerCache` keeps every answer in a JSON file
keyed by a hash of everything that determines it, so that a run is reproducible once the
cache is warm and a cache shipped with a data set replays offline.

The policy client (`hat_jax.harness.OpenAICompatPolicy`) uses `post_chat` directly: a failed
policy turn is an error the agent loop must see.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from hat_jax import files

__all__ = [
    "DEFAULT_RETRY",
    "NO_RETRY",
    "AnswerCache",
    "CallStats",
    "ChatError",
    "RetryPolicy",
    "complete",
    "post_chat",
]

# Transport errors worth another try: timeouts, refused or reset connections, a server that
# closed the connection mid-answer. Others (a malformed URL, an unsupported scheme) are not.
_TRANSIENT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a chat-completions call retries HTTP 429 and 5xx answers, timeouts and lost
    connections.

    Attributes:
      attempts: tries in all (1: no retry).
      initial_backoff_s: wait before the first retry; it doubles with each further retry.
      max_backoff_s: cap on every wait, a server's `Retry-After` included.
      jitter: share of each computed wait drawn at random (0: exact waits), so that clients
        that failed together do not retry together. A `Retry-After` wait is not jittered.
      sleep: how to wait (tests pass a recorder instead of `time.sleep`).
    """

    attempts: int = 4
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    jitter: float = 0.5
    sleep: Callable[[float], None] = dataclasses.field(
        default=time.sleep, repr=False, compare=False
    )

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy: attempts must be >= 1, got {self.attempts}")
        if not 0 <= self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "RetryPolicy: need 0 <= initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"RetryPolicy: jitter must be in [0, 1], got {self.jitter}")

    def backoff(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        wait = min(self.max_backoff_s, self.initial_backoff_s * 2**retry)
        return wait * (1.0 - self.jitter * random.random())


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)


class CallStats:
    """Thread-safe counts of chat-completions calls.

    `calls` counts calls (not attempts), `retries` the extra attempts, and `failures` the calls
    that failed for good: an error status, a transport error after the last attempt, or an
    answer that is not usable.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.calls = self.retries = self.failures = 0

    def record(self, *, calls: int = 0, retries: int = 0, failures: int = 0) -> None:
        with self._lock:
            self.calls += calls
            self.retries += retries
            self.failures += failures

    def to_dict(self) -> dict[str, int]:
        with self._lock:
            return {"calls": self.calls, "retries": self.retries, "failures": self.failures}

    def __repr__(self) -> str:
        return f"CallStats({self.to_dict()})"


class ChatError(RuntimeError):
    """A chat-completions call that failed for good (after any retries).

    Attributes:
      endpoint: the full URL.
      status: the HTTP status of the last answer (None for a transport error).
      retries: how many retries were made.
    """

    def __init__(self, message: str, *, endpoint: str, status: int | None, retries: int):
        super().__init__(message)
        self.endpoint, self.status, self.retries = endpoint, status, retries


def post_chat(
    client: httpx.Client,
    url: str,
    payload: Mapping[str, Any],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    headers: Mapping[str, str] | None = None,
    stats: CallStats | None = None,
) -> dict[str, Any]:
    """Posts one chat-completions request, retrying transient failures; the first choice's
    message.

    HTTP 429 and 5xx answers, timeouts and lost connections are retried up to
    `retry.attempts` tries in all, with exponential backoff and jitter, or after the server's
    `Retry-After` (in seconds) when it sends one, capped by `retry.max_backoff_s`. Any other
    error status (a 400 is a bad request) fails at once, as does a body that is not a chat
    completion.

    Args:
      client: the HTTP client (its base URL, if any, is joined with `url`).
      url: `/chat/completions` under the client's base URL, or a full URL.
      payload: the request body (`model`, `messages`, sampling fields).
      retry: when and how long to retry.
      headers: extra request headers (e.g. the bearer token).
      stats: counts the call, its retries and whether it failed for good.

    Raises:
      ChatError: the call failed for good; the message names the endpoint and the status or
        the transport error.
    """
    stats = stats if stats is not None else CallStats()
    stats.record(calls=1)
    endpoint = _endpoint(client, url)
    retries = 0
    try:
        while True:
            last = retries + 1 >= retry.attempts
            try:
                response = client.post(url, json=dict(payload), headers=dict(headers or {}))
            except httpx.HTTPError as err:
                if last or not isinstance(err, _TRANSIENT_ERRORS):
                    raise _transport_error(err, endpoint, retries) from err
                wait = retry.backoff(retries)
            else:
                if response.is_success:
                    return _first_message(response, endpoint, retries)
                if last or not _transient_status(response.status_code):
                    raise _status_error(response, endpoint, retries)
                wait = retry.backoff(retries, _retry_after(response))
            retries += 1
            stats.record(retries=1)
            retry.sleep(wait)
    except ChatError:
        stats.record(failures=1)
        raise


def _endpoint(client: httpx.Client, url: str) -> str:
    """The full URL a request to `url` goes to (for messages)."""
    if "://" in url or not str(client.base_url):
        return url
    return str(client.base_url).rstrip("/") + "/" + url.lstrip("/")


def _transient_status(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def _retry_after(response: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (None when absent or an HTTP date)."""
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _attempts(retries: int) -> str:
    return f" after {retries + 1} attempts" if retries else ""


def _transport_error(err: httpx.HTTPError, endpoint: str, retries: int) -> ChatError:
    if isinstance(err, httpx.TimeoutException):
        message = f"chat completion at {endpoint} timed out{_attempts(retries)}: {err}"
    else:
        message = (
            f"chat completion at {endpoint} failed{_attempts(retries)}: {type(err).__name__}: {err}"
        )
    return ChatError(message, endpoint=endpoint, status=None, retries=retries)


def _status_error(response: httpx.Response, endpoint: str, retries: int) -> ChatError:
    return ChatError(
        f"chat completion at {endpoint} returned HTTP {response.status_code}"
        f"{_attempts(retries)}: {response.text[:300]}",
        endpoint=endpoint,
        status=response.status_code,
        retries=retries,
    )


def _first_message(response: httpx.Response, endpoint: str, retries: int) -> dict[str, Any]:
    try:
        message = response.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        message = None
    if not isinstance(message, Mapping):
        raise ChatError(
            f"unexpected chat completion response from {endpoint}: {response.text[:300]}",
            endpoint=endpoint,
            status=response.status_code,
            retries=retries,
        )
    return dict(message)


def complete(
    client: httpx.Client,
    url: str,
    payload: Mapping[str, Any],
    *,
    api_key: str | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
    stats: CallStats | None = None,
) -> str | None:
    """Posts one chat-completions request (see `post_chat` for the retries); the first choice's
    content, or None on failure.

    Args:
      client: the HTTP client (its base URL, if any, is joined with `url`).
      url: `/chat/completions` under the client's base URL, or a full URL.
      payload: the request body (`model`, `messages`, sampling fields).
      api_key: sent as a bearer token when given.
      retry: when and how long to retry.
      stats: counts the call, its retries and whether it failed (a None answer).

    Returns:
      The content string, or None when the request failed after its retries, the server
      answered with an error status, or the body is not a chat completion with string content.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    stats = stats if stats is not None else CallStats()
    try:
        message = post_chat(client, url, payload, retry=retry, headers=headers, stats=stats)
    except ChatError:
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    stats.record(failures=1)
    return None


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
