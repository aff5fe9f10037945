# Over 400 lines: one generator per scenario family over the same catalog views.
"""Deterministic scenario generation from the bundled catalog and phrasing templates.

Each template of `data/livestream/scenarios/phrasings.yaml` is instantiated over the products,
variants, FAQ entries, orders and viewers it applies to, and each instance gets its gold
expectations from `_intents`. A scenario is kept only if the scripted teacher can solve it
under Harness v0: its gold calls return what the reply needs (the named product is found, the
FAQ entry is retrieved) and the reply fits v0's length and sentence limits. What the task needs
from any Harness variant is recorded in `Scenario.needs`.

Splits hold out products and phrasings together: every category contributes one test and one
dev product (fixed by a hash of the id); a scenario about a product belongs to a split only if
its product and its phrasing both do; product-free scenarios follow their phrasing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl.sim import _intents, _pool_cache
from rl.sim._compose import Results, clause, compose, join, lead, sentences
from rl.sim._phrasings import load_phrasings
from rl.sim._sandbox import Sandbox
from rl.sim._scenario import FAMILIES, Gold, Intent, Scenario, ScenarioSet
from rl.sim._teacher import plan_calls

REGIONS = ("Xinjiang", "Tibet", "Shanghai")
GUEST = "guest_2718"
_STORE_FAQ = {
    "payment": "Which payment methods can I use?",
    "invoice": "Can I get an invoice?",
    "address_change": "How do I change my delivery address?",
}
_PRODUCT_FREE = frozenset(
    [
        "payment",
        "invoice",
        "address_change",
        "order_missing",
        "coupon",
        "lottery",
        "follow_gift",
        "fan_benefits",
        "injection",
        "greeting",
        "identity",
        "host_name",
        "abuse",
        "order_status",
    ]
)
# Viewer-dependent intents are instantiated for every viewer (and a guest).
_PER_VIEWER = frozenset(["coupon", "follow_gift", "fan_benefits", "order_missing"])


def _h(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


def phrasings_path(world: livestream.World) -> pathlib.Path:
    """Harness v0's phrasing file of a world folder."""
    return pathlib.Path(world.root) / "scenarios" / "phrasings.yaml"


def product_splits(world: livestream.World) -> dict[str, str]:
    """product id -> split: per category, the two products with the smallest id hash go to
    test and dev, the rest to train."""
    out = {}
    for category in sorted({p["category"] for p in world.products.values()}):
        ids = sorted(
            (pid for pid, p in world.products.items() if p["category"] == category),
            key=lambda pid: _h("split", pid),
        )
        out.update({ids[0]: "test", ids[1]: "dev", **{i: "train" for i in ids[2:]}})
    return out


@dataclasses.dataclass(frozen=True)
class _Instance:
    comments: tuple[str, ...]
    intents: tuple[Intent, ...]
    screen: str
    product: str | None
    viewers: tuple[str, ...]
    key: str


