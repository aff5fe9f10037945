"""The LLM judge panel against a local fake OpenAI-compatible server: majority vote,
abstentions, editable prompts, caching, and the agreement report against the rule labels."""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hat_jax import harness as hx
from hat_jax import llm_client
from rl import sim
from rl.rewards import (
    PROMPTS,
    JudgeEndpoint,
    JudgePanel,
    PanelVerdict,
    RewardVector,
    agreement_report,
    parse_vote,
    write_report,
)


class FakeJudges:
    """Judges by model name: `fair` mirrors the reply ("¥" in it means a price was given),
    `harsh` always says 0/0, `broken` answers prose, `down` fails with HTTP 500."""

    def __init__(self):
        self.seen = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.seen.append(body)
                model, user = body["model"], body["messages"][-1]["content"]
                if model == "down":
                    self.send_response(500)
                    self.end_headers()
                    return
                spoken = user.split("## Reply spoken to the room")[1].split("##")[0]
                good = "¥" in spoken
                answer = {
                    "fair": json.dumps(
                        {"accuracy": 1, "effectiveness": 1 if good else 0, "reason": "checked"}
                    ),
                    "harsh": 'Verdict: {"accuracy": 0, "effectiveness": 0, "reason": "strict"}',
                    "broken": "I think the reply is fine overall.",
                }[model]
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                )
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data.encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fake():
    server = FakeJudges()
    yield server
    server.close()


@pytest.fixture(scope="module")
def episodes():
    room = sim.LiveRoom()
    s = next(x for x in room.scenarios if x.phrasing == "price-01")
    good = room.run(room.teacher(), s, seed=0, state=hx.HarnessState(harness=room.harness))
    stubborn = hx.ScriptedPolicy(
        [hx.AssistantTurn(tool_calls=(hx.call("reply_public", text="Nice!"),))], repeat_last=True
    )
    bad = room.run(stubborn, s, seed=0, state=hx.HarnessState(harness=room.harness))
    return s, good, bad


def panel(fake, models, **kw):
    kw.setdefault("retry", llm_client.RetryPolicy(attempts=2, sleep=lambda seconds: None))
    return JudgePanel([JudgeEndpoint(base_url=fake.url, model=m) for m in models], **kw)


def test_majority_vote_and_abstentions(fake, episodes):
    s, good, bad = episodes
    p = panel(fake, ["fair", "fair", "harsh"])
    v = p.judge(s, good.trajectory)
    assert (v.accuracy, v.effectiveness) == (1.0, 1.0)
    v = p.judge(s, bad.trajectory)
    assert (v.accuracy, v.effectiveness) == (1.0, 0.0)
    with_down = panel(fake, ["fair", "broken", "down"])
    mixed = with_down.judge(s, good.trajectory)
    assert (mixed.accuracy, mixed.effectiveness) == (1.0, 1.0)
    assert [x.error is None for x in mixed.votes] == [True, False, False]
    # "down" answers HTTP 500 twice (one retry), then abstains; "broken" answers, badly.
    assert with_down.stats.to_dict() == {"calls": 3, "retries": 1, "failures": 1}
    tie = panel(fake, ["fair", "harsh", "broken"]).judge(s, good.trajectory)
    assert (tie.accuracy, tie.effectiveness) == (0.0, 0.0)  # ties go to the stricter label
    none = panel(fake, ["broken"]).judge(s, good.trajectory)
    assert none.accuracy is None and none.effectiveness is None


def test_the_prompt_shows_evidence_and_reply(fake, episodes):
    s, good, _ = episodes
    text = panel(fake, ["fair"]).prompt(s, good.trajectory)
    assert good.trajectory.final.public in text and "get_price_promotion" in text
    assert s.comments[0].text in text and "money:" in text


def test_prompts_are_editable_files(fake, episodes, tmp_path):
    s, good, _ = episodes
    folder = tmp_path / "prompts"
    shutil.copytree(PROMPTS, folder)
    (folder / "judge_system.md").write_text("CUSTOM RUBRIC")
    panel(fake, ["fair"], prompt_dir=folder).judge(s, good.trajectory)
    assert fake.seen[-1]["messages"][0]["content"] == "CUSTOM RUBRIC"
    (folder / "judge_user.md").unlink()
    with pytest.raises(FileNotFoundError, match="judge_user.md"):
        panel(fake, ["fair"], prompt_dir=folder)


def test_answers_are_cached(fake, episodes, tmp_path):
    s, good, _ = episodes
    p = panel(fake, ["fair", "harsh", "fair"], cache_dir=tmp_path)
    first = p.judge(s, good.trajectory)
    n = len(fake.seen)
    assert p.judge(s, good.trajectory) == first and len(fake.seen) == n


def test_panel_needs_an_odd_number_of_judges(fake):
    with pytest.raises(ValueError, match="odd number"):
        panel(fake, ["fair", "harsh"])


def test_parse_vote_rejects_out_of_range_labels():
    assert parse_vote("j", '{"accuracy": 1, "effectiveness": 0.5}').effectiveness == 0.5
    assert "out of range" in parse_vote("j", '{"accuracy": 2, "effectiveness": 1}').error
    assert parse_vote("j", None).error == "no answer"


def rv(acc, eff):
    return RewardVector(accuracy=acc, effectiveness=eff, tool_rationality=1.0, skill_selection=1.0)


def test_agreement_report_by_hand(tmp_path):
    from rl.rewards import JudgeVote

    def verdict(acc, eff):
        return PanelVerdict(
            acc,
            eff,
            (
                JudgeVote("a", acc, eff),
                JudgeVote("b", 1.0, 1.0),
                JudgeVote("c", None, None, error="x"),
            ),
        )

    items = [
        (verdict(1.0, 1.0), rv(1.0, 1.0)),
        (verdict(1.0, 0.5), rv(1.0, 1.0)),
        (verdict(0.0, 0.0), rv(0.0, 0.0)),
        (verdict(1.0, 0.0), rv(0.0, 0.0)),
    ]
    report = agreement_report(items)
    assert report["episodes"] == 4 and report["abstentions"] == 4
    acc = report["accuracy"]
    assert acc["agreement"] == 0.75
    # p_o = 3/4; panel says 1 three times in four, rules twice: p_e = 3/4*2/4 + 1/4*2/4 = 1/2.
    assert acc["kappa"] == pytest.approx((0.75 - 0.5) / 0.5)
    assert acc["confusion"]["panel=1"] == {"rules=0": 1, "rules=1": 2}
    assert report["effectiveness"]["agreement"] == 0.75
    assert report["accuracy"]["judges"] == {"a": 0.75, "b": 0.5}
    path = write_report(tmp_path / "agreement.json", report)
    assert json.loads(path.read_text())["accuracy"]["agreement"] == 0.75
    assert "| accuracy | 4 | 0.750 | 0.500 |" in path.with_suffix(".md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_panel_against_rules_end_to_end(fake, episodes):
    s, good, bad = episodes
    p = panel(fake, ["fair", "fair", "harsh"])
    report = agreement_report((p.judge(s, ep.trajectory), ep.rewards) for ep in (good, bad))
    assert report["accuracy"]["agreement"] == 1.0 and report["effectiveness"]["agreement"] == 1.0
