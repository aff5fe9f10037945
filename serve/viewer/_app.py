"""The viewer's ASGI app (starlette, served by uvicorn like the local model server).

Pages: `/` (every entry of the runs, filtered by run, set, family, score range and failure
cluster, plus what could not be read), `/item/<run>/<index>` (one trajectory), `/report` (the
evolution report's clusters, each linking to its examples), and with a blind session `/blind`
(the next unlabelled pair), `/blind/<k>` (pair k; POST records A, B or tie), `/blind/result`
and `/blind/export` (JSON). Responses forbid every external source (CSP): the pages carry their
own CSS and the one inline script (keyboard shortcuts) runs by nonce.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import secrets
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from serve.viewer import _html as h
from serve.viewer._blind import CHOICES, REASONS, BlindSession
from serve.viewer._report import Report, read_report
from serve.viewer._runs import Entry, Run, read_run

MAX_ROWS = 500


@dataclasses.dataclass(kw_only=True)
class Viewer:
    """What the app serves: the runs, the report's clusters mapped onto their entries, and the
    blind session (each optional but the runs)."""

    runs: list[Run]
    report: Report | None = None
    blind: BlindSession | None = None
    members: dict[str, set[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    unmatched: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def entries(self) -> list[Entry]:
        return [e for run in self.runs for e in run.entries]

    def nav(self) -> list[tuple[str, str]]:
        nav = [("Runs", "/")]
        if self.report is not None:
            nav.append(("Failure clusters", "/report"))
        if self.blind is not None:
            nav += [("Blind test", "/blind"), ("Blind result", "/blind/result")]
        return nav


def load_viewer(
    run_dirs: Sequence[str | pathlib.Path],
    *,
    report_dir: str | pathlib.Path | None = None,
    blind: tuple[str | pathlib.Path, str | pathlib.Path] | None = None,
    blind_dir: str | pathlib.Path | None = None,
    seed: int = 0,
) -> Viewer:
    """Reads the runs (and those the report points at), the report and the blind session.

    Raises:
      serve.viewer.BlindError: the blind runs share no item, or `blind_dir` holds another
        session.
    """
    report = read_report(report_dir) if report_dir else None
    paths = [pathlib.Path(p) for p in run_dirs]
    if report is not None:
        known = {p.resolve() for p in paths}
        paths += [p for p in report.run_dirs() if p not in known]
    runs = [read_run(p, k) for k, p in enumerate(paths)]
    viewer = Viewer(runs=runs, report=report)
    if report is not None:
        where = {
            (run.path.resolve(), *e.key): (e.run, e.index) for run in runs for e in run.entries
        }
        for c in report.clusters:
            found = {where[x] for x in c.examples if x in where}
            viewer.members[c.id] = found
            viewer.unmatched[c.id] = sum(x not in where for x in c.examples)
    if blind is not None:
        first, second = (read_run(p) for p in blind)
        folder = blind_dir or pathlib.Path("runs/blind") / f"{first.name}-vs-{second.name}"
        viewer.blind = BlindSession(first, second, folder, seed=seed)
        viewer.blind.problems[:0] = first.problems + second.problems
    return viewer


def _html(request: Request, viewer: Viewer, title: str, body: str, script: str = "") -> Response:
    nonce = secrets.token_urlsafe(12)
    text = h.page(title, body, nav=viewer.nav(), nonce=nonce, script=script)
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; "
           "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")  # fmt: skip
    return HTMLResponse(text, headers={"Content-Security-Policy": csp})


def _not_found(request: Request, viewer: Viewer, what: str) -> Response:
    response = _html(request, viewer, "Not found", f"<p>{h.esc(what)}</p>")
    response.status_code = 404
    return response


@dataclasses.dataclass(frozen=True)
class Filters:
    run: int | None = None
    set: str = ""
    family: str = ""
    cluster: str = ""
    min_score: float | None = None
    max_score: float | None = None
    faults: bool = False

    @classmethod
    def parse(cls, query: Any, problems: list[str]) -> Filters:
        def number(name: str, kind=float):
            raw = (query.get(name) or "").strip()
            if not raw:
                return None
            try:
                return kind(raw)
            except ValueError:
                problems.append(f"the filter {name}={raw!r} is not a number; ignored")
                return None

        return cls(run=number("run", int), set=query.get("set") or "",
                   family=query.get("family") or "", cluster=query.get("cluster") or "",
                   min_score=number("min_score"), max_score=number("max_score"),
                   faults=query.get("faults") == "1")  # fmt: skip

    def keep(self, e: Entry, viewer: Viewer) -> bool:
        if self.run is not None and e.run != self.run:
            return False
        if (self.set and e.set != self.set) or (self.family and e.family != self.family):
            return False
        if self.cluster and (e.run, e.index) not in viewer.members.get(self.cluster, set()):
            return False
        if self.min_score is not None and (e.score is None or e.score < self.min_score):
            return False
        if self.max_score is not None and (e.score is None or e.score > self.max_score):
            return False
        return not self.faults or h.counts(e.trajectory)["faults"] > 0


def _select(name: str, label: str, options: Sequence[tuple[str, str]], chosen: str) -> str:
    opts = "".join(
        f'<option value="{h.esc(v)}"{" selected" if v == chosen else ""}>{h.esc(t)}</option>'
        for v, t in [("", "all"), *options]
    )
    return f'<label>{h.esc(label)}<select name="{name}" id="f-{name}">{opts}</select></label>'


def _index(request: Request, viewer: Viewer) -> Response:
    problems: list[str] = []
    f = Filters.parse(request.query_params, problems)
    entries = viewer.entries
    rows = [e for e in entries if f.keep(e, viewer)]
    runs = [(str(r_i), f"{run.name} ({run.kind})") for r_i, run in enumerate(viewer.runs)]
    families = sorted({e.family for e in entries if e.family})
    sets = sorted({e.set for e in entries})
    clusters = [
        (c.id, f"{c.id}: {c.category}") for c in (viewer.report.clusters if viewer.report else [])
    ]
    number = lambda name, v: (f'<label>{name.replace("_", " ")}<input name="{name}" id="f-{name}" '
                              f'size="5" value="{h.esc("" if v is None else v)}"></label>')  # fmt: skip
    form = (
        '<form class="filters" method="get" action="/">'
        + _select("run", "run", runs, "" if f.run is None else str(f.run))
        + _select("set", "set", [(s, s) for s in sets], f.set)
        + _select("family", "family", [(x, x) for x in families], f.family)
        + (_select("cluster", "failure cluster", clusters, f.cluster) if clusters else "")
        + number("min_score", f.min_score) + number("max_score", f.max_score)
        + f'<label>faults only<input type="checkbox" name="faults" value="1" id="f-faults"'
        f'{" checked" if f.faults else ""}></label>'
        '<button type="submit" id="apply">filter</button> <a href="/">clear</a></form>'
    )  # fmt: skip
    table = [
        "<table id=entries><tr><th>run</th><th>set</th><th>item</th><th>family</th>"
        "<th>score</th><th>reply</th><th>rounds</th><th>retries</th><th>faults</th></tr>"
    ]
    for e in rows[:MAX_ROWS]:
        c = h.counts(e.trajectory)
        score = "" if e.score is None else f"{e.score:.3f}"
        reply = e.reply if len(e.reply) <= 140 else e.reply[:140] + "…"
        table.append(
            f'<tr class="entry" data-family="{h.esc(e.family)}" data-score="{h.esc(score)}">'
            f'<td class="nw">{h.esc(viewer.runs[e.run].name)}</td><td class="nw">{h.esc(e.set)}</td>'
            f'<td><a href="/item/{e.run}/{e.index}">{h.esc(e.item_id)}</a></td>'
            f'<td>{h.esc(e.family)}</td><td class="num">{score}</td><td>{h.esc(reply)}</td>'
            f'<td class="num">{c["rounds"]}</td><td class="num">{c["retries"]}</td>'
            f'<td class="num">{c["faults"]}</td></tr>'
        )
    table.append("</table>")
    shown = min(len(rows), MAX_ROWS)
    count = (f'<p id="count">{len(rows)} of {len(entries)} entries'
             f'{f" (the first {shown} shown: narrow the filters)" if shown < len(rows) else ""}</p>')  # fmt: skip
    listing = "".join(
        f"<tr><td>{h.esc(run.name)}</td><td>{h.esc(run.kind)}</td>"
        f'<td class="num">{len(run.entries)}</td><td>{h.esc(run.path)}</td></tr>'
        for run in viewer.runs
    )
    listing = ('<details class="card" id="runs"><summary>runs</summary><table><tr><th>run</th>'
               f"<th>layout</th><th>entries</th><th>folder</th></tr>{listing}</table></details>")  # fmt: skip
    run_problems = [p for run in viewer.runs for p in run.problems]
    report_problems = viewer.report.problems if viewer.report else []
    body = (h.problems_box(problems, "Filters") + h.problems_box(run_problems + report_problems,
            "Could not be read (the rest is shown)") + listing + form + count + "".join(table))  # fmt: skip
    return _html(request, viewer, "Runs", body)


def _item(request: Request, viewer: Viewer) -> Response:
    r, i = request.path_params["run"], request.path_params["index"]
    if not (0 <= r < len(viewer.runs) and 0 <= i < len(viewer.runs[r].entries)):
        return _not_found(request, viewer, f"no entry {i} in run {r}")
    run, e = viewer.runs[r], viewer.runs[r].entries[i]
    clusters = [c for c, members in viewer.members.items() if (r, i) in members]
    scores = ", ".join(f"{k} {v:.3f}" for k, v in e.scores.items())
    head = h.facts([
        ("run", f"{run.path} ({run.kind})"), ("set", e.set), ("item", e.item_id),
        ("family", e.family), ("scores", scores or "none"), ("record", e.source),
        ("failure clusters", ", ".join(clusters)),
        *((k, json.dumps(v, ensure_ascii=False) if isinstance(v, dict | list) else v)
          for k, v in e.extra.items()),
    ])  # fmt: skip
    step = "".join(
        f'<a href="/item/{r}/{j}">{label}</a> ' for label, j in (("← previous", i - 1), ("next →", i + 1))
        if 0 <= j < len(run.entries)
    )  # fmt: skip
    body = f'<p>{step}</p><div class="card">{head}</div>' + h.trajectory_html(
        e.trajectory, reply=e.reply
    )
    return _html(request, viewer, f"{e.set} / {e.item_id}", body)


def _report(request: Request, viewer: Viewer) -> Response:
    report = viewer.report
    if report is None:
        return _not_found(request, viewer, "no report given (--report DIR)")
    head = h.facts([("report", report.path), ("Harness version", report.harness_version),
                    ("evaluation run", report.eval_run_dir),
                    ("stopping rule", report.stopping_rule or "not met")])  # fmt: skip
    rows = ["<table id=clusters><tr><th>cluster</th><th>category</th><th>cause</th>"
            "<th>count</th><th>share</th><th>examples</th></tr>"]  # fmt: skip
    for c in report.clusters:
        found, missing = len(viewer.members.get(c.id, ())), viewer.unmatched.get(c.id, 0)
        note = f' <span class="muted">({missing} not found in the runs)</span>' if missing else ""
        link = "/?" + urlencode({"cluster": c.id})
        rows.append(
            f"<tr><td>{h.esc(c.id)}</td><td>{h.esc(c.category)}</td><td>{h.esc(c.cause)}</td>"
            f'<td class="num">{c.count}</td><td class="num">{c.share:.1%}</td>'
            f'<td><a href="{h.esc(link)}">{found} example{"" if found == 1 else "s"}</a>{note}</td></tr>'
        )
    rows.append("</table>")
    body = h.problems_box(report.problems) + f'<div class="card">{head}</div>' + "".join(rows)
    return _html(request, viewer, "Failure clusters", body)


_KEYS = """document.addEventListener('keydown',function(e){if(e.target.tagName==='SELECT')return;
var k={a:'A',b:'B',t:'tie'}[e.key];if(k){var b=document.getElementById('choose-'+k);if(b)b.click();}});"""


def _next_unlabelled(session: BlindSession, after: int = -1) -> int | None:
    labels = session.labels()
    order = session.pairs[after + 1 :] + session.pairs[: after + 1]
    return next((p.position for p in order if p.key not in labels), None)


def _blind_start(request: Request, viewer: Viewer) -> Response:
    if viewer.blind is None:
        return _not_found(request, viewer, "no blind session (--blind A_DIR,B_DIR)")
    k = _next_unlabelled(viewer.blind)
    return RedirectResponse("/blind/result" if k is None else f"/blind/{k}", status_code=303)


def _blind_pair(request: Request, viewer: Viewer) -> Response:
    session = viewer.blind
    k = request.path_params["position"]
    if session is None or not 0 <= k < len(session.pairs):
        return _not_found(request, viewer, f"no blind pair {k}")
    pair = session.pairs[k]
    labels = session.labels()
    current = labels.get(pair.key, {}).get("choice")
    side = lambda s: (f'<div class="card"><h2>{s}</h2>{h.final_reply(pair.shown(s).trajectory, pair.shown(s).reply)}'
                      f"<details><summary>full trace of {s}</summary>"
                      f"{h.trajectory_html(pair.shown(s).trajectory, reply=pair.shown(s).reply)}</details></div>")  # fmt: skip
    buttons = "".join(
        f'<button type="submit" name="choice" value="{c}" id="choose-{c}"'
        f"{' class=chosen' if c == current else ''}>{'Tie' if c == 'tie' else c}</button>"
        for c in CHOICES
    )
    saved_reason = labels.get(pair.key, {}).get("reason", "")
    reasons = "".join(f'<option value="{h.esc(r)}"{" selected" if r == saved_reason else ""}>'
                      f'{h.esc(r or "(no reason)")}</option>' for r in REASONS)  # fmt: skip
    steps = "".join(
        f'<a href="/blind/{j}">{label}</a> ' for label, j in (("← previous", k - 1), ("next →", k + 1))
        if 0 <= j < len(session.pairs)
    )  # fmt: skip
    done = sum(p.key in labels for p in session.pairs)
    body = (
        f'<p id="progress">item {k + 1} of {len(session.pairs)} · {done} labelled · '
        f"{'your label: ' + h.esc(current) if current else 'not labelled yet'} · {steps}</p>"
        + h.problems_box(session.problems)
        + f'<div class="card"><h3>the viewer comment(s)</h3>{h.comments(pair.first.trajectory)}</div>'
        + f'<form method="post" action="/blind/{k}" class="choices card">Which reply is better? '
        f'{buttons}<label>reason <select name="reason" id="reason">{reasons}</select></label>'
        '<span class="muted"> keys: a, b, t</span></form>'
        + f'<div class="pair">{side("A")}{side("B")}</div>'
    )
    return _html(request, viewer, "Blind comparison", body, script=_KEYS)


async def _blind_label(request: Request, viewer: Viewer) -> Response:
    session = viewer.blind
    k = request.path_params["position"]
    if session is None or not 0 <= k < len(session.pairs):
        return _not_found(request, viewer, f"no blind pair {k}")
    form = await request.form()
    try:
        session.label(k, str(form.get("choice", "")), str(form.get("reason", "")))
    except ValueError as err:
        response = _html(request, viewer, "Not recorded", f"<p>{h.esc(err)}</p>")
        response.status_code = 400
        return response
    nxt = _next_unlabelled(session, k)
    return RedirectResponse("/blind/result" if nxt is None else f"/blind/{nxt}", status_code=303)


def _blind_result(request: Request, viewer: Viewer) -> Response:
    if viewer.blind is None:
        return _not_found(request, viewer, "no blind session (--blind A_DIR,B_DIR)")
    r = viewer.blind.result()
    if r["labelled"] < r["items"] and request.query_params.get("reveal") != "1":
        body = (f'<p id="result">{r["labelled"]} of {r["items"]} pairs labelled. The result names '
                'the systems, so it waits until every pair is labelled: <a href="/blind">go on '
                'labelling</a>, or <a href="/blind/result?reveal=1">show it now</a>.</p>')  # fmt: skip
        return _html(request, viewer, "Blind result", body)
    rate = "n/a (no decided pair)" if r["win_rate_1"] is None else f"{r['win_rate_1']:.3f}"
    body = h.problems_box(viewer.blind.problems) + '<div class="card" id="result">' + h.facts([
        ("system 1", r["system_1"]), ("system 2", r["system_2"]),
        ("labelled", f"{r['labelled']} of {r['items']}"),
        ("system 1 wins", r["wins_1"]), ("system 2 wins", r["wins_2"]), ("ties", r["ties"]),
        ("system 1 win rate (non-ties)", rate), ("p-value", f"{r['p_value']:.4g}"),
        ("test", r["test"]),
        *((f"reasons ({who.replace('_', ' ')})", ", ".join(f"{k} {v}" for k, v in tags.items()))
          for who, tags in r["reasons"].items()),
    ]) + '</div><p><a href="/blind/export" id="export">export labels and result (JSON)</a></p>'  # fmt: skip
    return _html(request, viewer, "Blind result", body)


def _blind_export(request: Request, viewer: Viewer) -> Response:
    if viewer.blind is None:
        return _not_found(request, viewer, "no blind session (--blind A_DIR,B_DIR)")
    return JSONResponse(viewer.blind.export(),
                        headers={"Content-Disposition": 'attachment; filename="blind-labels.json"'})  # fmt: skip


def create_viewer_app(viewer: Viewer) -> Starlette:
    """The app over a loaded `Viewer` (serve it with uvicorn: `launch.viewer` does)."""

    def bind(page):
        async def endpoint(request: Request) -> Response:
            return page(request, viewer)

        return endpoint

    async def blind_pair(request: Request) -> Response:
        if request.method == "POST":
            return await _blind_label(request, viewer)
        return _blind_pair(request, viewer)

    return Starlette(routes=[
        Route("/", bind(_index)),
        Route("/item/{run:int}/{index:int}", bind(_item)),
        Route("/report", bind(_report)),
        Route("/blind", bind(_blind_start)),
        Route("/blind/result", bind(_blind_result)),
        Route("/blind/export", bind(_blind_export)),
        Route("/blind/{position:int}", blind_pair, methods=["GET", "POST"]),
        Route("/health", lambda request: JSONResponse({"status": "ok"})),
    ])  # fmt: skip
