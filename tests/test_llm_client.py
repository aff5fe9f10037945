"""The shared chat-completions call (retries, call counts, the best-effort `complete`) and its
on-disk answer cache, against `httpx.MockTransport` (no network, no waiting)."""

import json

import httpx
import pytest

from hat_jax import llm_client

FAST = llm_client.RetryPolicy(sleep=lambda seconds: None)  # retries without waiting


def _client(handler):
    return httpx.Client(base_url="http://judge.test/v1", transport=httpx.MockTransport(handler))


def _completion(content):
    return httpx.Response(200, json={"choices": [{"message": {"content": content}}]})


def test_complete_returns_first_choice_and_sends_body_and_key():
    seen = {}

    def handler(request):
        seen["url"] = str(request.url)
        seen["auth"] = request.headers.get("authorization")
        seen["body"] = json.loads(request.content)
        return _completion("hello")

    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with _client(handler) as client:
        assert llm_client.complete(client, "/chat/completions", payload, api_key="k") == "hello"
    assert seen == {
        "url": "http://judge.test/v1/chat/completions",
        "auth": "Bearer k",
        "body": payload,
    }


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(500, text="overloaded"),
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"error": "bad model"}),
        httpx.Response(200, json={"choices": [{"message": {"content": None}}]}),
    ],
    ids=["http-500", "not-json", "no-choices", "no-choices-key", "null-content"],
)
def test_complete_is_none_on_failure(response):
    with _client(lambda request: response) as client:
        assert llm_client.complete(client, "/chat/completions", {"model": "m"}, retry=FAST) is None


def test_complete_is_none_on_transport_error():
    def handler(request):
        raise httpx.ConnectError("refused", request=request)

    with _client(handler) as client:
        assert llm_client.complete(client, "/chat/completions", {"model": "m"}, retry=FAST) is None


def test_answer_cache_round_trip_and_key_order(tmp_path):
    cache = llm_client.AnswerCache(tmp_path / "cache")
    assert cache.get({"a": 1, "b": 2}) is None
    path = cache.put({"a": 1, "b": 2}, {"answer": "x", "model": "m"})
    assert path.parent.parent == tmp_path / "cache" and path.parent.name == path.stem[:2]
    assert cache.get({"b": 2, "a": 1}) == {"answer": "x", "model": "m"}
    assert cache.get({"a": 1, "b": 3}) is None
    assert not list(path.parent.glob("*.tmp*"))


def test_answer_cache_rejects_corrupt_entries(tmp_path):
    cache = llm_client.AnswerCache(tmp_path)
    with pytest.raises(ValueError, match="'answer' field"):
        cache.put("k", {"model": "m"})
    path = cache.put("k", {"answer": "x"})
    path.write_text("{truncated", encoding="utf-8")
    with pytest.raises(ValueError, match="corrupt cache entry"):
        cache.get("k")
    path.write_text('["x"]', encoding="utf-8")
    with pytest.raises(ValueError, match=str(path.name)):
        cache.get("k")


# ------------------------------------------------------------------------------ retries
def _no_wait(slept):
    """A retry policy that records its waits instead of sleeping (no jitter: exact waits)."""
    return llm_client.RetryPolicy(jitter=0.0, sleep=slept.append)


def _script(*steps):
    """A handler answering with `steps` in order (an exception instance is raised)."""
    queue, seen = list(steps), []

    def handler(request):
        seen.append(request)
        step = queue.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    return handler, seen


def test_429_is_retried_after_retry_after():
    slept, stats = [], llm_client.CallStats()
    handler, seen = _script(
        httpx.Response(429, headers={"Retry-After": "3"}, text="slow down"), _completion("ok")
    )
    with _client(handler) as client:
        answer = llm_client.complete(
            client, "/chat/completions", {"model": "m"}, retry=_no_wait(slept), stats=stats
        )
    assert answer == "ok" and len(seen) == 2 and slept == [3.0]
    assert stats.to_dict() == {"calls": 1, "retries": 1, "failures": 0}


