"""T1 Live-Stream QA and T2 Harness-Variant QA: deterministic builds, held-out edits that share
nothing with the training bank, solvability by the scripted teacher, and the scorer on
hand-written replies."""

import collections
import dataclasses
import json
import pathlib
import re

import pytest

from hat_jax import harness as hx
from hat_jax import hsa
from hat_jax.eval import _qa_sets as qa
from hat_jax.eval._items import EvalItem, SetVersionError, read_set, write_set
from hat_jax.eval._kind import EvalContext
from rl import sim

SAMPLE = 156  # 12 per family: every family, large enough to catch a broken edit or scorer
REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ctx() -> EvalContext:
    return EvalContext.default()


@pytest.fixture(scope="module")
def t1(ctx):
    return qa.T1.build(ctx, split="test", size=SAMPLE, seed=0)


@pytest.fixture(scope="module")
def t2(ctx):
    return qa.T2.build(ctx, split="test", size=SAMPLE, seed=0)


def without_hooks(harness: hx.Harness, *names: str) -> hx.Harness:
    """The Harness with some hooks off, so a reply the hook would stop reaches the scorer."""
    hooks = tuple(dataclasses.replace(h, enabled=h.name not in names) for h in harness.hooks.hooks)
    return dataclasses.replace(harness, hooks=dataclasses.replace(harness.hooks, hooks=hooks))


