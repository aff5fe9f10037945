# Over 400 lines: the streaming client, the concurrency levels and their summary are one measurement.
"""The deployment replay (paper appendix H.3): complete agent episodes against an endpoint.

    summary = replay(cases, ctx, endpoint="http://127.0.0.1:8000/v1", model="policy",
                     run_dir="runs/replay/sft", config=ReplayConfig())

The cases are a stored evaluation set of agent items (a versioned folder, e.g. T1's dev split:
`hat_jax.eval.ensure_set("t1", ctx, sets_dir=..., split="dev")`): each request is one whole
episode of the real Harness loop (Skills, tools, Hooks, up to the round limit) whose model
calls go to the endpoint as streamed chat completions. For each concurrency level (1, 2, 4, 8)
`warmup` requests run first (recorded, not counted), then `requests` measured ones, cycling
through the cases, `concurrency` in flight.

Per request (`requests.jsonl`, one line as each finishes, so a failed run keeps what it
measured): the episode's latency (request start to final reply), time to first token (the first
non-empty streamed chunk of its first model call), completion tokens and decode tokens/s (over
the time after each call's first chunk), model calls, success (a final reply and no failed
model call), the case's score and (`keep_trajectories`) the episode's trajectory, which the
trajectory viewer shows. Per level (`summary.json`): latency P50/P95 (linear
interpolation), TTFT P50/P95, mean decode tokens/s, the success rate, and the SLO attainment:
successful requests within `slo_s` over all measured requests (failures count as misses).
`manifest.json` binds the run: id, endpoint and route, model, the case set's name, version and
hash, the live room and its Harness version (the cases' room: a set of one room never
replays under another's Harness), levels, generation settings, timeouts, the server's info when
it reports it, and times; `latency.png` plots the latency distribution per level. It records
the checkpoint the server reports serving (`served_digests`: `checkpoint_digest` and
`tokenizer_digest` of `serve.digest`, from our server's `/get_server_info` or `/v1/models`, or
SGLang's `model_path` hashed here; None when the server reports none, which the release gates
refuse), not what it was told: a `checkpoint` given as well must have that digest, or the
replay does not start.

An endpoint that does not answer the probe is an error naming it; one that stops answering
mid-run (every request of `abort_after` in a row failing to connect) ends the run with the
partial results written and an error saying where they are.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import pathlib
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from hat_jax import files, livestream
from hat_jax import harness as hx
from hat_jax.eval import EvalContext, EvalSet
from hat_jax.eval._items import check_room, content_hash
from hat_jax.eval._run import _run_one
from hat_jax.eval._sets import KINDS
from hat_jax.harness._openai import chat_payload, turn_from_message

REQUESTS_FILE, SUMMARY_FILE, MANIFEST_FILE, PLOT_FILE = (
    "requests.jsonl", "summary.json", "manifest.json", "latency.png",
)  # fmt: skip


class ReplayError(RuntimeError):
    """The replay cannot go on (an unreachable endpoint, one that stopped answering)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    """How the replay runs.

    Attributes:
      concurrency: the levels, each a number of episodes in flight.
      warmup: requests run before each level's measured ones (not counted).
      requests: measured requests per level.
      slo_s: the latency objective of the attainment figure (seconds per episode).
      sampling: the generation settings of every model call (temperature, top-p, max tokens,
        thinking; `seed` is the base of each request's own seed).
      request_timeout_s: the HTTP timeout of one model call.
      abort_after: connection failures in a row that end the run.
      server_extensions: send SGLang's `chat_template_kwargs` / `separate_reasoning` (our
        server and SGLang read them; strict hosted APIs reject them).
      keep_trajectories: write each episode's whole trajectory in its request record (the
        trajectory viewer, `python -m launch.viewer`, shows it).
    """

    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    warmup: int = 10
    requests: int = 100
    slo_s: float = 15.0
    sampling: hx.SamplingParams = dataclasses.field(
        default_factory=lambda: hx.SamplingParams(temperature=0.0, seed=0)
    )
    request_timeout_s: float = 120.0
    abort_after: int = 8
    server_extensions: bool = True
    keep_trajectories: bool = True

    def __post_init__(self):
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"ReplayConfig.concurrency={self.concurrency} must be >= 1 each")
        if self.warmup < 0 or self.requests < 1 or self.slo_s <= 0 or self.abort_after < 1:
            raise ValueError(
                "ReplayConfig: need warmup >= 0, requests >= 1, slo_s > 0, abort_after >= 1; "
                f"got {self.warmup}, {self.requests}, {self.slo_s}, {self.abort_after}"
            )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["sampling"] = dataclasses.asdict(self.sampling)
        return out


