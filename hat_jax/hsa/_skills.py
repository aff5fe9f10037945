"""The two Skill dimensions of HSA: Skill identifiers and Skill content (paper §3.2).

Skill identifier: rewrite descriptions, add plausible and noise Skills, mask Skills the task
does not need, reorder the Skill index, rename Skills. Skill content: paraphrase rules and the
intro, vary the heading, mask non-critical rules, reorder rules. Rule ids survive every change,
so what a rule says can be traced back to the release.

What is never done: masking a Skill the task needs (`Preserve.skills`), the last Reply Skill,
the last Skill that authorises a gated tool, or a Skill another text still refers to; masking a
critical rule or one the task relies on (`Preserve.rules`).
"""

from __future__ import annotations

import dataclasses
import re

from hat_jax import harness as hx
from hat_jax.hsa._ctx import Ctx

_GATED = ("commerce", "marketing")
_SKILL_REF = re.compile(r"\{skill:([A-Za-z0-9_.\-]+)\}")


def link_mentions(h: hx.Harness) -> hx.Harness:
    """Turns plain mentions of Skill and tool names into `{skill:..}` / `{tool:..}` placeholders.

    Renaming rewrites placeholders only, so a Skill described as "load it with the after-sales
    Skill" would otherwise keep pointing at a name that no longer exists. Only identifier-like
    names (with '-' or '_') are linked, and rendering is unchanged until something is renamed.
    """
    names = [("skill", n) for n in h.skill_names] + [("tool", n) for n in h.tool_names]
    names = [(k, n) for k, n in names if "-" in n or "_" in n]
    if not names:
        return h
    alternation = "|".join(re.escape(n) for _, n in sorted(names, key=lambda x: -len(x[1])))
    pattern = re.compile(rf"(?<![\w{{:.\-])({alternation})(?![\w\-])")
    kinds = dict((n, k) for k, n in names)

    def link(text: str) -> str:
        return pattern.sub(lambda m: f"{{{kinds[m[1]]}:{m[1]}}}", text)

    skills = tuple(
        dataclasses.replace(
            s,
            description=link(s.description),
            intro=link(s.intro),
            rules=tuple(dataclasses.replace(r, text=link(r.text)) for r in s.rules),
        )
        for s in h.skills
    )
    blocks = tuple(
        dataclasses.replace(b, items=tuple(link(i) for i in b.items)) for b in h.prompt.blocks
    )
    prompt = dataclasses.replace(h.prompt, blocks=blocks)
    return dataclasses.replace(h, skills=skills, prompt=prompt)


# ------------------------------------------------------------------------------ Skill content
def vary_skill_content(h: hx.Harness, ctx: Ctx) -> hx.Harness:
    """Paraphrases, masks and reorders rules (and varies intro and heading) of each Skill.

    Each Skill is varied with probability `strength`; the Skills the task needs (or, with no
    task given, one random Skill) always change, so the policy never reads them verbatim.
    """
    needed = [n for n in h.skill_names if n in ctx.preserve.skills]
    forced = set(needed) if needed else {ctx.rng.choice(h.skill_names)}
    skills = tuple(
        _vary_one(s, ctx, force=s.name in forced)
        if s.name in forced or ctx.chance(ctx.strength)
        else s
        for s in h.skills
    )
    return dataclasses.replace(h, skills=skills)


