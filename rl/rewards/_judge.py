"""An optional panel of LLM judges for Accuracy and Effectiveness, and its agreement with the
rule labels (paper E.1: the final evaluation judge is a three-model majority vote).

Each judge is any OpenAI-compatible `/v1/chat/completions` endpoint. The prompts are editable
files (`rl/rewards/prompts/judge_system.md` and the Jinja template `judge_user.md`, or a folder
of your own with the same two files). A judge's answer must be one JSON object with
`accuracy` (0/1) and `effectiveness` (0/0.5/1); anything else is recorded as an abstention.
The panel's label is the majority of the valid votes (ties go to the lower, stricter value);
Effectiveness takes the median. Answers can be cached on disk so a report is reproducible.
Transient endpoint failures are retried (see `hat_jax.llm_client`); the panel's `stats` count
requests, retries and requests that failed for good (those votes are abstentions).

`agreement_report` compares panel labels with the rule-based rewards: agreement rate, Cohen's
kappa and the confusion matrix per dimension, and each judge's own agreement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx
import jinja2

from hat_jax import files, llm_client
from hat_jax import harness as hx
from hat_jax.metrics import cohen_kappa, confusion_matrix
from rl.rewards._rules import RewardVector
from rl.sim import Scenario

PROMPTS = pathlib.Path(__file__).resolve().parent / "prompts"
_JSON = re.compile(r"\{.*\}", re.S)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JudgeEndpoint:
    """One judge: endpoint, model, optional API key (read from the named environment variable)."""

    base_url: str
    model: str
    api_key_env: str | None = None
    name: str = ""

    @property
    def label(self) -> str:
        return self.name or self.model


@dataclasses.dataclass(frozen=True)
class JudgeVote:
    judge: str
    accuracy: float | None
    effectiveness: float | None
    reason: str = ""
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class PanelVerdict:
    """The panel's labels (None when no judge gave a valid answer) and every vote."""

    accuracy: float | None
    effectiveness: float | None
    votes: tuple[JudgeVote, ...]


def _majority(values: Sequence[float]) -> float | None:
    if not values:
        return None
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median_low(sorted(values)) if values else None


def parse_vote(judge: str, text: str | None) -> JudgeVote:
    """A judge's answer -> vote (invalid answers become abstentions with the reason why)."""
    if not text:
        return JudgeVote(judge, None, None, error="no answer")
    m = _JSON.search(text)
    try:
        data = json.loads(m.group(0)) if m else None
    except ValueError:
        data = None
    if not isinstance(data, Mapping):
        return JudgeVote(judge, None, None, error=f"not a JSON object: {text[:120]!r}")
    acc, eff = data.get("accuracy"), data.get("effectiveness")
    if acc not in (0, 1) or eff not in (0, 0.5, 1):
        return JudgeVote(judge, None, None, error=f"labels out of range: {acc!r}, {eff!r}")
    return JudgeVote(judge, float(acc), float(eff), str(data.get("reason", ""))[:300])


