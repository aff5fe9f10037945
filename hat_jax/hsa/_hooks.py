"""The Hook dimension of HSA: retry behaviour, message structure and hook-triggered changes.

Production Hook updates change how often a check lets the policy retry, whether a check
repairs a reply itself or asks for a revision, how its message is worded and wrapped, how
viewer comments are laid out (message processing) and what is said when recovery fails. This
module draws controlled variants of each (paper §3.2, App. E.2). Safety checks are never
switched off, and hooks a task's recovery relies on (`Preserve.retry_hooks`) keep retrying.
"""

from __future__ import annotations

import dataclasses

from hat_jax import harness as hx
from hat_jax.hsa._ctx import Ctx

# Hooks whose action may be switched, and to what. Limited to switches that keep a path to
# recovery: a before_tool block still returns an error result the policy can act on, and a
# modify repairs the reply in place. Checks whose only safe action is a retry are not listed.
FLIPPABLE = {
    "known_tool": ("block", "retry"),
    "require_skill_permission": ("block", "retry"),
    "check_tool_arguments": ("retry", "block"),
    "speech_format": ("modify", "retry"),
    "reply_length": ("retry", "modify"),
}
RETRY_RANGE = (1, 3)
TOTAL_RETRY_RANGE = (2, 4)
COMMENT_CHARS_RANGE = (300, 800)
SANITIZE_CHARS_RANGE = (3000, 8000)


def vary_hooks(h: hx.Harness, ctx: Ctx) -> hx.Harness:
    """A variant of the Hook spec and the user-message layout.

    The layout of the user turn and the hook-message envelope always change, so every variant
    is visible to the policy; retry limits, actions, wording, input limits and the fallback
    reply change with probability `strength`.
    """
    spec = h.hooks
    rules = tuple(_vary_rule(r, ctx) for r in spec.hooks)
    total = spec.max_total_retries
    if ctx.chance(ctx.strength):
        total = ctx.rng.randint(*TOTAL_RETRY_RANGE)
    if ctx.preserve.retry_hooks:
        total = max(total, 1)
    spec = dataclasses.replace(
        spec,
        hooks=rules,
        max_total_retries=total,
        envelope=_other(ctx, ctx.bank.envelopes, spec.envelope),
        fallback=_vary_fallback(spec.fallback, ctx),
    )
    layouts = [hx.UserMessageFormat(**u) for u in ctx.bank.user_messages]
    prompt = dataclasses.replace(h.prompt, user_message=_other(ctx, layouts, h.prompt.user_message))
    return dataclasses.replace(h, hooks=spec, prompt=prompt)


def _other(ctx: Ctx, options, current):
    """A random option different from `current` (or `current` when there is none)."""
    options = [o for o in options if o != current]
    return ctx.rng.choice(options) if options else current


def _vary_rule(rule: hx.HookRule, ctx: Ctx) -> hx.HookRule:
    p, keep_retry = ctx.strength, rule.name in ctx.preserve.retry_hooks
    changes: dict = {}
    if rule.message and ctx.chance(p):
        changes["message"] = ctx.rewriter.rewrite("hook.message", rule.message, ctx.rng)
    action = rule.action
    if rule.name in FLIPPABLE and not keep_retry and ctx.chance(p / 2):
        action = _other(ctx, FLIPPABLE[rule.name], rule.action)
        changes["action"] = action
    if keep_retry and action != "retry":
        action = changes["action"] = "retry"
    if action == "retry":
        retries = rule.max_retries
        if ctx.chance(p) or retries < RETRY_RANGE[0]:
            retries = ctx.rng.randint(*RETRY_RANGE)
        changes["max_retries"] = retries
    params = _vary_params(rule, ctx)
    if params is not None:
        changes["params"] = params
    return dataclasses.replace(rule, **changes) if changes else rule


def _vary_params(rule: hx.HookRule, ctx: Ctx):
    """Hook-triggered modifications: how much input the input hook keeps, how large a tool
    result may be before it is cut, which channels are rewritten as speech."""
    if not ctx.chance(ctx.strength):
        return None
    params = hx.thaw(rule.params)
    if rule.name == "normalize_input":
        lo = max(COMMENT_CHARS_RANGE[0], ctx.preserve.min_comment_chars)
        params["max_comment_chars"] = ctx.rng.randint(lo, max(lo, COMMENT_CHARS_RANGE[1]))
        params["max_comments"] = ctx.rng.randint(max(5, ctx.preserve.min_comments), 10)
    elif rule.name == "sanitize_tool_output":
        params["max_chars"] = ctx.rng.randint(*SANITIZE_CHARS_RANGE)
    elif rule.name == "speech_format":
        params["channels"] = ctx.rng.choice([["public"], ["public", "private"]])
    else:
        return None
    return hx.freeze(params)


def _vary_fallback(fallback: hx.Fallback, ctx: Ctx) -> hx.Fallback:
    if not ctx.chance(ctx.strength):
        return fallback
    reply = _other(ctx, ctx.bank.fallback_replies, fallback.conservative_reply)
    on_failure = fallback.on_failure
    if ctx.chance(0.2 * ctx.strength):
        on_failure = "suppress" if on_failure == "conservative" else "conservative"
    return dataclasses.replace(fallback, conservative_reply=reply, on_failure=on_failure)