@dataclasses.dataclass
class _Call:
    start: float
    first: float | None
    end: float
    tokens: int


class StreamingEndpoint:
    """A `PolicyModel` posting streamed chat completions and timing each call.

    One per episode (its `calls` are that episode's); they share one `httpx.Client`.
    """

    inline = False

    def __init__(self, client: httpx.Client, model: str, *, server_extensions: bool):
        self.client, self.model, self.server_extensions = client, model, server_extensions
        self.calls: list[_Call] = []

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        sampling: hx.SamplingParams | None = None,
    ) -> hx.AssistantTurn:
        sampling = sampling or hx.SamplingParams()
        body = chat_payload(self.model, messages, tools, sampling,
                            server_extensions=self.server_extensions)  # fmt: skip
        body.update(stream=True, stream_options={"include_usage": True})
        start = time.perf_counter()
        try:
            message, first, tokens = self._stream(body, start)
        except httpx.HTTPError as err:
            raise hx.PolicyError(f"{type(err).__name__}: {err}") from err
        self.calls.append(_Call(start, first, time.perf_counter(), tokens))
        return turn_from_message(message)

    def _stream(self, body, start) -> tuple[dict[str, Any], float | None, int]:
        content, reasoning, calls, first, tokens = [], [], {}, None, 0
        with self.client.stream("POST", "/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                reply.read()
                raise hx.PolicyError(f"HTTP {reply.status_code}: {reply.text[:300]}")
            for line in reply.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    for key, out in (("content", content), ("reasoning_content", reasoning)):
                        if delta.get(key):
                            out.append(delta[key])
                            first = first or time.perf_counter()
                    for call in delta.get("tool_calls") or ():
                        first = first or time.perf_counter()
                        slot = calls.setdefault(
                            call.get("index", len(calls)),
                            {"id": call.get("id"), "function": {"name": "", "arguments": ""}},
                        )
                        fn = call.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""  # fmt: skip
        message = {"content": "".join(content), "reasoning_content": "".join(reasoning)}
        if calls:
            message["tool_calls"] = [calls[k] for k in sorted(calls)]
        return message, first, tokens


def _record(level, index, warmup, case, prepared, kind, trajectory, policy, started, error):
    end = time.perf_counter()
    calls = policy.calls
    first = next((c.first for c in calls if c.first is not None), None)
    decode_s = sum(c.end - c.first for c in calls if c.first is not None)
    tokens = sum(c.tokens for c in calls)
    failed = error is not None or any(f.kind in ("policy_error", "policy_timeout")
                                      for f in trajectory.faults)  # fmt: skip
    final = trajectory.final if trajectory is not None else None
    success = not failed and final is not None and bool(final.public or final.private
                                                        or final.suppressed)  # fmt: skip
    score = None
    if trajectory is not None and error is None:
        score = float(kind.score(case, prepared, trajectory).get("avg", 0.0))
    return {
        "concurrency": level,
        "index": index,
        "warmup": warmup,
        "case": case.id,
        "latency_s": round(end - started, 4),
        "ttft_s": None if first is None else round(first - started, 4),
        "completion_tokens": tokens,
        "decode_tokens_per_s": round(tokens / decode_s, 2) if decode_s > 0 else None,
        "model_calls": len(calls),
        "success": success,
        "score": score,
        "error": error
        or next(
            (
                f"{f.kind}: {f.detail}"[:300]
                for f in (trajectory.faults if trajectory else ())
                if f.kind.startswith("policy")
            ),
            None,
        ),  # fmt: skip
    }


def load_cases(folder: os.PathLike | str) -> EvalSet:
    """The case manifest: a stored evaluation set of agent items (checked against its own
    manifest). Raises ValueError naming the folder and the problem."""
    from hat_jax.eval import read_set

    try:
        cases = read_set(folder)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"the case manifest {folder} cannot be read: {err}") from None
    if not len(cases) or not all(i.agent for i in cases):
        raise ValueError(f"the case manifest {folder} must hold agent items (e.g. a T1 set)")
    return cases