def _vary_one(s: hx.Skill, ctx: Ctx, *, force: bool) -> hx.Skill:
    p = ctx.strength
    rules = [
        dataclasses.replace(r, text=ctx.rewriter.rewrite("skill.rule", r.text, ctx.rng))
        if ctx.chance(p)
        else r
        for r in s.rules
    ]
    maskable = [r for r in rules if not r.critical and r.id not in ctx.preserve.rules]
    masked = [r.id for r in maskable if ctx.chance(p / 3)][: len(maskable) // 2]
    rules = [r for r in rules if r.id not in masked]
    if len(rules) > 1 and ctx.chance(p):
        ctx.shuffle(rules)
    intro = ctx.rewriter.rewrite("skill.intro", s.intro, ctx.rng) if ctx.chance(p) else s.intro
    titles = ctx.bank.skill_titles.get(ctx.canonical_skill(s.name), ())
    title = ctx.rng.choice(titles) if titles and ctx.chance(p) else s.title
    new = dataclasses.replace(s, rules=tuple(rules), intro=intro, title=title)
    if force and new == s:
        new = _force_change(new, ctx)
    return new


def _force_change(s: hx.Skill, ctx: Ctx) -> hx.Skill:
    rules = list(s.rules)
    if len(rules) > 1:
        ctx.shuffle(rules, must_change=True)
        return dataclasses.replace(s, rules=tuple(rules))
    for i, r in enumerate(rules):
        text = ctx.rewriter.rewrite("skill.rule", r.text, ctx.rng)
        if text != r.text:
            rules[i] = dataclasses.replace(r, text=text)
            return dataclasses.replace(s, rules=tuple(rules))
    return s


# ------------------------------------------------------------------------------ Skill identifier
def vary_skill_index(h: hx.Harness, ctx: Ctx) -> hx.Harness:
    """Rewrites descriptions, adds synthetic Skills, masks unneeded Skills, reorders the index."""
    p = ctx.strength
    skills = [
        dataclasses.replace(
            s, description=ctx.rewriter.rewrite("skill.description", s.description, ctx.rng)
        )
        if ctx.chance(p)
        else s
        for s in h.skills
    ]
    skills = _mask(skills, h, ctx)
    skills += _synthetic(h, ctx)
    if ctx.chance(p):
        ctx.shuffle(skills)
    return dataclasses.replace(h, skills=tuple(skills))


def _referenced(skills: list[hx.Skill], h: hx.Harness) -> set[str]:
    texts = [t for s in skills for t in (s.description, s.intro, *(r.text for r in s.rules))]
    texts += [i for b in h.prompt.blocks for i in b.items]
    return {name for t in texts for name in _SKILL_REF.findall(t)}


def _mask(skills: list[hx.Skill], h: hx.Harness, ctx: Ctx) -> list[hx.Skill]:
    keep = list(skills)
    needed = set(ctx.preserve.skills) | {r.split("#", 1)[0] for r in ctx.preserve.rules}
    candidates = [s for s in skills if ctx.canonical_skill(s.name) not in needed]
    ctx.shuffle(candidates)
    budget = len(candidates) // 2
    for s in candidates:
        if budget == 0 or not ctx.chance(0.35 * ctx.strength):
            continue
        rest = [x for x in keep if x is not s]
        if _still_valid(rest, h) and s.name not in _referenced(rest, h):
            keep, budget = rest, budget - 1
    return keep


def _still_valid(skills: list[hx.Skill], h: hx.Harness) -> bool:
    """A Reply Skill remains, and every gated tool is still authorised by some Skill."""
    if not any(s.kind == "reply" for s in skills):
        return False
    allowed = {t for s in skills for t in s.allowed_tools}
    return all(t.name in allowed for t in h.tools if t.category in _GATED)


def _synthetic(h: hx.Harness, ctx: Ctx) -> list[hx.Skill]:
    taken = set(h.skill_names)
    pool = [s for s in ctx.bank.synthetic if s.name not in taken]
    plausible = [s for s in pool if not s.noise]
    noise = [s for s in pool if s.noise]
    chosen = ctx.rng.sample(
        plausible, min(len(plausible), ctx.rng.randint(0, round(3 * ctx.strength)))
    )
    chosen += ctx.rng.sample(noise, min(len(noise), ctx.rng.randint(0, round(2 * ctx.strength))))
    out = []
    for s in chosen:
        tools = tuple(t for t in s.allowed_tools if h.tool(t) is not None)
        out.append(
            hx.Skill(
                name=s.name,
                description=s.description,
                kind=s.kind,
                version="0.1.0",
                allowed_tools=tools,
                title=s.name.replace("-", " ").capitalize(),
                rules=tuple(hx.Rule(id=f"{s.name}#{i}", text=t) for i, t in enumerate(s.rules, 1)),
                source="hsa:synthetic",
            )
        )
    return out


def plan_skill_renames(state: hx.HarnessState, ctx: Ctx) -> dict[str, str]:
    """Surface name -> new name for each original Skill picked with probability `strength`
    (at least one); synthetic Skills keep their names."""
    originals = [s.name for s in state.harness.skills if s.source != "hsa:synthetic"]
    if not originals:
        return {}
    chosen = [n for n in originals if ctx.chance(ctx.strength)] or [ctx.rng.choice(originals)]
    taken = set(state.harness.tool_names) | set(state.harness.skill_names)
    return {n: ctx.fresh_name("skill", ctx.canonical_skill(n), taken) for n in chosen}