class _Builder:
    """Instantiates templates into scenarios for one world."""

    def __init__(self, world: livestream.World, data: Mapping[str, Any], harness: hx.Harness):
        self.world, self.data = world, data
        self.splits = product_splits(world)
        self.viewers = sorted(world.viewers)
        self.history = tuple(data.get("history") or ())
        self.base = hx.HarnessState(harness=harness)
        self.skills = frozenset(s.name for s in harness.skills)
        v0 = self.base.harness.prompt
        self.v0 = (v0.constraint("reply_max_chars"), v0.constraint("reply_max_sentences"))
        self.fan = next(
            (
                c
                for c in world.room_view()["campaigns"]
                if c["followers_only"] and c["remaining"] > 0
            ),
            None,
        )

    # ------------------------------------------------------------------ references
    @functools.cache  # noqa: B019 - one builder per generation run
    def aliases(self, pid: str) -> tuple[str, ...]:
        """ASCII aliases that name only this product and that product search finds first."""
        return tuple(
            a
            for a in self.world.products[pid]["aliases"]
            if a.isascii()
            and self.world.match_products(a) == [pid]
            and [r["product_id"] for r in self.world.search_products(a)["results"][:1]] == [pid]
        )

    def alias(self, pid: str, salt: Any) -> str | None:
        good = self.aliases(pid)
        return good[_h(pid, salt) % len(good)] if good else None

    def other_screen(self, pid: str, salt: Any) -> str:
        lineup = [x for x in self.world.room["lineup"] if x != pid]
        return lineup[_h("screen", pid, salt) % len(lineup)]

    def viewer(self, *salt: Any) -> str:
        return self.viewers[_h("viewer", *salt) % len(self.viewers)]

    # ------------------------------------------------------------------ instances
    def instances(self, family: str, t: Mapping[str, Any]) -> Iterator[_Instance]:
        kinds = t["intents"]
        if all(k in _PRODUCT_FREE for k in kinds):
            yield from self._product_free(t)
            return
        for pid in sorted(self.world.products):
            if self.splits[pid] != t["split"]:  # `scenario` keeps a product of its split only
                continue
            for detail in self._details(t, pid):
                for on_screen in (True, False):
                    if on_screen is False and t.get("screen_only"):
                        continue
                    inst = self._product_instance(t, pid, detail, on_screen)
                    if inst is not None:
                        yield inst

    def _details(self, t: Mapping[str, Any], pid: str) -> list[dict[str, Any]]:
        p, kinds = self.world.products[pid], t["intents"]
        if "spec" in kinds:
            return [{"key": t["spec"]}] if t["spec"] in p["specs"] else []
        if "usage" in kinds:
            return [{"question": f["q"], "answer": f["a"]} for f in p["faq"]]
        if "stock_variant" in kinds:
            stock = p["stock"]
            if len(stock) < 2:
                return []
            gone = [v for v, n in stock.items() if n == 0]
            have = [v for v, n in stock.items() if n]
            picks = gone[:1] + have[_h(pid, t["id"]) % len(have) :][:1]
            return [{"variant": v} for v in picks]
        if "shipping_region" in kinds:
            return [{"region": r} for r in (REGIONS[_h(pid, t["id"]) % 2], REGIONS[2])]
        if "warranty" in kinds and not p["returns"]["warranty_months"]:
            return []
        if "{name_zh}" in str(t.get("text", "")) and not p.get("name_zh"):
            return []
        return [{}]

    def _product_instance(self, t, pid, detail, on_screen) -> _Instance | None:
        salt = (t["id"], pid, tuple(sorted(detail.items())), on_screen)
        alias = self.alias(pid, salt)
        if alias is None:
            return None
        ref = ("it", "this")[_h("ref", *salt) % 2] if on_screen else f"the {alias}"
        fill = {
            "ref": ref,
            "name": alias,
            "name_zh": self.world.products[pid].get("name_zh", ""),
            "variant": detail.get("variant", ""),
            "faq": detail.get("question", ""),
            "region": detail.get("region", ""),
        }
        texts = t.get("comments") or [t["text"]]
        comments = tuple(x.format(**fill) for x in texts)
        screen = pid if on_screen else self.other_screen(pid, salt)
        detail = {**detail, "on_screen": on_screen}
        intents = tuple(
            Intent(
                id=f"i{k}",
                kind=kind,
                comment=k if len(comments) > 1 else 0,
                product_id=None if kind in _PRODUCT_FREE else pid,
                detail=detail,
            )
            for k, kind in enumerate(t["intents"])
        )
        viewers = tuple(self.viewer(*salt, k) for k in range(len(comments)))
        if len(set(viewers)) < len(viewers):
            viewers = tuple(
                self.viewers[(self.viewers.index(viewers[0]) + k) % len(self.viewers)]
                for k in range(len(viewers))
            )
        key = f"{pid}/{'screen' if on_screen else 'named'}" + "".join(
            f"/{v}" for k, v in sorted(detail.items()) if k in ("key", "variant", "region")
        )
        if "question" in detail:
            key += f"/faq{_h(detail['question']) % 1000:03d}"
        return _Instance(comments, intents, screen, pid, viewers, key)

    def _product_free(self, t) -> Iterator[_Instance]:
        kinds = t["intents"]
        if "order_status" in kinds:
            for order_id, order in sorted(self.world.orders.items()):
                owner = order["viewer_id"]
                foreign = _h("foreign", order_id, t["id"]) % 4 == 0
                viewer = self.viewer(order_id) if foreign else owner
                if foreign and viewer == owner:
                    continue
                yield self._free_instance(t, viewer, {"order_id": order_id}, order["product_id"])
            return
        per_viewer = any(k in _PER_VIEWER for k in kinds)
        viewers = [*self.viewers, GUEST] if per_viewer else self.viewers
        for viewer in viewers:
            detail: dict[str, Any] = {}
            if kinds[0] in _STORE_FAQ:
                q = _STORE_FAQ[kinds[0]]
                answer = next(f["a"] for f in self.world.store_faq if f["q"] == q)
                detail = {"question": q, "answer": answer}
            if kinds[0] == "fan_benefits":
                if self.fan is None:
                    return
                campaign = next(
                    c
                    for c in self.world.marketing["coupon_campaigns"]
                    if c["campaign_id"] == self.fan["campaign_id"]
                )
                detail = {"discount": campaign["discount"]}
            yield self._free_instance(t, viewer, detail, None)

    def _free_instance(self, t, viewer, detail, product) -> _Instance:
        screen = self.world.room["lineup"][
            _h("screen", t["id"], viewer) % len(self.world.room["lineup"])
        ]
        fill = {"order": detail.get("order_id", "")}
        comments = tuple(x.format(**fill) for x in (t.get("comments") or [t["text"]]))
        intents = tuple(
            Intent(id=f"i{k}", kind=kind, comment=0, detail=detail)
            for k, kind in enumerate(t["intents"])
        )
        key = f"-/{viewer}" + (f"/{detail['order_id']}" if "order_id" in detail else "")
        return _Instance(comments, intents, screen, product, (viewer,), key)

    # ------------------------------------------------------------------ scenarios
    def scenario(self, family: str, t: Mapping[str, Any], inst: _Instance) -> Scenario | None:
        split = t["split"]
        if inst.product is not None and self.splits[inst.product] != split:
            return None
        comments = tuple(
            hx.Comment(
                text=text,
                viewer_id=v,
                handle=self.world.viewers.get(v, {}).get("handle", v),
                ts=float(k * 4),
            )
            for k, (text, v) in enumerate(zip(inst.comments, inst.viewers))
        )
        intents = tuple(self._resolve(i, inst.viewers[0]) for i in inst.intents)
        where = _intents.Where(self.world, inst.screen, inst.viewers[0])
        parts = [_intents.KINDS[i.kind](i, where) for i in intents]
        if not self._supported(parts):
            return None
        gold, skills, rules = _merge(intents, parts, multi=len(intents) > 1, present=self.skills)
        sid = f"{family}/{t['id']}/{inst.key}"
        history = self._history(sid)
        draft = Scenario(
            id=sid,
            family=family,
            split=split,
            phrasing=t["id"],
            comments=comments,
            product_id=inst.screen,
            gold=gold,
            history=history,
        )
        needs = self._needs(draft, skills, rules)
        return None if needs is None else dataclasses.replace(draft, needs=needs)

    def _supported(self, parts) -> bool:
        """Whether the Harness has every tool the gold calls and a Reply Skill for each intent."""
        harness = self.base.harness
        calls = [c for p in parts for c in p.calls]
        return all(harness.tool(c.tool) is not None for c in calls) and all(
            set(p.reply_skills) & self.skills for p in parts
        )

    def _resolve(self, i: Intent, viewer: str) -> Intent:
        """Fills details that depend on running a tool (which coupon this viewer gets)."""
        if i.kind not in ("coupon", "coupon_product"):
            return i
        args = {"viewer_id": viewer, **({"product_id": i.product_id} if i.product_id else {})}
        try:
            result = Sandbox(self.world).tools["issue_coupon"](args)
        except hx.ToolError:
            result = None
        return dataclasses.replace(i, detail={**i.detail, "result": result})

    def _history(self, sid: str) -> tuple[Mapping[str, Any], ...]:
        n = _h("history", sid) % 4
        return tuple(self.history[:n]) if n < 3 else ()

    def _needs(
        self, s: Scenario, skills: frozenset[str], rules: frozenset[str]
    ) -> hsa.Preserve | None:
        """Runs the teacher's calls against a fault-free sandbox; None if it cannot solve `s`."""
        sandbox, results = Sandbox(self.world), Results()
        room = self.world.room
        context = {
            "viewer_id": s.comments[0].viewer_id,
            "room_id": room["room_id"],
            "now": room["now"],
        }
        for pattern, args in plan_calls(s):
            spec = self.base.harness.tool(pattern.tool)
            try:
                value = sandbox.tools[pattern.tool](
                    {**args, **{k: context[k] for k in spec.context_args}}
                )
            except hx.ToolError as err:
                value = {"error": {"type": err.kind, "message": str(err)}}
            if pattern.tool == "search_products" and not any(
                r["product_id"] == s.gold.intents[0].product_id for r in value["results"]
            ):
                return None
            results.add(pattern.tool, args, value)
        clauses = [clause(i, results, self.world) for i in s.gold.intents]
        if any(c.unavailable for c in clauses):
            return None
        handles = [c.handle for c in s.comments]
        try:
            compose(clauses, handles, max_chars=self.v0[0], max_sentences=self.v0[1])
        except ValueError:
            return None
        compact = join(lead(handles), [c.text(True) for c in clauses], 1)
        n_sent = sentences(compact)
        private = " ".join(c.private for c in clauses if c.private)
        if len(compact) > self.v0[0] or n_sent > self.v0[1] or len(private) > self.v0[0]:
            return None
        return hsa.Preserve(
            skills=skills,
            rules=rules,
            min_rounds=2 + any(c.after for c in s.gold.calls),
            min_reply_chars=max(len(compact), len(private)),
            min_reply_sentences=n_sent,
            min_comment_chars=max(len(c.text) for c in s.comments),
            min_comments=len(s.comments),
        )


