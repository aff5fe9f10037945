"""`serve.viewer` on the server side (starlette's TestClient): every run layout read, damaged
input shown and named, untrusted text escaped, filters, the report's clusters, the blind
session's order, durability and result, the exact binomial test, and `launch.viewer`."""

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
from starlette.testclient import TestClient

from serve import viewer as vw
from tests.serve import _viewer_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _viewer_runs.build(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def viewer(runs, tmp_path_factory):
    return vw.load_viewer(
        [runs["teacher"], runs["sim"], runs["replay"], runs["damaged"]],
        report_dir=runs["report"], blind=(runs["teacher"], runs["rules"]),
        blind_dir=tmp_path_factory.mktemp("blind"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def client(viewer):
    return TestClient(vw.create_viewer_app(viewer))


def _run(viewer, name):
    return next(r for r in viewer.runs if r.path.name == name)


def test_every_layout_is_read(viewer):
    teacher, sim, replay = (_run(viewer, n) for n in ("eval-teacher", "sim", "replay"))
    assert (teacher.kind, sim.kind, replay.kind) == ("eval", "sim", "replay")
    assert [len(r.entries) for r in (teacher, sim, replay)] == [8, 3, 3]
    assert all(e.trajectory and e.reply and e.family for e in teacher.entries + sim.entries)
    assert all(e.score == e.scores["avg"] for e in teacher.entries)
    first = sim.entries[0]
    assert first.item_id.endswith("#0") and first.family == first.item_id.split("/")[0]
    assert set(first.scores) == {"accuracy", "effectiveness", "tool_rationality", "skill_selection"}
    assert replay.entries[0].set == "t1-dev" and replay.entries[0].extra["latency_s"] == 0.5
    # The report's evaluation run is loaded with it.
    assert _run(viewer, "eval-rules").kind == "eval"


def test_a_corrupt_line_is_named_and_the_rest_shown(viewer, client):
    damaged = _run(viewer, "eval-damaged")
    (problem,) = damaged.problems
    assert "eval-damaged/items/t1-dev.jsonl:3: not a JSON record" in problem
    assert len(damaged.entries) == 8  # the 8 good lines around it
    assert damaged.entries[2].source.endswith(":4")
    page = client.get("/").text
    assert "t1-dev.jsonl:3: not a JSON record" in page
    assert page.count('class="entry"') == len(viewer.entries)


def test_bad_runs_and_records_are_named(tmp_path):
    missing = vw.read_run(tmp_path / "nowhere")
    assert missing.kind == "unknown" and "does not exist" in missing.problems[0]
    (tmp_path / "r" / "items").mkdir(parents=True)
    (tmp_path / "r" / "items" / "t1.jsonl").write_text('{"set": "t1"}\n[1, 2]\n\n{"id": "ok"}\n')
    run = vw.read_run(tmp_path / "r")
    assert [e.item_id for e in run.entries] == ["ok"]
    assert run.problems[0].endswith(
        "t1.jsonl:1: an evaluation record without an 'id'; line skipped"
    )
    assert "t1.jsonl:2: not a JSON record (a JSON list, not an object)" in run.problems[1]


def test_untrusted_text_is_escaped_everywhere(viewer, client, runs, tmp_path):
    damaged = _run(viewer, "eval-damaged")
    blind = vw.Viewer(runs=[], blind=vw.BlindSession(damaged, vw.read_run(runs["rules"]), tmp_path))
    marked = next(p.position for p in blind.blind.pairs if p.key == damaged.entries[0].key)
    pages = [
        client.get("/"),
        client.get(f"/item/{viewer.runs.index(damaged)}/0"),
        TestClient(vw.create_viewer_app(blind)).get(f"/blind/{marked}"),
    ]
    for response in pages:
        assert response.status_code == 200
        assert "<script>alert" not in response.text and "<img src=x" not in response.text
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in response.text
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'nonce-" in csp
        assert "http://" not in response.text and "https://" not in response.text  # no assets


def test_filters(viewer, client):
    def rows(query):
        return client.get("/", params=query).text.count('class="entry"')

    family = sorted({e.family for e in viewer.entries})[2]
    assert rows({"family": family}) == sum(e.family == family for e in viewer.entries) > 0
    assert rows({"min_score": "0.99"}) == sum((e.score or 0) >= 0.99 for e in viewer.entries)
    assert rows({"max_score": "0.9"}) == sum(
        e.score is not None and e.score <= 0.9 for e in viewer.entries
    )
    assert rows({"run": "1"}) == 3
    assert rows({"set": "sim", "faults": "1"}) == sum(
        bool(e.trajectory["faults"]) for e in viewer.entries if e.set == "sim"
    )
    assert rows({"cluster": "c1"}) == len(viewer.members["c1"]) == 3
    page = client.get("/", params={"min_score": "lots"}).text
    assert "the filter min_score=&#x27;lots&#x27; is not a number; ignored" in page
    assert page.count('class="entry"') == len(viewer.entries)


def test_the_report_links_its_clusters_to_their_examples(viewer, client, runs, tmp_path):
    page = client.get("/report").text
    assert 'href="/?cluster=c1">3 examples' in page
    assert 'href="/?cluster=c2">1 example</a>' in page and "(1 not found in the runs)" in page
    rules = viewer.runs.index(_run(viewer, "eval-rules"))
    member = sorted(viewer.members["c1"])[0]
    assert member[0] == rules
    assert "failure clusters</dt><dd>c1" in client.get(f"/item/{member[0]}/{member[1]}").text
    (tmp_path / "failures.json").write_text(json.dumps({"format": 2}))
    assert vw.read_report(tmp_path).problems[0].endswith("format 2 is not 1")
    (tmp_path / "failures.json").write_text(
        json.dumps(
            {"format": 1, "clusters": [{"id": "c1", "examples": [{"set": "t1"}]}, {"id": "c2"}]}
        )
    )
    bad = vw.read_report(tmp_path)
    assert [c.id for c in bad.clusters] == ["c2"]
    assert "clusters[0] skipped ('run_dir')" in bad.problems[0]


def test_item_pages_show_the_whole_trace(viewer, client):
    sim = _run(viewer, "sim")
    faulty = next(e for e in sim.entries if e.trajectory["faults"])
    page = client.get(f"/item/{faulty.run}/{faulty.index}").text
    for text in ("round 1", "model call", "reasoning", "tool</b>", "fault</span>", "timings",
                 "Harness</dt>", "final reply", "messages it saw", "renames"):  # fmt: skip
        assert text in page, text
    assert client.get("/item/99/0").status_code == 404


def test_binomial_two_sided_is_exact():
    from scipy.stats import binomtest

    assert vw.binomial_two_sided(0, 5) == 2 / 32
    assert vw.binomial_two_sided(2, 6) == 2 * (1 + 6 + 15) / 64
    assert vw.binomial_two_sided(3, 6) == 1.0 and vw.binomial_two_sided(0, 0) == 1.0
    for n in range(1, 26):
        for k in range(n + 1):
            expected = binomtest(k, n, 0.5).pvalue
            assert vw.binomial_two_sided(k, n) == pytest.approx(expected, rel=1e-12, abs=1e-300)
    with pytest.raises(ValueError):
        vw.binomial_two_sided(4, 3)


def test_the_blind_session_is_seeded_recorded_and_durable(runs, tmp_path, monkeypatch):
    teacher, rules = vw.read_run(runs["teacher"]), vw.read_run(runs["rules"])
    session = vw.BlindSession(teacher, rules, tmp_path / "s", seed=3)
    order = [(p.key, p.a_is) for p in session.pairs]
    assert len(order) == 8 and {a for _, a in order} == {1, 2}
    other = vw.BlindSession(teacher, rules, tmp_path / "other", seed=4)
    assert [(p.key, p.a_is) for p in other.pairs] != order
    # A reopened session keeps its order whatever seed it is given.
    again = vw.BlindSession(teacher, rules, tmp_path / "s", seed=99)
    assert [(p.key, p.a_is) for p in again.pairs] == order
    with pytest.raises(vw.BlindError, match="not of these runs"):
        vw.BlindSession(rules, teacher, tmp_path / "s")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "session.json").write_text('{"systems": [')
    with pytest.raises(vw.BlindError, match="torn/session.json is not a blind session"):
        vw.BlindSession(teacher, rules, tmp_path / "torn")
    sim = vw.read_run(runs["sim"])
    with pytest.raises(vw.BlindError, match="share no items"):
        vw.BlindSession(teacher, sim, tmp_path / "none")

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    session.label(0, "A", "more accurate")
    session.label(1, "tie", "other")
    session.label(0, "B")  # a change of mind
    assert len(synced) == 3
    with pytest.raises(ValueError, match="choice"):
        session.label(2, "C")
    with open(tmp_path / "s" / "labels.jsonl", "a") as f:
        f.write('{"set": "t1-dev", "item_id": "x", "cho')  # a crash mid-write
    labels = again.labels()
    assert len(labels) == 2 and labels[order[0][0]]["choice"] == "B"
    assert labels[order[0][0]]["winner"] == 3 - order[0][1]
    assert "labels.jsonl:4: not a label" in again.problems[0]
    result = again.result()
    assert result["ties"] == 1 and result["wins_1"] + result["wins_2"] == 1
    assert result["p_value"] == 1.0
    # Reasons count with the latest decisions only (item 0's reason went with its first one).
    assert result["reasons"] == {"tie": {"other": 1}}
    exported = again.export()
    assert [x["position"] for x in exported["labels"]] == [0, 1]


def test_blind_pages_hide_the_systems_until_the_end(viewer, client):
    session = viewer.blind
    start = client.get("/blind", follow_redirects=False)
    assert start.status_code == 303 and start.headers["location"] == "/blind/0"
    page = client.get("/blind/0").text
    assert "eval-teacher" not in page and "eval-rules" not in page
    assert 'id="choose-A"' in page and 'id="choose-tie"' in page
    assert client.post("/blind/0", data={"choice": "maybe"}).status_code == 400
    for k in range(len(session.pairs)):
        reply = client.post(f"/blind/{k}", data={"choice": "AB"[k % 2], "reason": ""},
                            follow_redirects=False)  # fmt: skip
        assert reply.status_code == 303
        if k == 2:
            gated = client.get("/blind/result").text
            assert "3 of 8 pairs labelled" in gated and "eval-teacher" not in gated
            assert "eval-teacher" in client.get("/blind/result?reveal=1").text
    assert reply.headers["location"] == "/blind/result"
    assert "system 1 wins" in client.get("/blind/result").text
    exported = client.get("/blind/export")
    assert "attachment" in exported.headers["content-disposition"]
    assert exported.json()["result"]["labelled"] == len(session.pairs)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_viewer_serves_and_refuses_bad_flags(runs, tmp_path):
    bad = subprocess.run([sys.executable, "-m", "launch.viewer", "--blind", str(runs["rules"])],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode != 0 and "--blind takes two run directories" in bad.stderr
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launch.viewer", "--runs", f"{runs['sim']},{runs['damaged']}",
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        assert page.status_code == 200 and page.text.count('class="entry"') == 11
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert (
        "sim: sim, 3 entries, 0 problems" in out
        and "eval-damaged: eval, 8 entries, 1 problems" in out
    )
