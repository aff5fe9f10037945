"""`augment`: one task-preserving Harness variant, deterministic in its seed.

Order of work for one draw: link plain name mentions to placeholders; vary text and structure
per enabled dimension on canonical names (Skill content, Skill index, tool text, system prompt,
Hooks); then rename tools and Skills in one pass (`rename_all`, the batched equivalent of
`HarnessState.rename_*`), which rewrites every reference and extends the `RenameMap`; finally
validate. Each dimension draws from its own
random stream derived from (seed, attempt, dimension), so switching one dimension on or off
never changes what another one draws.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import random
from collections.abc import Iterable

from hat_jax import harness as hx
from hat_jax.hsa import _hooks, _skills, _surface
from hat_jax.hsa._bank import default_bank
from hat_jax.hsa._ctx import Ctx, Preserve
from hat_jax.hsa._rename import rename_all
from hat_jax.hsa._rewrite import BankRewriter, Rewriter
from hat_jax.hsa._surface import PreserveError, constraint_range


class Dim(enum.StrEnum):
    """The five HSA dimensions (paper §3.2)."""

    SKILL_ID = "skill_id"
    SKILL_CONTENT = "skill_content"
    TOOL_DEF = "tool_def"
    SYSTEM_PROMPT = "system_prompt"
    HOOK = "hook"


ALL = frozenset(Dim)
_ORDER = (Dim.SKILL_CONTENT, Dim.SKILL_ID, Dim.TOOL_DEF, Dim.SYSTEM_PROMPT, Dim.HOOK)


class HsaError(RuntimeError):
    """An augmentation could not be produced (no draw met the task's needs, or a bug made an
    invalid Harness)."""


def parse_dims(dims: str | Dim | Iterable[str | Dim]) -> frozenset[Dim]:
    """Dimensions from `"all"`, `"none"`, `"skill_id,hook"`, a `Dim` or an iterable of them."""
    if isinstance(dims, Dim):
        return frozenset({dims})
    if isinstance(dims, str):
        if dims.strip().lower() == "all":
            return ALL
        if dims.strip().lower() in ("", "none"):
            return frozenset()
        dims = [d.strip() for d in dims.split(",") if d.strip()]
    out = set()
    for d in dims:
        try:
            out.add(Dim(d))
        except ValueError:
            raise ValueError(
                f"unknown HSA dimension {d!r}; choose from {[x.value for x in Dim]}"
            ) from None
    return frozenset(out)


def _rng(seed: int, attempt: int, name: str) -> random.Random:
    digest = hashlib.sha256(f"hsa:{seed}:{attempt}:{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def augment(
    harness: hx.Harness | hx.HarnessState,
    *,
    seed: int,
    dims: str | Dim | Iterable[str | Dim] = ALL,
    strength: float = 0.5,
    preserve: Preserve | None = None,
    rewriter: Rewriter | None = None,
    max_tries: int = 16,
    opaque_names: float | None = None,
) -> hx.HarnessState:
    """A task-preserving variant of `harness` along the chosen dimensions.

    Args:
      harness: the Harness (or an already varied `HarnessState`) to vary.
      seed: the same seed, dimensions, strength, task and rewriter give the same variant.
      dims: which dimensions to vary (`ALL`, a subset of `Dim`, or `"skill_id,hook"`).
      strength: in [0, 1], how much varies: the probability of each individual change (a
        rename, a paraphrase, a moved constraint ...). Every enabled dimension changes at least
        one thing the policy sees whenever `strength > 0`; `strength = 0` returns the input.
      preserve: what the task needs (see `Preserve`); nothing is varied below it.
      rewriter: where new wording and names come from (default: the bundled bank, offline).
      max_tries: draws to attempt while `preserve.check` rejects the result.
      opaque_names: in [0, 1], the probability that a rename draws an opaque name
        (`tool_3f9a`, `skill-07c2`) instead of one of the rewriter's names for the module.
        None: `0.15 * strength` (the bank's names for most renames). An opaque name can only
        be read from the Harness the policy is shown, never memorised, so raising it puts a
        premium on copying names from the tool list and Skill index.

    Returns:
      A `HarnessState` whose `.harness` is the variant and `.renames` maps its surface names to
      canonical names.

    Raises:
      PreserveError: the task's needs cannot be met inside the Harness's valid ranges.
      HsaError: no draw satisfied `preserve.check`.
    """
    if not 0.0 <= strength <= 1.0:
        raise ValueError(f"strength must be in [0, 1], got {strength}")
    if opaque_names is not None and not 0.0 <= opaque_names <= 1.0:
        raise ValueError(f"opaque_names must be in [0, 1] or None, got {opaque_names}")
    opaque = 0.15 * strength if opaque_names is None else opaque_names
    state, dims = hx.as_state(harness), parse_dims(dims)
    preserve = preserve or Preserve()
    if not dims or strength == 0.0:
        _check_needs(state, preserve)
        return state
    rewriter = rewriter or BankRewriter()
    for attempt in range(max_tries):
        out = _draw(state, seed, attempt, dims, strength, preserve, rewriter, opaque)
        if preserve.check is None or preserve.check(out):
            return out
    raise HsaError(f"no augmentation in {max_tries} draws satisfied the task's check (seed {seed})")


def _draw(state, seed, attempt, dims, strength, preserve, rewriter, opaque) -> hx.HarnessState:
    bank = getattr(rewriter, "bank", None) or default_bank()
    h = _skills.link_mentions(state.harness)
    reserved = {*h.skill_names, *h.tool_names, *state.renames.skills.values()}
    reserved |= {*state.renames.tools.values(), *(s.name for s in bank.synthetic)}

    def ctx(dim: str) -> Ctx:
        return Ctx(
            rng=_rng(seed, attempt, dim),
            strength=strength,
            preserve=preserve,
            rewriter=rewriter,
            bank=bank,
            renames=state.renames,
            reserved=reserved,
            opaque_names=opaque,
        )

    steps = {
        Dim.SKILL_CONTENT: _skills.vary_skill_content,
        Dim.SKILL_ID: _skills.vary_skill_index,
        Dim.TOOL_DEF: _surface.vary_tool_text,
        Dim.SYSTEM_PROMPT: _surface.vary_prompt,
        Dim.HOOK: _hooks.vary_hooks,
    }
    for dim in _ORDER:
        if dim in dims:
            h = steps[dim](h, ctx(dim))
    tag = "".join(d.value[0] + d.value.split("_")[-1][0] for d in _ORDER if d in dims)
    h = dataclasses.replace(h, release=f"{state.harness.release}+hsa.{tag}.{seed}")
    out = hx.HarnessState(harness=h, renames=state.renames)
    tool_plan = (
        _surface.plan_tool_renames(out, ctx(f"{Dim.TOOL_DEF}:rename"))
        if Dim.TOOL_DEF in dims
        else {}
    )
    skill_plan = (
        _skills.plan_skill_renames(out, ctx(f"{Dim.SKILL_ID}:rename"))
        if Dim.SKILL_ID in dims
        else {}
    )
    out = rename_all(out, tools=tool_plan, skills=skill_plan)
    _check_valid(state, out)
    _check_needs(out, preserve)
    return out


def _schema_core(value):
    """A JSON Schema without its `description`s, key order ignored: what a tool *does*."""
    if isinstance(value, dict):
        return {k: _schema_core(v) for k, v in sorted(value.items()) if k != "description"}
    if isinstance(value, list):
        return [_schema_core(v) for v in value]
    return value


def _check_valid(base: hx.HarnessState, out: hx.HarnessState) -> None:
    """Re-validates the variant and checks that every tool still does what it did.

    Full JSON-Schema meta-validation is the expensive part of `validate` and cannot be
    affected by HSA, which only rewrites descriptions and property order; so schemas are
    compared with the base's instead (a stronger check: the function is preserved), and the
    rest of the Harness goes through `validate` with trivial schemas.
    """
    problems = []
    for t in out.harness.tools:
        canonical = out.renames.canonical_tool(t.name)
        old = base.harness.tool(base.renames.surface_tool(canonical))
        if old is None:
            problems.append(f"tool {t.name}: no tool {canonical!r} in the base Harness")
        elif _schema_core(hx.thaw(t.parameters)) != _schema_core(hx.thaw(old.parameters)) or (
            (t.category, t.provider, t.side_effects, t.context_args)
            != (old.category, old.provider, old.side_effects, old.context_args)
        ):
            problems.append(f"tool {t.name}: its function changed")
    trivial = tuple(
        dataclasses.replace(t, parameters={"type": "object"}, context_args=())
        for t in out.harness.tools
    )
    problems += hx.validate(dataclasses.replace(out.harness, tools=trivial), out.renames)
    if problems:
        raise HsaError(
            "augmentation produced an invalid Harness:\n  " + "\n  ".join(map(str, problems))
        )


def _check_needs(state: hx.HarnessState, preserve: Preserve) -> None:
    """Raises `PreserveError` if `state` violates what the task needs."""
    dummy = Ctx(
        rng=random.Random(0),
        strength=0.0,
        preserve=preserve,
        rewriter=None,
        bank=None,
        renames=state.renames,
        reserved=(),
        opaque_names=0.0,
    )
    for c in state.harness.prompt.constraints:
        lo, _ = constraint_range(c, dummy)
        if c.value < lo:
            raise PreserveError(f"{c.name} is {c.value} but the task needs at least {lo}")
    missing = sorted(s for s in preserve.skills if state.surface_skill(s) is None)
    if missing:
        raise PreserveError(f"the Harness lacks Skills the task needs: {missing}")
    for name in preserve.retry_hooks:
        rule = state.harness.hooks.rule(name)
        if rule is None or not rule.enabled or rule.action != "retry" or rule.max_retries < 1:
            raise PreserveError(f"the task's recovery needs hook {name!r} to retry")