def _merge(
    intents, parts, *, multi: bool, present: frozenset[str]
) -> tuple[Gold, frozenset[str], frozenset[str]]:
    """One `Gold` from the intents' parts, plus the Skills the teacher loads and rules it needs.

    Gold Skills are those of the Harness the scenarios are built for (`present`): a Reply
    Skill group keeps its alternatives that Harness has, and a Strategy Skill it lacks (the
    micro room has no multi-intent Skill) is not required, nor are that Skill's rules.
    """
    groups, chosen, allowed = [], [], set()
    for part in parts:
        reply = [s for s in part.reply_skills if s in present]
        group = frozenset(reply)
        if group not in groups:
            groups.append(group)
        if not group & set(chosen):
            chosen.append(reply[0])
        for s in (s for s in part.strategy if s in present):
            if frozenset({s}) not in groups:
                groups.append(frozenset({s}))
            chosen.append(s)
        allowed |= set(part.allowed_skills) & present
    if multi and "multi-intent" in present:
        groups.append(frozenset({"multi-intent"}))
        chosen.append("multi-intent")

    def unique(calls):
        return tuple(dict.fromkeys(calls))

    gold = Gold(
        intents=intents,
        skills=tuple(groups),
        allowed_skills=frozenset(allowed),
        calls=unique(c for p in parts for c in p.calls),
        allowed_calls=unique(c for p in parts for c in p.allowed),
        forbidden_tools=frozenset(t for p in parts for t in p.forbidden),
        facts=tuple(f for p in parts for f in p.facts),
        claims=tuple(c for p in parts for c in p.claims),
        channels=frozenset(ch for p in parts for ch in p.channels)
        if all("none" not in p.channels for p in parts)
        else frozenset({"public", "none"}),
    )
    rules = frozenset(r for p in parts for r in p.rules if r.split("#")[0] in present)
    return gold, frozenset(chosen), rules


