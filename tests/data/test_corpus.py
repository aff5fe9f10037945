"""The teacher corpus: K states per scenario, the quality filter, the retry-history policy,
the files and statistics, determinism, and the command line."""

import collections
import http.server
import json
import re
import subprocess
import sys
import threading

import pytest

import data
from hat_jax import harness as hx
from hat_jax import livestream, llm_client
from tests.data._helpers import REPO

SMALL = dict(num_scenarios=8, states_per_scenario=3, fault_rate=0.15, retry_fraction=0.5, seed=3)


def _records(directory, split="train"):
    return [json.loads(x) for x in (directory / f"{split}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    config = data.CorpusConfig(teacher=data.TeacherConfig(inject_fraction=0.5), **SMALL)
    manifest = data.write_corpus(config, out, num_shards=2)
    return out, manifest, _records(out)


def test_records_pass_the_filter_and_states_follow_the_plan(corpus):
    out, manifest, records = corpus
    base = hx.load(livestream.default_world_dir()).version
    total = manifest["stats"]["total"]
    assert total["episodes"] == 24 and total["kept"] == len(records) == manifest["records"]
    assert total["kept"] + total.get("filtered", 0) == 24
    for r in records:
        assert r["schema"] == data.CORPUS_SCHEMA
        assert r["rewards"]["accuracy"] == 1.0 and r["rewards"]["effectiveness"] >= 1.0
        k = int(r["id"].rsplit("/s", 1)[1])
        assert (r["state"]["kind"] == "original") == (k == 0)
        assert (r["state"]["harness_version"] == base) == (k == 0)
        assert r["trajectory"]["harness"]["version"] == r["state"]["harness_version"]
        assert r["state"]["base_version"] == base
        assert r["tools"] and r["messages"][-1]["role"] == "assistant"
    assert len({r["id"] for r in records}) == len(records)


def test_retry_history_policy(corpus):
    _, manifest, records = corpus
    kinds = {r["retry_history"] for r in records}
    assert kinds == {"none", "final_only", "full"}
    injected = [r for r in records if r["scenario"]["inject"]]
    assert injected and all(r["retry_history"] != "none" for r in injected)
    for r in records:
        conv = data.Conversation(id=r["id"], messages=r["messages"], tools=r["tools"])
        weights = [m.get("weight", 1) for m in r["messages"] if m["role"] == "assistant"]
        hook_messages = [m for m in r["messages"][2:] if m["role"] == "user"]
        if r["retry_history"] == "full":
            assert 0 in weights and weights[-1] == 1
        else:
            assert 0 not in weights and not hook_messages
            assert not data.has_retries(r["messages"])
        assert data.split_rows(conv)
    total = manifest["stats"]["total"]
    for kind in ("none", "final_only", "full"):
        assert total[f"retry_history:{kind}"] == sum(r["retry_history"] == kind for r in records)


def test_files_statistics_and_shards(corpus):
    out, manifest, records = corpus
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "train-00000-of-00002.array_record",
        "train-00001-of-00002.array_record",
        "train.jsonl",
        "train.manifest.json",
        "train.stats.json",
        "train.stats.md",
    ]
    shards = data.open_source([out], split="train")
    assert sorted(json.loads(shards[i])["id"] for i in range(len(shards))) == sorted(
        r["id"] for r in records
    )
    stats = json.loads((out / "train.stats.json").read_text())
    assert sum(c["episodes"] for c in stats["per_family"].values()) == 24
    assert stats["per_dimension"]["original"]["episodes"] == 8
    assert {d for d in stats["per_dimension"] if d != "original"} == {
        "hook",
        "skill_content",
        "skill_id",
        "system_prompt",
        "tool_def",
    }
    md = (out / "train.stats.md").read_text()
    assert "## Per family" in md and "## Per HSA dimension" in md and "| kept |" in md
    assert manifest["harness"]["version"] == hx.load(livestream.default_world_dir()).version


def test_fixed_harness_ablation_uses_only_the_original(tmp_path):
    config = data.CorpusConfig(states="original", num_scenarios=4, states_per_scenario=1)
    data.write_corpus(config, tmp_path, num_shards=1)
    base = hx.load(livestream.default_world_dir()).version
    records = _records(tmp_path)
    assert records and all(r["state"]["harness_version"] == base for r in records)
    assert all(r["trajectory"]["renames"] == {"tools": {}, "skills": {}} for r in records)


def test_generation_is_deterministic_and_dims_per_state_is_honoured():
    config = data.CorpusConfig(num_scenarios=3, states_per_scenario=3, dims_per_state=1, seed=9)
    a = [(o.reason, o.dims, o.record) for o in data.generate_corpus(config)]
    b = [(o.reason, o.dims, o.record) for o in data.generate_corpus(config)]
    strip = lambda rs: [(x, d, r and r["messages"]) for x, d, r in rs]  # noqa: E731 - timings differ
    assert strip(a) == strip(b)
    assert all(len(d) == (0 if i % 3 == 0 else 1) for i, (_, d, _) in enumerate(a))


class _WrongTeacher(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible teacher that loads the first Reply Skill, then answers politely
    without answering: the Hooks let it through, the quality filter does not."""

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        messages = body["messages"]
        if messages[-1]["role"] == "user":
            skill = re.search(r"^- ([\w.-]+) \(reply\)", messages[0]["content"], re.M)[1]
            call = {"name": "load_skill", "arguments": json.dumps({"name": skill})}
        else:
            text = "Thanks for your comment, enjoy the show!"
            call = {"name": "reply_public", "arguments": json.dumps({"text": text})}
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "t", "type": "function", "function": call}],
        }
        payload = json.dumps({"choices": [{"message": message}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_openai_teacher_and_the_quality_filter(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WrongTeacher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        teacher = data.TeacherConfig(
            kind="openai", base_url=f"http://127.0.0.1:{server.server_port}/v1", model="wrong"
        )
        config = data.CorpusConfig(
            states="original", num_scenarios=4, states_per_scenario=1, teacher=teacher
        )
        outcomes = list(data.generate_corpus(config))
        assert outcomes and all(o.reason != "kept" and o.record is None for o in outcomes)
        assert {o.reason for o in outcomes} <= {"accuracy", "effectiveness", "no_valid_reply"}
        assert any(o.reason == "effectiveness" and o.rewards["accuracy"] == 1 for o in outcomes)
        with pytest.raises(ValueError, match="no trajectory passed the quality filter"):
            data.write_corpus(config, tmp_path, num_shards=1)
        assert not list(tmp_path.glob("*.array_record"))
    finally:
        server.shutdown()


class _FlakyTeacher(_WrongTeacher):
    """The wrong teacher behind a rate limit: every other request is answered HTTP 429
    (`down`: every request is answered HTTP 503)."""

    down, count, bodies = False, 0, []

    def do_POST(self):  # noqa: N802 - the http.server API
        cls = type(self)
        cls.count += 1
        if cls.down or cls.count % 2:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            cls.bodies.append(json.loads(body))
            self.send_response(503 if cls.down else 429)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_POST()


def test_teacher_retries_and_failures_are_counted(tmp_path, monkeypatch):
    fast = llm_client.RetryPolicy(attempts=2, sleep=lambda seconds: None)
    monkeypatch.setattr(llm_client, "DEFAULT_RETRY", fast)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyTeacher)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        teacher = data.TeacherConfig(kind="openai", base_url=url, model="wrong")
        config = data.CorpusConfig(
            states="original", num_scenarios=2, states_per_scenario=1, teacher=teacher
        )
        stats = data.CorpusStats()
        for outcome in data.generate_corpus(config):
            stats.add(outcome)
        calls = stats.to_dict()["teacher_calls"]
        assert calls["calls"] > 0 and calls["retries"] == calls["calls"]
        assert calls["failures"] == 0
        assert "chat_template_kwargs" not in _FlakyTeacher.bodies[0]  # a plain OpenAI request
        _FlakyTeacher.down = True
        outcomes = list(data.generate_corpus(config))
        assert {o.reason for o in outcomes} == {"no_valid_reply"}
        assert all(o.teacher_calls["failures"] == o.teacher_calls["calls"] for o in outcomes)
        stats = data.CorpusStats()
        for outcome in outcomes:
            stats.add(outcome)
        assert "## Teacher endpoint" in stats.markdown("t") and "- failures: " in stats.markdown(
            "t"
        )
    finally:
        _FlakyTeacher.down = False
        server.shutdown()


def test_config_errors():
    with pytest.raises(ValueError, match="states must be one of"):
        data.CorpusConfig(states="both")
    with pytest.raises(ValueError, match="needs base_url and model"):
        data.TeacherConfig(kind="openai")
    with pytest.raises(ValueError, match="retry_fraction"):
        data.CorpusConfig(retry_fraction=2.0)
    with pytest.raises(ValueError, match="sample must be one of"):
        data.CorpusConfig(sample="stratified")


@pytest.mark.parametrize("room", ["v0", "micro"])
def test_a_family_sample_deals_the_families_evenly(room):
    """`sample="families"` takes the same number of scenarios of every family (the pool's
    proportions are far from even), a seeded subset of the split, stable in its seed."""
    from rl import sim

    pool = {s.id: s.family for s in sim.default_scenarios(room).split("train")}
    n = 3 * len(sim.FAMILIES) + 2
    ids = data.corpus_scenario_ids(data.CorpusConfig(room=room, num_scenarios=n, sample="families"))
    counts = collections.Counter(pool[i] for i in ids)
    assert len(set(ids)) == n and set(ids) <= set(pool)
    assert set(counts) == set(sim.FAMILIES) and set(counts.values()) <= {3, 4}
    again = data.CorpusConfig(room=room, num_scenarios=n, sample="families")
    assert data.corpus_scenario_ids(again) == ids
    other = data.CorpusConfig(room=room, num_scenarios=n, sample="families", seed=1)
    assert data.corpus_scenario_ids(other) != ids


@pytest.mark.slow
def test_command_line_with_worker_processes(tmp_path):
    cmd = [sys.executable, "-m", "launch.make_corpus", f"--out={tmp_path}", "--num_scenarios=4"]
    cmd += ["--states_per_scenario=2", "--workers=2", "--num_shards=1", "--splits=train,dev"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "train: kept" in done.stdout and "dev: kept" in done.stdout
    one = data.CorpusConfig(num_scenarios=4, states_per_scenario=2)  # the CLI's defaults
    expected = [o.record["messages"] for o in data.generate_corpus(one) if o.record]
    assert [r["messages"] for r in _records(tmp_path)] == expected  # workers change nothing
    assert _records(tmp_path, "dev")
