"""HTML of the viewer, rendered on the server: the page shell (inline CSS, no external asset)
and a trajectory as a reader follows it (comments, Harness, each round's model call with its
reasoning, tool calls and results, Hook events and faults, then the final reply and timings).

Everything a run holds is untrusted (viewer comments, model output, tool results): every value
goes through `esc` before it reaches the page; markup comes only from this module.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

CSS = """
*{box-sizing:border-box}body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;
background:#f5f6f8}header{background:#23303f;color:#fff;padding:8px 16px;display:flex;gap:18px;
align-items:center}header a{color:#cfe3ff;text-decoration:none}header b{margin-right:12px}
main{padding:14px 18px;max-width:1500px}h1{font-size:20px;margin:6px 0 12px}
h2{font-size:16px;margin:16px 0 6px}h3{font-size:14px;margin:8px 0 4px}
table{border-collapse:collapse;background:#fff;width:100%}th,td{border-bottom:1px solid #e2e5ea;
padding:4px 8px;text-align:left;vertical-align:top}th{background:#eef1f5;font-weight:600}
td.nw{white-space:nowrap}td.num{text-align:right;font-variant-numeric:tabular-nums}pre{white-space:pre-wrap;
word-break:break-word;background:#f0f2f5;padding:6px 8px;margin:4px 0;border-radius:4px;
max-height:420px;overflow:auto;font:12px/1.4 ui-monospace,monospace}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 12px;margin:8px 0}
.round{border-left:3px solid #7a8ca3;padding-left:10px;margin:10px 0}
.tag{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;margin-right:4px;
background:#e4e8ee}.bad{background:#fbe0e0;color:#8a1c1c}.ok{background:#dff3e2;color:#1d6a2c}
.warn{background:#fff1cc;color:#7a5500}.problems{background:#fff4f4;border-color:#e8b4b4}
form.filters{display:flex;flex-wrap:wrap;gap:10px;align-items:end;margin-bottom:10px}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#4a5563}
input,select,button{font:inherit;padding:3px 6px}.muted{color:#6b7480}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px}.reply{font-size:15px;
background:#f7fbff;border:1px solid #cfe0f5;border-radius:6px;padding:8px 10px;margin:6px 0}
.choices button{font-size:16px;padding:8px 22px;margin-right:8px;cursor:pointer}
.chosen{outline:3px solid #2d6cdf}dl{display:grid;grid-template-columns:max-content 1fr;
gap:2px 12px;margin:4px 0}dt{color:#4a5563}dd{margin:0}
"""


def esc(value: Any) -> str:
    """Text of any value, HTML-escaped (quotes included, so it is safe in attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def pre(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
    return f"<pre>{esc(text)}</pre>"


def page(title: str, body: str, *, nav: Iterable[tuple[str, str]], nonce: str = "",
         script: str = "") -> str:  # fmt: skip
    links = "".join(f'<a href="{esc(href)}">{esc(label)}</a>' for label, href in nav)
    js = f'<script nonce="{esc(nonce)}">{script}</script>' if script else ""
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width"><style>{CSS}</style></head><body>'
        f"<header><b>hat-jax viewer</b>{links}</header><main><h1>{esc(title)}</h1>{body}</main>"
        f"{js}</body></html>"
    )


def facts(pairs: Iterable[tuple[str, Any]]) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in pairs if v not in (None, ""))
    return f"<dl>{rows}</dl>"


def problems_box(problems: Iterable[str], title: str = "Problems") -> str:
    items = "".join(f"<li>{esc(p)}</li>" for p in problems)
    return (
        f'<div class="card problems"><h3>{esc(title)}</h3><ul>{items}</ul></div>' if items else ""
    )


def comments(trajectory: Mapping[str, Any] | None) -> str:
    request = (trajectory or {}).get("request") or {}
    rows = [
        f'<li><b>@{esc(c.get("handle") or c.get("viewer_id"))}</b>: {esc(c.get("text"))}</li>'
        for c in request.get("comments") or [] if isinstance(c, Mapping)
    ]  # fmt: skip
    return (
        f'<ul class="comments">{"".join(rows)}</ul>'
        if rows
        else '<p class="muted">no comment recorded</p>'
    )


def final_reply(trajectory: Mapping[str, Any] | None, reply: str = "") -> str:
    final = (trajectory or {}).get("final") or {}
    if not final:
        return f'<div class="reply">{esc(reply) or "<i>no reply</i>"}</div>'
    parts = []
    if final.get("public"):
        parts.append(f'<div class="reply">{esc(final["public"])}</div>')
    if final.get("private"):
        parts.append(f'<div class="reply"><span class="tag">private to '
                     f'{esc(final.get("private_to"))}</span>{esc(final["private"])}</div>')  # fmt: skip
    if not parts:
        parts.append(
            f'<div class="reply"><i>no reply</i> {esc(final.get("no_reply_reason"))}</div>'
        )
    flags = [("suppressed", "warn"), ("fallback", "warn")]
    tags = "".join(f'<span class="tag {c}">{n}</span>' for n, c in flags if final.get(n))
    end = f'<span class="tag">end: {esc(final.get("end"))}</span>' if final.get("end") else ""
    return "".join(parts) + tags + end


def counts(trajectory: Mapping[str, Any] | None) -> dict[str, int]:
    t = trajectory or {}
    hooks = t.get("hook_events") or []
    return {
        "rounds": len(t.get("model_calls") or []),
        "tools": len(t.get("tool_calls") or []),
        "retries": sum(isinstance(h, Mapping) and h.get("outcome") == "retry" for h in hooks),
        "hooks": len(hooks),
        "faults": len(t.get("faults") or []),
    }


def trajectory_html(t: Mapping[str, Any] | None, *, reply: str = "") -> str:
    """The whole trace of one run (see the module docstring); None says it was not kept."""
    if not t:
        return '<p class="muted">this run did not keep the trajectory</p>' + final_reply(
            None, reply
        )
    if "model_calls" not in t:  # a single call of a non-agent set: reasoning and content
        return (f"<h3>reasoning</h3>{pre(t.get('reasoning') or '')}"
                f"<h3>reply</h3>{final_reply(None, t.get('content') or reply)}")  # fmt: skip
    harness = t.get("harness") or {}
    request = t.get("request") or {}
    timings = t.get("timings") or {}
    c = counts(t)
    head = facts([
        ("request", request.get("request_id")), ("mode", request.get("mode")),
        ("Harness", " ".join(str(harness.get(k, "")) for k in ("name", "release", "version"))),
        ("skills loaded", ", ".join(map(str, t.get("loaded_skills") or [])) or "none"),
        ("rounds", c["rounds"]), ("tool calls", c["tools"]), ("Hook events", c["hooks"]),
        ("retries", c["retries"]), ("faults", c["faults"]),
        ("timings", ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in timings.items())),
        ("started", t.get("started_at")),
    ])  # fmt: skip
    rounds = sorted({x.get("round", 0) for key in ("model_calls", "tool_calls", "hook_events",
                     "faults") for x in t.get(key) or [] if isinstance(x, Mapping)})  # fmt: skip
    body = "".join(_round(t, r) for r in rounds)
    more = (
        f"<details><summary>renames</summary>{pre(t.get('renames') or {})}</details>"
        f"<details><summary>limits</summary>{pre(t.get('limits') or {})}</details>"
        f"<details><summary>request context</summary>{pre(request.get('context') or {})}</details>"
    )
    return (f"<h3>comments</h3>{comments(t)}{head}<h3>final reply</h3>{final_reply(t, reply)}"
            f"<h3>trace</h3>{body}{more}")  # fmt: skip


def _of_round(t: Mapping[str, Any], key: str, r: int) -> list[Mapping[str, Any]]:
    return [x for x in t.get(key) or [] if isinstance(x, Mapping) and x.get("round", 0) == r]


def _seconds(x: Mapping[str, Any]) -> str:
    s = x.get("elapsed_s")
    return f'<span class="muted">{s:.3f} s</span>' if isinstance(s, int | float) else ""


def _round(t: Mapping[str, Any], r: int) -> str:
    parts = [f"<h3>round {esc(r)}</h3>"]
    for call in _of_round(t, "model_calls", r):
        out = call.get("output") or {}
        parts.append(f'<div class="card"><b>model call</b> {_seconds(call)}')
        if call.get("error"):
            parts.append(f'<div><span class="tag bad">error</span>{esc(call["error"])}</div>')
        if out.get("reasoning"):
            parts.append(f"<div class=muted>reasoning</div>{pre(out['reasoning'])}")
        if out.get("content"):
            parts.append(f"<div class=muted>content</div>{pre(out['content'])}")
        for tc in out.get("tool_calls") or []:
            fn = (tc or {}).get("function") or {}
            parts.append(f'<div><span class="tag">calls</span><b>{esc(fn.get("name"))}</b> '
                         f'{esc(json.dumps(fn.get("arguments"), ensure_ascii=False))}</div>')  # fmt: skip
        if out.get("parse_errors"):
            parts.append(
                f'<div><span class="tag bad">parse errors</span>{esc(out["parse_errors"])}</div>'
            )
        messages = call.get("messages") or []
        parts.append(f"<details><summary>the {len(messages)} messages it saw</summary>"
                     f"{_messages(messages)}</details></div>")  # fmt: skip
    for rec in _of_round(t, "tool_calls", r):
        name = esc(rec.get("name"))
        if rec.get("canonical") and rec.get("canonical") != rec.get("name"):
            name += f' <span class="muted">({esc(rec["canonical"])})</span>'
        status = (f'<span class="tag bad">{esc(rec["error"])}</span>' if rec.get("error")
                  else '<span class="tag ok">ok</span>')  # fmt: skip
        injected = "".join(f'<span class="tag warn">injected {esc(x)}</span>'
                           for x in rec.get("injected") or [])  # fmt: skip
        parts.append(
            f'<div class="card"><b>tool</b> {name} {status}{injected} {_seconds(rec)}'
            f"<div class=muted>arguments</div>{pre(rec.get('arguments'))}"
            f"<div class=muted>result</div>{pre(rec.get('result'))}</div>"
        )
    for h in _of_round(t, "hook_events", r):
        kind = "warn" if h.get("outcome") in ("retry", "modify", "flag") else "bad"
        parts.append(
            f'<div class="card"><b>Hook</b> {esc(h.get("hook"))} at {esc(h.get("point"))} '
            f'<span class="tag {kind}">{esc(h.get("outcome"))}</span> {esc(h.get("subject"))}'
            f"{pre(h.get('detail')) if h.get('detail') else ''}"
            f"{pre(h.get('message')) if h.get('message') else ''}</div>"
        )
    for fault in _of_round(t, "faults", r):
        parts.append(f'<div class="card"><span class="tag bad">fault</span>'
                     f'<b>{esc(fault.get("kind"))}</b> {esc(fault.get("detail"))}</div>')  # fmt: skip
    return f'<div class="round">{"".join(parts)}</div>'


def _messages(messages: Any) -> str:
    """A call's prompt as a reader wants it: each message's role, then its text as written."""
    if not isinstance(messages, list):
        return pre(messages)
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append(pre(m))
            continue
        name = f" {m['name']}" if m.get("name") else ""
        content = m.get("content")
        extra = {k: v for k, v in m.items() if k not in ("role", "content", "name")}
        out.append(f'<div class="muted">{esc(m.get("role"))}{esc(name)}</div>'
                   f"{pre(content if isinstance(content, str) else content or '')}"
                   f"{pre(extra) if extra else ''}")  # fmt: skip
    return "".join(out)