def cases_room(cases: EvalSet, requested: str | None = None) -> str:
    """The live room the replay runs in: the one the case set was built for (its manifest's;
    "v0" for a set written before rooms), which an explicitly `requested` room must match.

    Raises:
      ValueError: `requested` is not a bundled room, or is another room than the cases' (both
        named).
    """
    if requested is None:
        return cases.room
    livestream.room(requested)  # an unknown room is refused, naming the known ones
    if requested != cases.room:
        raise ValueError(
            f"the case set {cases.version} was built for the {cases.room!r} live room, not the "
            f"requested {requested!r}: pass its own room or cases built for {requested!r}"
        )
    return requested


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None  # linear interpolation


def summarize_level(records: Sequence[Mapping[str, Any]], slo_s: float) -> dict[str, Any]:
    """A level's figures over its measured records (failures included in every denominator)."""
    rows = [r for r in records if not r["warmup"]]
    ok = [r for r in rows if r["success"]]
    latency = [r["latency_s"] for r in ok]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    rates = [r["decode_tokens_per_s"] for r in ok if r["decode_tokens_per_s"] is not None]
    return {
        "requests": len(rows),
        "successes": len(ok),
        "success_rate": len(ok) / len(rows) if rows else 0.0,
        "latency_p50_s": _percentile(latency, 50),
        "latency_p95_s": _percentile(latency, 95),
        "ttft_p50_s": _percentile(ttft, 50),
        "ttft_p95_s": _percentile(ttft, 95),
        "decode_tokens_per_s": float(np.mean(rates)) if rates else None,
        "slo_s": slo_s,
        "attainment": sum(r["latency_s"] <= slo_s for r in ok) / len(rows) if rows else 0.0,
        "mean_score": float(np.mean([r["score"] for r in ok if r["score"] is not None]))
        if ok else None,
    }  # fmt: skip


def server_info(client: httpx.Client, base_url: str) -> dict[str, Any] | None:
    """The server's `/server_info` (SGLang) or `/get_server_info` (ours, older SGLang); None
    when it reports none."""
    root = base_url.rstrip("/").removesuffix("/v1")
    for route in ("/server_info", "/get_server_info"):
        try:
            reply = client.get(root + route)
        except httpx.HTTPError:
            return None
        if reply.status_code == 200:
            try:
                info = reply.json()
            except ValueError:
                return None  # not a server that reports its info
            return info if isinstance(info, dict) else None
    return None


