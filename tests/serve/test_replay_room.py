"""The deployment replay drives the Harness of its cases' live room: the room comes from the
stored set's manifest (v0 for one that names none), an explicit room must agree with it, and
the replay's manifest records it."""

import json
import subprocess
import sys

import httpx
import pytest

from hat_jax import eval as hev
from hat_jax.eval._items import MANIFEST_FILE
from serve import replay as rp


@pytest.fixture(scope="module")
def micro():
    return hev.EvalContext.default("micro")


@pytest.fixture(scope="module")
def cases(micro, tmp_path_factory):
    sets = tmp_path_factory.mktemp("sets")
    hev.ensure_set("t1", micro, sets_dir=sets, split="dev", size=2)
    return rp.load_cases(sets / "t1-dev")


def _answer(request):
    chunk = {"choices": [{"index": 0, "delta": {"content": "Thanks!"}}],
             "usage": {"completion_tokens": 2}}  # fmt: skip
    body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def test_the_room_comes_from_the_case_set(cases, tmp_path):
    assert cases.room == "micro" and rp.cases_room(cases) == "micro"
    assert rp.cases_room(cases, "micro") == "micro"
    with pytest.raises(
        ValueError, match=r"built for the 'micro' live room, not the requested 'v0'"
    ):
        rp.cases_room(cases, "v0")
    with pytest.raises(ValueError, match="unknown live room 'v9'"):
        rp.cases_room(cases, "v9")
    folder = hev.write_set(tmp_path, cases)  # a manifest written before rooms: v0
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    del manifest["room"]
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert rp.cases_room(rp.load_cases(folder)) == "v0"


def test_the_replay_runs_and_records_the_cases_room(micro, cases, tmp_path):
    config = rp.ReplayConfig(concurrency=(1,), warmup=0, requests=2)
    rp.replay(cases, micro, endpoint="http://replay.test/v1", model="m", run_dir=tmp_path,
              config=config, transport=httpx.MockTransport(_answer))  # fmt: skip
    manifest = json.loads((tmp_path / rp.MANIFEST_FILE).read_text())
    assert manifest["room"] == "micro" and manifest["harness_version"] == micro.harness.version
    records = [json.loads(x) for x in (tmp_path / rp.REQUESTS_FILE).read_text().splitlines()]
    assert len(records) == 2
    for r in records:  # each episode ran the micro Harness, offered its tools only
        assert r["trajectory"]["harness"]["name"] == "livestream-micro"
        assert set(r["trajectory"]["model_calls"][0]["tools"]) == set(micro.harness.tool_names)
    v0 = hev.EvalContext.default()
    with pytest.raises(hev.SetVersionError, match="built for the 'micro' live room, not 'v0'"):
        rp.replay(cases, v0, endpoint="http://replay.test/v1", model="m",
                  run_dir=tmp_path / "v0", config=config,
                  transport=httpx.MockTransport(_answer))  # fmt: skip


def test_the_launch_script_refuses_a_room_the_cases_are_not(cases, tmp_path):
    folder = hev.write_set(tmp_path / "sets", cases)
    out = subprocess.run(
        [sys.executable, "-m", "launch.replay", "--endpoint=http://127.0.0.1:9/v1",
         "--model=m", f"--cases={folder}", "--room=v0", f"--out={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode != 0
    assert "--room=v0" in out.stderr and "built for the 'micro' live room" in out.stderr