def test_retry_after_is_capped_and_backoff_doubles():
    policy = llm_client.RetryPolicy(initial_backoff_s=0.5, max_backoff_s=8.0, jitter=0.0)
    assert [policy.backoff(i) for i in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.backoff(0, retry_after=120.0) == 8.0
    jittered = llm_client.RetryPolicy(jitter=0.5)
    assert all(0.5 <= jittered.backoff(1) <= 1.0 for _ in range(50))
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        llm_client.RetryPolicy(attempts=0)


def test_503_exhausts_the_attempts_and_counts_a_failure():
    slept, stats = [], llm_client.CallStats()
    handler, seen = _script(*[httpx.Response(503, text="overloaded")] * 4)
    with _client(handler) as client:
        assert (
            llm_client.complete(
                client, "/chat/completions", {"model": "m"}, retry=_no_wait(slept), stats=stats
            )
            is None
        )
    assert len(seen) == 4 and slept == [0.5, 1.0, 2.0]
    assert stats.to_dict() == {"calls": 1, "retries": 3, "failures": 1}


def test_post_chat_names_endpoint_and_status():
    handler, _ = _script(*[httpx.Response(503, text="overloaded")] * 2)
    retry = llm_client.RetryPolicy(attempts=2, sleep=lambda s: None)
    with _client(handler) as client, pytest.raises(llm_client.ChatError) as err:
        llm_client.post_chat(client, "/chat/completions", {"model": "m"}, retry=retry)
    assert err.value.status == 503 and err.value.retries == 1
    assert str(err.value) == (
        "chat completion at http://judge.test/v1/chat/completions returned HTTP 503 "
        "after 2 attempts: overloaded"
    )


def test_400_is_not_retried():
    slept, stats = [], llm_client.CallStats()
    handler, seen = _script(httpx.Response(400, text="unknown field"), _completion("never"))
    with _client(handler) as client, pytest.raises(llm_client.ChatError, match="HTTP 400"):
        llm_client.post_chat(
            client, "/chat/completions", {"model": "m"}, retry=_no_wait(slept), stats=stats
        )
    assert len(seen) == 1 and slept == []
    assert stats.to_dict() == {"calls": 1, "retries": 0, "failures": 1}


def test_timeouts_and_connection_errors_are_retried():
    slept, stats = [], llm_client.CallStats()
    request = httpx.Request("POST", "http://judge.test/v1/chat/completions")
    handler, seen = _script(
        httpx.ReadTimeout("read timed out", request=request),
        httpx.ConnectError("refused", request=request),
        _completion("ok"),
    )
    with _client(handler) as client:
        message = llm_client.post_chat(
            client, "/chat/completions", {"model": "m"}, retry=_no_wait(slept), stats=stats
        )
    assert message == {"content": "ok"} and len(seen) == 3 and slept == [0.5, 1.0]
    assert stats.to_dict() == {"calls": 1, "retries": 2, "failures": 0}


def test_a_timeout_on_the_last_attempt_fails_naming_the_endpoint():
    request = httpx.Request("POST", "http://judge.test/v1/chat/completions")
    handler, seen = _script(*[httpx.ReadTimeout("read timed out", request=request)] * 2)
    retry = llm_client.RetryPolicy(attempts=2, sleep=lambda s: None)
    with _client(handler) as client, pytest.raises(llm_client.ChatError) as err:
        llm_client.post_chat(client, "/chat/completions", {"model": "m"}, retry=retry)
    assert len(seen) == 2 and err.value.status is None
    assert "http://judge.test/v1/chat/completions timed out after 2 attempts" in str(err.value)


def test_an_unusable_answer_is_a_failure_and_not_retried():
    stats = llm_client.CallStats()
    handler, seen = _script(httpx.Response(200, json={"choices": [{"message": {}}]}))
    with _client(handler) as client:
        assert llm_client.complete(client, "/chat/completions", {}, stats=stats) is None
    assert len(seen) == 1 and stats.to_dict() == {"calls": 1, "retries": 0, "failures": 1}