class JudgePanel:
    """Three (or any odd number of) OpenAI-compatible judges voting on each episode.

    Args:
      judges: the endpoints; an odd number so that a majority exists.
      prompt_dir: folder with `judge_system.md` and `judge_user.md` (default: the bundled ones).
      cache_dir: on-disk cache of answers (None: no cache).
      timeout_s: HTTP timeout per attempt.
      retry: how transient failures are retried (default: `llm_client.DEFAULT_RETRY`).
      transport: an `httpx` transport (tests).

    Attributes:
      stats: `llm_client.CallStats` of the requests to every judge (cache hits excluded).
    """

    def __init__(
        self,
        judges: Sequence[JudgeEndpoint],
        *,
        prompt_dir: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        timeout_s: float = 60.0,
        retry: llm_client.RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ):
        if not judges or len(judges) % 2 == 0:
            raise ValueError(f"a judge panel needs an odd number of judges, got {len(judges)}")
        folder = pathlib.Path(prompt_dir) if prompt_dir else PROMPTS
        try:
            self.system = (folder / "judge_system.md").read_text(encoding="utf-8")
            source = (folder / "judge_user.md").read_text(encoding="utf-8")
        except FileNotFoundError as err:
            raise FileNotFoundError(f"judge prompt missing: {err.filename}") from err
        env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        self.user = env.from_string(source)
        self.user_source = source
        self.judges = tuple(judges)
        self._cache = llm_client.AnswerCache(cache_dir) if cache_dir else None
        self.retry = retry or llm_client.DEFAULT_RETRY
        self.stats = llm_client.CallStats()
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s), transport=transport)

    def close(self) -> None:
        self._client.close()

    def prompt(self, scenario: Scenario, trajectory: hx.Trajectory) -> str:
        """The user message the judges see for one episode."""
        ctx = trajectory.request.get("context") or {}
        product = ctx.get("product") or {}
        tools = [
            {
                "tool": r.canonical or r.name,
                "arguments": json.dumps(r.arguments, ensure_ascii=False),
                "result": json.dumps(r.result, ensure_ascii=False, default=str)[:800],
            }
            for r in trajectory.tool_calls
            if r.canonical not in hx.FLOW_TOOLS
        ]
        return self.user.render(
            comments=trajectory.request.get("comments", []),
            product=json.dumps(product, ensure_ascii=False)[:1500] if product else "(none)",
            tools=tools,
            public=trajectory.final.public,
            private=trajectory.final.private,
            facts=[f"{f.kind}: {f.value} ({f.channel})" for f in scenario.gold.facts],
            claims=[c.says for c in scenario.gold.claims],
        )

    def judge(self, scenario: Scenario, trajectory: hx.Trajectory) -> PanelVerdict:
        """Every judge's vote on one episode and the panel's majority labels."""
        user = self.prompt(scenario, trajectory)
        votes = tuple(parse_vote(j.label, self._ask(j, user)) for j in self.judges)
        valid = [v for v in votes if v.error is None]
        return PanelVerdict(
            accuracy=_majority([v.accuracy for v in valid]),
            effectiveness=_median([v.effectiveness for v in valid]),
            votes=votes,
        )

    def _ask(self, judge: JudgeEndpoint, user: str) -> str | None:
        key = [judge.model, self.system, user]
        record = self._cache.get(key) if self._cache else None
        if record is not None:
            return record["answer"]
        api_key = os.environ.get(judge.api_key_env) if judge.api_key_env else None
        payload = {
            "model": judge.model,
            "messages": [
                {"role": "system", "content": self.system},
                {"role": "user", "content": user},
            ],
            "temperature": 0.0,
            "max_tokens": 256,
        }
        url = judge.base_url.rstrip("/") + "/chat/completions"
        answer = llm_client.complete(
            self._client, url, payload, api_key=api_key, retry=self.retry, stats=self.stats
        )
        if answer is not None and self._cache:
            self._cache.put(key, {"judge": judge.label, "answer": answer})
        return answer


JUDGE_FAILURES = ("fail", "rules")


class JudgeUnavailable(RuntimeError):
    """No judge of the panel gave a valid vote on an episode (endpoints down, bad answers)."""


