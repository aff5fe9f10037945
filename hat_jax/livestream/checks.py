"""The live room's hook checks (`CHECKS`), named by Harness v0's hooks.yaml `libraries`.

`factual_risk`: every figure a reply states (prices, counts, percentages, day and hour counts,
clock times) must be backed by this request's facts, read as typed `Evidence` (see
`_factcheck`). The evidence is built once per run from `HookContext.facts` and extended as tool
results arrive.
"""

from __future__ import annotations

from hat_jax.harness import CheckLibrary, HookContext, ReplyCandidate, Verdict
from hat_jax.livestream._factcheck import Evidence, unsupported_claims

CHECKS = CheckLibrary("hat_jax.livestream.checks")


def run_evidence(ctx: HookContext) -> Evidence:
    """The typed evidence of the run so far (cached in `ctx.memo`, extended with new facts)."""
    evidence, seen = ctx.memo.get("livestream.evidence", (None, 0))
    if evidence is None:
        evidence = Evidence()
    for value in ctx.facts[seen:]:
        evidence.add(value)
    ctx.memo["livestream.evidence"] = (evidence, len(ctx.facts))
    return evidence


@CHECKS.check("factual_risk", "before_reply", ("retry", "block"))
def _factual_risk(ctx: HookContext, rule, r: ReplyCandidate):
    if r.channel == "none":
        return None
    bad = unsupported_claims(r.text, run_evidence(ctx))
    if not bad:
        return None
    detail = ", ".join(bad[:5])
    return Verdict(detail, {"detail": detail})
