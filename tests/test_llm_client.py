"""The shared best-effort chat-completions call and its on-disk answer cache."""

import json

import httpx
import pytest

from hat_jax import llm_client


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
        assert llm_client.complete(client, "/chat/completions", {"model": "m"}) is None


def test_complete_is_none_on_transport_error():
    def handler(request):
        raise httpx.ConnectError("refused", request=request)

    with _client(handler) as client:
        assert llm_client.complete(client, "/chat/completions", {"model": "m"}) is None


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