def served_digests(
    client: httpx.Client, model: str, info: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What the server says it serves: `checkpoint_digest`, `tokenizer_digest` and where they
    were read (`digest_source`; None each when the server reports neither).

    Ours reports the digests in `/get_server_info` and in its `/v1/models` entry; SGLang reports
    its `model_path` (and `tokenizer_path`), which are hashed here when they are directories on
    this machine.
    """
    from serve import digest

    info = dict(info or {})
    if info.get("checkpoint_digest"):
        return {"checkpoint_digest": info["checkpoint_digest"],
                "tokenizer_digest": info.get("tokenizer_digest"),
                "digest_source": "server info"}  # fmt: skip
    try:
        reply = client.get("/models")
        entries = reply.json().get("data", []) if reply.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        entries = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model and entry.get("checkpoint_digest"):
            return {"checkpoint_digest": entry["checkpoint_digest"],
                    "tokenizer_digest": entry.get("tokenizer_digest"),
                    "digest_source": "/v1/models"}  # fmt: skip
    path = info.get("model_path")
    if isinstance(path, str) and pathlib.Path(path).is_dir():
        tokenizer = info.get("tokenizer_path") or path
        tokenizer_digest = None
        if isinstance(tokenizer, str) and pathlib.Path(tokenizer).is_dir():
            try:
                tokenizer_digest = digest.tokenizer_digest(tokenizer)
            except FileNotFoundError:
                tokenizer_digest = None
        return {"checkpoint_digest": digest.checkpoint_digest(path),
                "tokenizer_digest": tokenizer_digest,
                "digest_source": f"the server's model_path {path}, hashed here"}  # fmt: skip
    return {"checkpoint_digest": None, "tokenizer_digest": None, "digest_source": None}


def _check_told(checkpoint: str | None, served: Mapping[str, Any], endpoint: str) -> None:
    """A `checkpoint` given on the command line must be the one the server reports serving."""
    if not checkpoint or not served["checkpoint_digest"]:
        return
    from serve import digest

    told = digest.checkpoint_digest(checkpoint)
    if told != served["checkpoint_digest"]:
        raise ValueError(
            f"the endpoint {endpoint} serves checkpoint {served['checkpoint_digest']} "
            f"({served['digest_source']}), but the checkpoint given, {checkpoint}, is {told}: "
            "replay the server of that checkpoint"
        )


def replay(
    cases: EvalSet,
    ctx: EvalContext,
    *,
    endpoint: str,
    model: str,
    run_dir: os.PathLike | str,
    config: ReplayConfig = ReplayConfig(),  # noqa: B008 - frozen
    checkpoint: str | None = None,
    api_key: str | None = None,
    transport: httpx.BaseTransport | None = None,
) -> dict[str, Any]:
    """Runs the replay (see the module docstring); returns the summary.

    Raises:
      ValueError: the cases are not agent items of one set kind, or `checkpoint` is not the
        checkpoint the server reports serving (both digests named).
      SetVersionError: the cases were built for another live room than `ctx.room` (the
        Harness loop must be the room's own).
      ReplayError: the endpoint does not answer, or stopped answering (results so far kept).
    """
    items = list(cases)
    if not items or not all(i.agent for i in items):
        raise ValueError(f"replay: {cases.name} must hold agent items (e.g. a T1 set)")
    check_room(cases, ctx.room, "replay")
    kind = KINDS[items[0].set.split("-", 1)[0]]
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=endpoint.rstrip("/"), timeout=config.request_timeout_s,
                          headers=headers, transport=transport)  # fmt: skip
    probe = StreamingEndpoint(client, model, server_extensions=config.server_extensions)
    try:
        probe.generate([{"role": "user", "content": "ping"}], [],
                       dataclasses.replace(config.sampling, max_tokens=1))  # fmt: skip
    except hx.PolicyError as err:
        client.close()
        raise ReplayError(
            f"the endpoint {endpoint} (model {model!r}) does not answer: {err}"
        ) from err
    info = server_info(client, endpoint)
    served = served_digests(client, model, info)
    try:
        _check_told(checkpoint, served, endpoint)
    except (ValueError, FileNotFoundError):
        client.close()
        raise
    manifest = {
        "run_id": uuid.uuid4().hex[:12],
        "endpoint": endpoint,
        "route": "/chat/completions (stream)",
        "model": model,
        "checkpoint": checkpoint,
        **served,
        "cases": {"set": cases.name, "version": cases.version,
                  "sha256": content_hash([i.digest() for i in items]), "count": len(items)},
        "room": ctx.room,
        "harness_version": ctx.harness.version,
        "config": config.to_dict(),
        "server_info": info,
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(),
    }  # fmt: skip
    files.write_json(run_dir / MANIFEST_FILE, manifest)
    log = _Log(run_dir / REQUESTS_FILE, manifest["run_id"])
    summary: dict[str, Any] = {"run_id": manifest["run_id"], "levels": {}}
    try:
        for level in config.concurrency:
            records = _run_level(level, items, kind, ctx, client, model, config, log)
            summary["levels"][str(level)] = summarize_level(records, config.slo_s)
            files.write_json(run_dir / SUMMARY_FILE, summary)
    except ReplayError as err:
        files.write_json(run_dir / SUMMARY_FILE, {**summary, "aborted": str(err)})
        raise ReplayError(f"{err}; partial results in {run_dir}") from None
    finally:
        client.close()
        manifest["finished_at"] = datetime.datetime.now(datetime.UTC).isoformat()
        files.write_json(run_dir / MANIFEST_FILE, manifest)
        _plot(run_dir, log.records)
    return summary


class _Log:
    """Appends each request's record as one JSONL line as it finishes (thread-safe)."""

    def __init__(self, path: pathlib.Path, run_id: str):
        self.path, self.run_id, self.records = path, run_id, []
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        record = {"run_id": self.run_id, **record}
        with self._lock:
            self.records.append(record)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())


def _run_level(level, items, kind, ctx, client, model, config, log) -> list[dict[str, Any]]:
    total = config.warmup + config.requests
    failures_in_a_row = [0]
    stop = threading.Event()
    lock = threading.Lock()
    records = []

    def one(index: int) -> None:
        if stop.is_set():
            return
        case = items[index % len(items)]
        prepared = kind.prepare(case, ctx)
        policy = StreamingEndpoint(client, model, server_extensions=config.server_extensions)
        sampling = dataclasses.replace(
            config.sampling, seed=(config.sampling.seed or 0) + index % len(items)
        )
        started, trajectory, error = time.perf_counter(), None, None
        try:
            trajectory = _run_one((case, prepared), policy, ctx, sampling)
        except Exception as err:  # noqa: BLE001 - a failed episode is a recorded failure
            error = f"{type(err).__name__}: {err}"[:300]
        record = _record(level, index, index < config.warmup, case, prepared, kind,
                         trajectory, policy, started, error)  # fmt: skip
        if config.keep_trajectories and trajectory is not None:
            record["trajectory"] = json.loads(trajectory.to_json())
        log.add(record)
        with lock:
            records.append(record)
            lost = record["error"] and ("ConnectError" in record["error"]
                                        or "RemoteProtocolError" in record["error"])  # fmt: skip
            failures_in_a_row[0] = failures_in_a_row[0] + 1 if lost else 0
            if failures_in_a_row[0] >= config.abort_after:
                stop.set()

    with concurrent.futures.ThreadPoolExecutor(level) as pool:
        list(pool.map(one, range(total)))
    if stop.is_set():
        raise ReplayError(
            f"the endpoint stopped answering at concurrency {level} "
            f"({config.abort_after} requests in a row could not connect)"
        )
    return records


def _plot(run_dir: pathlib.Path, records: Sequence[Mapping[str, Any]]) -> None:
    levels = sorted({r["concurrency"] for r in records})
    data = [[r["latency_s"] for r in records if r["concurrency"] == c and not r["warmup"]
             and r["success"]] for c in levels]  # fmt: skip
    if not any(data):
        return
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.boxplot([d or [np.nan] for d in data], tick_labels=[str(c) for c in levels])
    ax.set_xlabel("concurrency (episodes in flight)")
    ax.set_ylabel("episode latency (s)")
    ax.set_title("deployment replay: latency per concurrency")
    fig.tight_layout()
    tmp = run_dir / f".{PLOT_FILE}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, run_dir / PLOT_FILE)