class JudgedRewarder:
    """Rewards with the panel's labels for Accuracy and Effectiveness and the rule rewards for
    Tool Rationality and Skill Selection (a drop-in for `Rewarder` in `LiveRoom`).

    When no judge gives a valid vote on an episode, `on_failure="fail"` raises
    `JudgeUnavailable` naming every judge and why; `"rules"` keeps the rule labels for that
    episode and counts it in `fallbacks`. A missing label never becomes a zero reward.
    """

    def __init__(self, rules, panel: JudgePanel, *, on_failure: str = "fail"):
        if on_failure not in JUDGE_FAILURES:
            raise ValueError(f"JudgedRewarder: on_failure={on_failure!r}, one of {JUDGE_FAILURES}")
        self.rules, self.panel, self.on_failure = rules, panel, on_failure
        self.fallbacks = 0

    def score(self, scenario: Scenario, trajectory: hx.Trajectory, state) -> RewardVector:
        ruled = self.rules.score(scenario, trajectory, state)
        verdict = self.panel.judge(scenario, trajectory)
        if verdict.accuracy is None or verdict.effectiveness is None:
            why = "; ".join(f"{v.judge}: {v.error}" for v in verdict.votes)
            if self.on_failure == "fail":
                raise JudgeUnavailable(
                    f"no valid judge vote on episode {scenario.id} ({why}); fix the judge "
                    "endpoints or set the judge's on_failure to 'rules'"
                )
            self.fallbacks += 1
            return ruled
        return dataclasses.replace(ruled, accuracy=verdict.accuracy,
                                   effectiveness=verdict.effectiveness)  # fmt: skip


# ------------------------------------------------------------------------------ agreement
def _kappa(pairs: Sequence[tuple[float, float]], labels: Sequence[float]) -> float | None:
    """Cohen's kappa (None without pairs; 1.0 when both raters gave one single label)."""
    if not pairs:
        return None
    kappa = cohen_kappa(confusion_matrix(pairs, labels))
    return 1.0 if kappa is None else kappa


def _dimension(pairs: list[tuple[float, float]], labels: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(pairs),
        "agreement": sum(a == b for a, b in pairs) / len(pairs) if pairs else None,
        "kappa": _kappa(pairs, labels),
        "confusion": {
            f"panel={p:g}": {
                f"rules={r:g}": sum(a == p and b == r for a, b in pairs) for r in labels
            }
            for p in labels
        },
    }


def agreement_report(items: Iterable[tuple[PanelVerdict, RewardVector]]) -> dict[str, Any]:
    """Agreement of the panel (and of each judge) with the rule labels."""
    items = list(items)
    report: dict[str, Any] = {"episodes": len(items)}
    for dim, labels in (("accuracy", (0.0, 1.0)), ("effectiveness", (0.0, 0.5, 1.0))):
        pairs = [
            (getattr(v, dim), getattr(r, dim)) for v, r in items if getattr(v, dim) is not None
        ]
        report[dim] = _dimension(pairs, labels)
        judges: dict[str, list[tuple[float, float]]] = {}
        for v, r in items:
            for vote in v.votes:
                if getattr(vote, dim) is not None:
                    judges.setdefault(vote.judge, []).append((getattr(vote, dim), getattr(r, dim)))
        report[dim]["judges"] = {
            j: sum(a == b for a, b in ps) / len(ps) for j, ps in sorted(judges.items())
        }
    report["abstentions"] = sum(vote.error is not None for v, _ in items for vote in v.votes)
    return report


def write_report(path: str | os.PathLike, report: Mapping[str, Any]) -> pathlib.Path:
    """Writes the report as JSON and a Markdown summary beside it (`.md`), atomically."""
    path = pathlib.Path(path)
    files.write_json(path, report, indent=1)
    lines = [f"# Judge panel vs rule labels ({report['episodes']} episodes)", ""]
    lines += ["| dimension | n | agreement | kappa |", "|---|---|---|---|"]
    for dim in ("accuracy", "effectiveness"):
        d = report[dim]
        agree = "-" if d["agreement"] is None else f"{d['agreement']:.3f}"
        kappa = "-" if d["kappa"] is None else f"{d['kappa']:.3f}"
        lines.append(f"| {dim} | {d['n']} | {agree} | {kappa} |")
    lines += ["", f"Abstentions (invalid or missing answers): {report['abstentions']}", ""]
    files.write_text(path.with_suffix(".md"), "\n".join(lines))
    return path
