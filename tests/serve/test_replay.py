"""`serve.replay` / `launch.replay`: the deployment replay against the local server with a
scripted model (a plain reply, or one that fails some calls), and against a server that
stops answering (an httpx transport)."""

import json

import httpx
import pytest

import models
from hat_jax import eval as hev
from serve import replay as rp
from serve._engine import BatchEngine
from serve.server import ServedModel, create_app, serve_in_background
from tests.serve.test_server import ScriptedSampler

REPLY = "The viewer asks.\n</think>\n\nThanks for asking, it is in stock!<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    from data.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def ctx():
    return hev.EvalContext.default()


@pytest.fixture(scope="module")
def cases(ctx, tmp_path_factory):
    return hev.ensure_set("t1", ctx, sets_dir=tmp_path_factory.mktemp("sets"), split="dev", size=3)


class FailsOn(ScriptedSampler):
    """Refuses every call whose prompt holds `needle` (one case's comment)."""

    def __init__(self, tokenizer, text, needle, **kw):
        super().__init__(tokenizer, text, **kw)
        self.tokenizer, self.needle = tokenizer, needle

    def __call__(self, prompts, **kw):
        if any(self.needle in self.tokenizer.decode(list(p)) for p in prompts):
            raise ValueError("Sampler: refused")
        return super().__call__(prompts, **kw)


def _serve(tokenizer, sampler, info=None):
    stops = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    engine = BatchEngine(sampler, stops, window_s=0)
    return serve_in_background(
        create_app(ServedModel("policy", tokenizer, engine, info=info or {}))
    )


CONFIG = rp.ReplayConfig(concurrency=(1, 2), warmup=1, requests=4)


def test_replay_measures_every_level_and_reproduces(tokenizer, ctx, cases, tmp_path):
    with _serve(tokenizer, ScriptedSampler(tokenizer, REPLY, max_length=8192)) as url:
        runs = []
        for name in ("a", "b"):
            summary = rp.replay(cases, ctx, endpoint=f"{url}/v1", model="policy",
                                run_dir=tmp_path / name, config=CONFIG)  # fmt: skip
            runs.append(summary)
    for level in ("1", "2"):
        s = runs[0]["levels"][level]
        assert s["requests"] == 4 and s["successes"] == 4 and s["attainment"] == 1.0
        for key in ("latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s",
                    "decode_tokens_per_s", "mean_score"):  # fmt: skip
            assert s[key] is not None and s[key] >= 0, key
        assert s["ttft_p50_s"] <= s["latency_p50_s"] <= s["latency_p95_s"]
    records = [json.loads(x) for x in (tmp_path / "a" / rp.REQUESTS_FILE).read_text().splitlines()]
    assert len(records) == 2 * 5 and sum(r["warmup"] for r in records) == 2
    assert all(r["model_calls"] >= 1 and r["completion_tokens"] > 0 for r in records)
    # Each record keeps its episode, which the trajectory viewer shows.
    assert all(len(r["trajectory"]["model_calls"]) == r["model_calls"] for r in records)
    from serve.viewer import read_run

    shown = read_run(tmp_path / "a")
    assert shown.kind == "replay" and not shown.problems and len(shown.entries) == 10
    assert all(e.reply and e.trajectory for e in shown.entries)
    manifest = json.loads((tmp_path / "a" / rp.MANIFEST_FILE).read_text())
    assert manifest["cases"]["version"] == cases.version and manifest["cases"]["count"] == 3
    assert manifest["harness_version"] == ctx.harness.version
    assert manifest["server_info"]["model"] == "policy" and manifest["finished_at"]
    assert manifest["checkpoint_digest"] is None and manifest["digest_source"] is None
    assert (tmp_path / "a" / rp.PLOT_FILE).is_file()
    again = [json.loads(x) for x in (tmp_path / "b" / rp.REQUESTS_FILE).read_text().splitlines()]
    key = lambda r: (r["concurrency"], r["index"])  # noqa: E731
    assert [(key(r), r["success"], r["score"]) for r in sorted(records, key=key)] == [
        (key(r), r["success"], r["score"]) for r in sorted(again, key=key)
    ]


def test_failed_requests_count_against_attainment(tokenizer, ctx, cases, tmp_path):
    config = rp.ReplayConfig(concurrency=(1,), warmup=0, requests=6)
    comment = hev.KINDS["t1"].prepare(cases[0], ctx).request.comments[0].text
    with _serve(tokenizer, FailsOn(tokenizer, REPLY, comment, max_length=8192)) as url:
        summary = rp.replay(cases, ctx, endpoint=f"{url}/v1", model="policy",
                            run_dir=tmp_path, config=config)  # fmt: skip
    s = summary["levels"]["1"]
    # Cases 0 and 3 of the six requests (three cases, cycled) fail; the rest succeed.
    assert s["requests"] == 6 and s["successes"] == 4
    assert s["attainment"] == pytest.approx(4 / 6) and s["success_rate"] == pytest.approx(4 / 6)
    failed = [json.loads(x) for x in (tmp_path / rp.REQUESTS_FILE).read_text().splitlines()]
    assert all(r["error"] for r in failed if not r["success"])


def test_an_unreachable_endpoint_is_named(ctx, cases, tmp_path):
    with pytest.raises(rp.ReplayError, match="127.0.0.1:9/v1.*does not answer"):
        rp.replay(cases, ctx, endpoint="http://127.0.0.1:9/v1", model="m", run_dir=tmp_path,
                  config=CONFIG)  # fmt: skip