# ------------------------------------------------------------------------------ building
@pytest.mark.parametrize("kind", [qa.T1, qa.T2], ids=["t1", "t2"])
def test_sets_rebuild_byte_identical(ctx, kind, tmp_path):
    a = write_set(tmp_path / "a", kind.build(ctx, split="test", size=40, seed=3))
    b = write_set(tmp_path / "b", kind.build(ctx, split="test", size=40, seed=3))
    for name in ("items.jsonl", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    back = read_set(a)
    assert back.version == kind.build(ctx, split="test", size=40, seed=3).version


@pytest.mark.parametrize("kind", [qa.T1, qa.T2], ids=["t1", "t2"])
def test_version_follows_the_seed(ctx, kind):
    a = kind.build(ctx, split="test", size=26, seed=0)
    b = kind.build(ctx, split="test", size=26, seed=1)
    assert a.version != b.version and [i.id for i in a] != [i.id for i in b]
    assert a.version.startswith(f"{kind.name}-")


def test_items_are_stratified_over_families(ctx, t1, t2):
    small = qa.T1.build(ctx, split="test", size=2 * len(sim.FAMILIES), seed=5)
    assert collections.Counter(i.family for i in small) == {f: 2 for f in sim.FAMILIES}
    for s in (t1, t2):
        counts = collections.Counter(i.family for i in s)
        assert set(counts) == set(sim.FAMILIES) and max(counts.values()) == min(counts.values())
        assert all(sim.Scenario.from_dict(i.scenario).split == "test" for i in s)
    assert [i.id for i in t1] != [i.id for i in t2]  # each set draws its own sample


def test_dev_split_and_size_limits(ctx):
    dev = sim.default_scenarios().split("dev")
    full = qa.T1.build(ctx, split="dev", size=len(dev), seed=0)
    assert full.name == "t1-dev" and {i.id for i in full} == {s.id for s in dev}
    assert all(i.set == "t1-dev" for i in full)
    with pytest.raises(
        ValueError, match=rf"t1: size must be between 1 and the {len(dev)} dev scenarios"
    ):
        qa.T1.build(ctx, split="dev", size=len(dev) + 1, seed=0)
    with pytest.raises(ValueError, match="t2: size must be between 1 and"):
        qa.T2.build(ctx, split="test", size=0, seed=0)
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        qa.T2.build(ctx, split="validation", size=10, seed=0)


def test_t2_manifest_records_the_bank_split(t2):
    banks = t2.manifest()["generator"]["banks"]
    assert banks == {
        "train": qa.bank_hash(hsa.BANK_DIR),
        "heldout": qa.bank_hash(qa.HELDOUT_BANK_DIR),
    }
    assert banks["train"] != banks["heldout"]
    edit = t2[0].harness
    assert edit["edit"] == "heldout" and edit["bank"] == banks["heldout"]
    assert list(edit["dims"]) == sorted(d.value for d in hsa.ALL) and edit["strength"] == 0.5


def test_read_set_names_a_corrupted_item(t1, tmp_path):
    folder = write_set(tmp_path, t1)
    lines = (folder / "items.jsonl").read_text(encoding="utf-8").splitlines()
    victim = json.loads(lines[7])
    victim["scenario"]["comments"][0]["text"] += " and is it cheaper tomorrow?"
    lines[7] = json.dumps(victim, ensure_ascii=False)
    (folder / "items.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SetVersionError, match=re.escape(t1[7].id)):
        read_set(folder)


# ------------------------------------------------------------------------------ held-out edits
def test_t2_prepare_rebuilds_the_recorded_state(ctx, t2):
    item = t2[3]
    prepared = qa.T2.prepare(item, ctx)
    assert prepared.state.harness.version == item.harness["version"] != ctx.harness.version
    assert qa.T2.prepare(item, ctx).state == prepared.state
    moved = EvalItem.from_dict({**item.to_dict(), "harness": {**item.harness, "seed": 12345}})
    with pytest.raises(SetVersionError, match=rf"{re.escape(item.id)} rebuilds Harness"):
        qa.T2.prepare(moved, ctx)
    stale = EvalItem.from_dict({**item.to_dict(), "harness": {**item.harness, "bank": "0" * 64}})
    with pytest.raises(SetVersionError, match="held-out bank"):
        qa.T2.prepare(stale, ctx)
    with pytest.raises(ValueError, match="carries a Harness edit"):
        qa.T1.prepare(dataclasses.replace(item, set="t1"), ctx)


_REF = re.compile(r"\{(tool|skill):([A-Za-z0-9_.\-]+)\}")
_OPAQUE = {
    "tool": re.compile(r"^tool_[0-9a-f]{4}x*$"),
    "skill": re.compile(r"^skill-[0-9a-f]{4}x*$"),
}


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def _name_key(name: str) -> str:
    """Names compared loosely: `grantCoupon` and `grant_coupon` are the same name."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def surface_texts(state: hx.HarnessState) -> set[str]:
    """Every text of a Harness state the policy can read, with placeholders on canonical names
    (so a bank paraphrase is recognised whatever its tools and Skills are called now)."""
    r = state.renames

    def canon(text: str) -> str:
        def back(m):
            name = r.canonical_tool(m[2]) if m[1] == "tool" else r.canonical_skill(m[2])
            return f"{{{m[1]}:{name}}}"

        return _norm(_REF.sub(back, text))

    h, out = state.harness, set()
    for s in h.skills:
        out |= {canon(s.description), canon(s.intro), canon(s.title)}
        out |= {canon(rule.text) for rule in s.rules}
    for t in h.tools:
        out.add(canon(t.description))
        for p in (t.parameters.get("properties") or {}).values():
            if p.get("description"):
                out.add(canon(p["description"]))
    for b in h.prompt.blocks:
        out |= {canon(b.title), *(canon(i) for i in b.items)}
    u = h.prompt.user_message
    out |= {canon(u.header), canon(u.on_screen), canon(u.comment)}
    out |= {canon(x.message) for x in h.hooks.hooks if x.message}
    out |= {canon(h.hooks.envelope), canon(h.hooks.fallback.conservative_reply)}
    return out - {""}


def bank_texts(bank: hsa.Bank) -> set[str]:
    """Every text a bank can put into a Harness."""
    out = {p for v in bank.texts.values() for p in v}
    out |= {t for v in bank.skill_titles.values() for t in v}
    out |= {t for v in bank.block_titles.values() for t in v}
    out |= {*bank.envelopes, *bank.fallback_replies}
    out |= {x for u in bank.user_messages for x in u.values()}
    for s in bank.synthetic:
        out |= {s.description, *s.rules, s.name.replace("-", " ").capitalize()}
    return {_norm(t) for t in out}


def test_t2_edits_share_nothing_with_the_training_bank(ctx, t2):
    train, heldout = hsa.default_bank(), qa.heldout_bank()
    train_texts, heldout_texts = bank_texts(train), bank_texts(heldout)
    train_names = {_name_key(n) for v in train.names.values() for n in v}
    train_names |= {_name_key(s.name) for s in train.synthetic}
    heldout_names = {n for v in heldout.names.values() for n in v}
    synthetic = {s.name for s in heldout.synthetic}
    base_texts = surface_texts(hx.HarnessState(harness=hsa.link_mentions(ctx.harness)))
    renamed, reworded = collections.Counter(), set()
    for item in t2:
        state = qa.T2.prepare(item, ctx).state
        for kind, names in (
            ("tool", state.harness.tool_names),
            ("skill", state.harness.skill_names),
        ):
            canonical = (
                state.renames.canonical_tool if kind == "tool" else state.renames.canonical_skill
            )
            for name in names:
                if name == canonical(name):
                    assert kind == "tool" or name in ctx.harness.skill_names or name in synthetic, (
                        name
                    )
                    continue
                renamed[kind] += 1
                assert _name_key(name) not in train_names, (item.id, name)
                assert name in heldout_names or _OPAQUE[kind].match(name), (item.id, name)
        changed = surface_texts(state) - base_texts
        assert changed, item.id
        for text in changed:
            assert text not in train_texts, (item.id, text)
            assert text in heldout_texts, (item.id, text)  # and it came from the held-out bank
        reworded |= changed
    assert renamed["tool"] >= len(t2) and renamed["skill"] >= len(t2)  # >= 1 of each per item
    assert len(reworded) > 100


def test_heldout_bank_passes_the_bank_checks_and_covers_harness_v0(ctx):
    bank = hsa.load_bank(qa.HELDOUT_BANK_DIR)
    train = hsa.default_bank()
    assert set(bank.texts) == set(train.texts)  # a paraphrase for every text of Harness v0
    for name in ctx.harness.skill_names:
        assert len(bank.names[("skill", name)]) >= 5
    for name in ctx.harness.tool_names:
        assert len(bank.names[("tool", name)]) >= 5
    assert len(bank.envelopes) >= 4 and len(bank.user_messages) >= 4
    assert len(bank.fallback_replies) >= 2 and bank.synthetic


def test_only_t2_loads_the_heldout_bank():
    """Training-time HSA must never see the held-out bank: nothing outside hat_jax/eval names it."""
    offenders = []
    for top in ("hat_jax", "rl", "launch", "data", "configs", "serve"):
        for path in (REPO / top).rglob("*.py"):
            if "eval" in path.relative_to(REPO).parts[:2]:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if "heldout_bank" in text or "HELDOUT_BANK" in text:
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# ------------------------------------------------------------------------------ scoring
@pytest.mark.parametrize("which", ["t1", "t2"])
def test_the_scripted_teacher_scores_one(ctx, t1, t2, which):
    kind, eval_set = (qa.T1, t1) if which == "t1" else (qa.T2, t2)
    for item in eval_set:
        scores = qa.run_teacher(kind, item, ctx)
        assert set(scores) == set(kind.metrics)
        assert scores["accuracy"] == scores["effectiveness"] == scores["avg"] == 1.0, item.id


@pytest.mark.slow
def test_the_scripted_teacher_solves_the_full_test_split(ctx):
    n = len(sim.default_scenarios().split("test"))
    for kind in (qa.T1, qa.T2):
        for item in kind.build(ctx, split="test", size=n, seed=0):
            scores = qa.run_teacher(kind, item, ctx)
            assert scores["accuracy"] == scores["effectiveness"] == 1.0, (kind.name, item.id)


def scripted(prepared, reply: str) -> hx.ScriptedPolicy:
    """Loads the needed Skills, makes the gold calls, then says `reply`."""
    state, s = prepared.state, prepared.scenario
    t = state.surface_tool
    loads = [hx.call(t("load_skill"), name=state.surface_skill(n)) for n in sorted(s.needs.skills)]
    waves = [[], []]
    for pattern, args in sim.plan_calls(s):
        waves[bool(pattern.after)].append(hx.call(t(pattern.tool), **args))
    turns = [hx.AssistantTurn(tool_calls=(*loads, *waves[0]))]
    if waves[1]:
        turns.append(hx.AssistantTurn(tool_calls=tuple(waves[1])))
    turns.append(hx.AssistantTurn(tool_calls=(hx.call(t("reply_public"), text=reply),)))
    return hx.ScriptedPolicy(turns)


def play(kind, item, ctx, reply):
    prepared = kind.prepare(item, ctx)
    traj = hx.run_agent(
        prepared.state,
        prepared.request,
        scripted(prepared, reply),
        prepared.tools,
        limits=ctx.limits,
    )
    return kind.score(item, prepared, traj), kind.rewards(prepared, traj)


def item_with(eval_set, family, kinds):
    for item in eval_set:
        s = sim.Scenario.from_dict(item.scenario)
        facts = s.gold.facts
        if (
            item.family == family
            and tuple(i.kind for i in s.gold.intents) == kinds
            and all(f.source is None and f.kind in ("money", "text") for f in facts)
        ):
            return item, s
    raise LookupError(f"no {family} item with intents {kinds}")


def test_a_wrong_price_gives_accuracy_zero(ctx):
    # The factual-risk hook would refuse the wrong figure; with it off, the reply reaches the scorer.
    loose = dataclasses.replace(ctx, harness=without_hooks(ctx.harness, "factual_risk"))
    full = qa.T1.build(loose, split="test", size=len(sim.default_scenarios().split("test")), seed=0)
    item, s = item_with(full, "price_promotion", ("price",))
    price = s.gold.facts[0].value
    handle = s.comments[0].handle
    right, _ = play(qa.T1, item, loose, f"@{handle}, it is ¥{price} in the live room tonight.")
    assert right["accuracy"] == right["effectiveness"] == right["avg"] == 1.0
    wrong_price = f"{float(price) - 7:g}"
    wrong, rv = play(
        qa.T1, item, loose, f"@{handle}, it is ¥{wrong_price} in the live room tonight."
    )
    assert wrong["accuracy"] == 0.0 and wrong["avg"] == wrong["effectiveness"] / 2
    assert any(wrong_price in d for d in rv.details["accuracy"]), rv.details


def test_a_partly_answered_multi_intent_comment_gives_effectiveness_half(ctx):
    full = qa.T1.build(ctx, split="test", size=len(sim.default_scenarios().split("test")), seed=0)
    item, s = item_with(full, "multi_intent", ("shipping", "price"))
    ship, price = (f.value for f in s.gold.facts)
    handle = s.comments[0].handle
    both, _ = play(qa.T1, item, ctx, f"@{handle}, it ships in {ship} and costs ¥{price} tonight.")
    assert (both["accuracy"], both["effectiveness"], both["avg"]) == (1.0, 1.0, 1.0)
    half, rv = play(qa.T1, item, ctx, f"@{handle}, it costs ¥{price} tonight.")
    assert (half["accuracy"], half["effectiveness"], half["avg"]) == (1.0, 0.5, 0.75), rv.details
    none, _ = play(qa.T1, item, ctx, f"@{handle}, thanks for asking, great choice!")
    assert none["effectiveness"] == 0.0


def test_score_rejects_what_it_cannot_score(ctx, t1):
    prepared = qa.T1.prepare(t1[0], ctx)
    with pytest.raises(TypeError, match="scores agent trajectories"):
        qa.T1.score(t1[0], prepared, hx.AssistantTurn(content="hi"))
