"""LLMRewriter against a local fake OpenAI-compatible server: cache, validation, fallback."""

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hat_jax import hsa, llm_client


class FakeLLM:
    """A chat-completions endpoint that paraphrases by prefixing "In other words," and names
    modules `<name>_alt<k>`; texts containing "BREAK" come back without their placeholders."""

    def __init__(self):
        self.requests = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                if fake.fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                user = body["messages"][-1]["content"]
                if user.startswith("Propose"):
                    name = user.split("named '")[1].split("'")[0]
                    answer = json.dumps([f"{name.replace('-', '_')}_alt{k}" for k in range(3)])
                    if "Skill" in user:
                        answer = json.dumps([f"{name}-alt{k}" for k in range(3)])
                elif "BREAK" in user:
                    answer = "Something without the tokens it needs."
                else:
                    answer = f"In other words, {user[0].lower()}{user[1:]}"
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data.encode())

        self.fail = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeLLM()
    yield server
    server.close()


def test_paraphrases_are_cached_and_validated(fake, tmp_path):
    rw = hsa.LLMRewriter(base_url=fake.url, model="m", cache_dir=tmp_path, variants=2)
    text = "Check stock with {tool:check_inventory} before recommending a variant."
    out = rw.rewrite("skill.rule", text, random.Random(0))
    assert out.startswith("In other words,") and "{tool:check_inventory}" in out
    n = len(fake.requests)
    assert rw.rewrite("skill.rule", text, random.Random(0)) == out and len(fake.requests) == n
    assert rw.stats["cache_hits"] == 1

    broken = "BREAK the rule about {tool:check_inventory} and the limits."
    fallback = rw.rewrite("skill.rule", broken, random.Random(0))
    assert fallback == broken  # the bank does not know it either: unchanged
    assert rw.stats["rejected"] == 1


def test_names_come_from_the_model(fake, tmp_path):
    rw = hsa.LLMRewriter(base_url=fake.url, model="m", cache_dir=tmp_path)
    assert rw.names("tool", "check_inventory") == (
        "check_inventory_alt0",
        "check_inventory_alt1",
        "check_inventory_alt2",
    )
    assert rw.names("skill", "product-qa")[0] == "product-qa-alt0"


def test_server_failure_falls_back_to_the_bank_and_is_not_cached(fake, tmp_path):
    fake.fail = True
    slept = []
    retry = llm_client.RetryPolicy(attempts=3, jitter=0.0, sleep=slept.append)
    rw = hsa.LLMRewriter(base_url=fake.url, model="m", cache_dir=tmp_path, retry=retry)
    bank = hsa.default_bank()
    text = "Never pressure viewers with invented scarcity or deadlines."
    out = rw.rewrite("skill.rule", text, random.Random(0))
    assert out in bank.paraphrases("skill.rule", text)
    assert not list(tmp_path.rglob("*.json"))
    assert len(fake.requests) == 3 and slept == [0.5, 1.0]  # HTTP 500 is retried
    assert rw.stats["retries"] == 2 and rw.stats["failures"] == 1
    fake.fail = False
    assert rw.rewrite("skill.rule", text, random.Random(0)).startswith("In other words")


def test_augment_with_llm_is_deterministic_once_the_cache_is_warm(fake, tmp_path, base):
    rw = hsa.LLMRewriter(base_url=fake.url, model="m", cache_dir=tmp_path, variants=2)
    first = hsa.augment(base, seed=4, rewriter=rw, strength=0.6)
    n = len(fake.requests)
    again = hsa.augment(
        base,
        seed=4,
        rewriter=hsa.LLMRewriter(base_url=fake.url, model="m", cache_dir=tmp_path, variants=2),
        strength=0.6,
    )
    assert len(fake.requests) == n  # every answer came from the cache
    assert again.harness.version == first.harness.version and again.renames == first.renames
    assert any("In other words" in r.text for s in first.harness.skills for r in s.rules)
    assert any(n.endswith(("_alt0", "_alt1", "_alt2")) for n in first.harness.tool_names)