def test_a_server_that_dies_mid_run_ends_it_with_the_results_kept(ctx, cases, tmp_path):
    answered = []

    def handler(request):
        if len(answered) >= 3:
            raise httpx.ConnectError("connection refused")
        answered.append(1)
        chunk = {"choices": [{"index": 0, "delta": {"content": "Thanks!"}}],
                 "usage": {"completion_tokens": 2}}  # fmt: skip
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    config = rp.ReplayConfig(concurrency=(1,), warmup=0, requests=20, abort_after=3)
    with pytest.raises(rp.ReplayError, match="stopped answering(.|\n)*partial results in"):
        rp.replay(cases, ctx, endpoint="http://replay.test/v1", model="m", run_dir=tmp_path,
                  config=config, transport=httpx.MockTransport(handler))  # fmt: skip
    kept = (tmp_path / rp.REQUESTS_FILE).read_text().splitlines()
    assert 2 <= len(kept) < 20  # the answered requests, then the failures until the abort
    assert "aborted" in json.loads((tmp_path / rp.SUMMARY_FILE).read_text())


def test_a_malformed_case_manifest_is_named(cases, tmp_path):
    folder = hev.write_set(tmp_path, cases)
    items = folder / "items.jsonl"
    items.write_text(items.read_text().replace('"id"', '"idx"', 1))
    with pytest.raises(ValueError, match="case manifest .* cannot be read"):
        rp.load_cases(folder)
    assert len(rp.load_cases(hev.write_set(tmp_path / "ok", cases))) == 3


def _export(path, weights):
    from serve import digest

    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return str(path), digest.write_digest(path)


def test_the_manifest_records_the_digest_the_server_reports(tokenizer, ctx, cases, tmp_path):
    served_dir, served = _export(tmp_path / "served", b"a" * 32)
    other_dir, other = _export(tmp_path / "other", b"b" * 32)
    info = {"checkpoint_digest": served, "tokenizer_digest": "sha256:tok"}
    small = rp.ReplayConfig(concurrency=(1,), warmup=0, requests=1)
    with _serve(tokenizer, ScriptedSampler(tokenizer, REPLY, max_length=8192), info) as url:
        rp.replay(cases, ctx, endpoint=f"{url}/v1", model="policy", run_dir=tmp_path / "a",
                  config=small, checkpoint=served_dir)  # fmt: skip
        # Told another checkpoint than the one served: refused before any request.
        with pytest.raises(ValueError, match="serves checkpoint") as err:
            rp.replay(cases, ctx, endpoint=f"{url}/v1", model="policy", run_dir=tmp_path / "b",
                      config=small, checkpoint=other_dir)  # fmt: skip
    assert served in str(err.value) and other in str(err.value)
    assert not (tmp_path / "b" / rp.MANIFEST_FILE).exists()
    manifest = json.loads((tmp_path / "a" / rp.MANIFEST_FILE).read_text())
    assert manifest["checkpoint"] == served_dir and manifest["checkpoint_digest"] == served
    assert manifest["tokenizer_digest"] == "sha256:tok"
    assert manifest["digest_source"] == "server info"


def test_digests_from_models_or_an_sglang_model_path(tmp_path):
    served_dir, served = _export(tmp_path / "served", b"a" * 32)

    def sglang(request):  # reports its model_path, no digest, no /v1/models digest
        if request.url.path == "/get_server_info":
            return httpx.Response(
                200, json={"model_path": served_dir, "tokenizer_path": served_dir}
            )
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(404)

    def ours(request):  # the digest only in its /v1/models entry
        if request.url.path == "/v1/models":
            return httpx.Response(
                200, json={"data": [{"id": "m", "checkpoint_digest": "sha256:1"}]}
            )
        return httpx.Response(404)

    for transport, want, source in (
        (sglang, served, "model_path"),
        (ours, "sha256:1", "/v1/models"),
    ):
        client = httpx.Client(base_url="http://h/v1", transport=httpx.MockTransport(transport))
        got = rp.served_digests(client, "m", rp.server_info(client, "http://h/v1"))
        assert got["checkpoint_digest"] == want and source in got["digest_source"]
    assert rp.served_digests(
        httpx.Client(base_url="http://h/v1",
                     transport=httpx.MockTransport(lambda r: httpx.Response(404))),
        "m", None,
    ) == {"checkpoint_digest": None, "tokenizer_digest": None, "digest_source": None}  # fmt: skip


def test_config_is_checked():
    with pytest.raises(ValueError, match="concurrency"):
        rp.ReplayConfig(concurrency=(0,))
    assert models  # the scripted sampler's output type


def test_the_launch_script_replays_a_case_folder(tokenizer, cases, tmp_path):
    import subprocess
    import sys

    folder = hev.write_set(tmp_path / "sets", cases)
    with _serve(tokenizer, ScriptedSampler(tokenizer, REPLY, max_length=8192)) as url:
        out = subprocess.run(
            [sys.executable, "-m", "launch.replay", f"--endpoint={url}/v1", "--model=policy",
             f"--cases={folder}", f"--out={tmp_path / 'run'}", "--concurrency=1,2",
             "--warmup=0", "--requests=2"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "concurrency 2: success 1.00, attainment@15s 1.00" in out.stdout
    assert cases.version in out.stdout