def generate_scenarios(
    world: livestream.World,
    *,
    phrasings: str | pathlib.Path | None = None,
    harness: hx.Harness | None = None,
) -> ScenarioSet:
    """Every scenario the templates give for `world`, deterministically (same files, same set).

    Args:
      world: the world the scenarios are about.
      phrasings: the template file (default: Harness v0's, `phrasings_path(world)`).
      harness: the released Harness the scenarios are solved in (default: the world's own,
        Harness v0): gold Skills are its Skills, and a template whose gold needs a tool it does
        not have gives no scenario.
    """
    data = load_phrasings(phrasings or phrasings_path(world))
    harness = harness or hx.load(world.root)
    builder, out, seen = _Builder(world, data, harness), [], set()
    for family in FAMILIES:
        for t in data["families"][family]:
            for inst in builder.instances(family, t):
                s = builder.scenario(family, t, inst)
                if s is not None and s.id not in seen:
                    seen.add(s.id)
                    out.append(s)
    return ScenarioSet(out)


@functools.cache
def default_scenarios(room: str = "v0") -> ScenarioSet:
    """The scenarios of a bundled room (`livestream.room`): generated once per process, and
    once per version of the room's files and this code on the machine (`rl.sim._pool_cache`:
    later processes read the pool from `$HAT_JAX_SCENARIO_CACHE`)."""
    spec = livestream.room(room)

    def build() -> ScenarioSet:
        with _pool_cache.gc_paused():
            return generate_scenarios(
                livestream.load_world(spec.world_dir),
                phrasings=spec.phrasings,
                harness=hx.load(spec.harness_dir),
            )

    dirs = [spec.world_dir, spec.harness_dir, spec.phrasings]
    return _pool_cache.cached(f"room-{room}", dirs, build)
