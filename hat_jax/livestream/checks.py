"""The live room's hook checks (`CHECKS`), named by Harness v0's hooks.yaml `libraries`.

`factual_risk`: every figure a reply states (prices, counts, percentages, day and hour counts,
clock times), in English or Chinese, must be backed by this request's facts, read as typed
`Evidence` (see `_factcheck`); so must every identifier it states (phone numbers, addresses,
order and tracking numbers: `params.identifiers`; codes), so no other viewer's personal data
is spoken; the requesting viewer's own figures and identifiers only in a clause that
attributes them to the viewer. A mention of a commenter of this request ("@handle", the
handle the runtime supplies) addresses them and states nothing, so it is not checked.
`params.figures` extends the figure grammar. The
evidence is built once per run from `HookContext.facts` and extended as tool results arrive.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hat_jax.harness import (
    CheckLibrary,
    HookContext,
    ReplyCandidate,
    Verdict,
    fold,
    lexicon_problems,
)
from hat_jax.livestream._factcheck import (
    Evidence,
    figure_patterns,
    figures_problems,
    unsupported_claims,
    unsupported_identifiers,
)

CHECKS = CheckLibrary("hat_jax.livestream.checks")


def run_evidence(ctx: HookContext, extra: Any = None) -> Evidence:
    """The typed evidence of the run so far (cached in `ctx.memo`, extended with new facts)."""
    evidence, seen = ctx.memo.get("livestream.evidence", (None, 0))
    if evidence is None:
        evidence = Evidence(figure_patterns(extra))
    for value in ctx.facts[seen:]:
        evidence.add(value)
    ctx.memo["livestream.evidence"] = (evidence, len(ctx.facts))
    return evidence


def _factual_problems(params: Mapping[str, Any]) -> list[str]:
    out = []
    if "figures" in params:
        out += figures_problems(params["figures"], "params.figures")
    if "identifiers" in params:
        out += lexicon_problems(params["identifiers"], "params.identifiers")
    return out


def _without_mentions(text: str, ctx: HookContext) -> str:
    """`text` with every "@handle" of this request's commenters blanked: addressing a viewer
    by the handle the runtime supplies is not a claim (a handle such as "v1000" or "lucky888"
    would otherwise read as a code or a figure); the handle anywhere else is checked."""
    handles = sorted({c.handle for c in ctx.request.comments if c.handle}, key=len, reverse=True)
    if not handles:
        return text
    pattern = "|".join(re.escape(h) for h in handles)
    return re.sub(rf"@(?:{pattern})(?![\w-])", " ", text, flags=re.IGNORECASE)


@CHECKS.check("factual_risk", "before_reply", ("retry", "block"), _factual_problems)
def _factual_risk(ctx: HookContext, rule, r: ReplyCandidate):
    if r.channel == "none":
        return None
    spoken = _without_mentions(r.text, ctx)
    evidence, text = run_evidence(ctx, rule.params.get("figures")), fold(spoken)
    own = [c.text for c in ctx.request.comments if c.viewer_id == ctx.request.viewer_id]
    bad = unsupported_claims(text, evidence, own)
    bad += unsupported_identifiers(spoken, rule.params.get("identifiers"), evidence, own)
    if not bad:
        return None
    detail = ", ".join(bad[:5])
    return Verdict(detail, {"detail": detail})
