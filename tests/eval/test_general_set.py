"""The general instruction set: generation, disjointness from the OPD prompts, scoring."""

import random

import pytest

from data import _general as general_corpus
from data import _instructions as ins
from hat_jax import harness as hx
from hat_jax.eval import _general
from hat_jax.eval._general import GENERAL
from hat_jax.eval._items import EvalItem, write_set
from hat_jax.eval._kind import EvalContext


@pytest.fixture(scope="module")
def ctx() -> EvalContext:
    return EvalContext.default()


@pytest.fixture(scope="module")
def built(ctx):
    return GENERAL.build(ctx, split="test", size=120, seed=0)


def item(constraints, text="Describe a kite.") -> EvalItem:
    prompt = {"messages": [{"role": "user", "content": text}], "constraints": constraints}
    return EvalItem(id="g-1", set="general", family=constraints[0]["type"], prompt=prompt,
                    expect={"constraints": len(constraints)})  # fmt: skip


def score(ctx, it, text):
    prepared = GENERAL.prepare(it, ctx)
    turn = hx.ScriptedPolicy([hx.AssistantTurn(content=text)]).generate(prepared.messages, [])
    return GENERAL.score(it, prepared, turn)


def satisfy(task: str, constraints, keywords) -> str:
    """A response meeting every constraint of one generated prompt: the base corpus's
    responder (itself checked by the scorer) on a topic of ten short sentences using the keywords."""
    numbers = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    sentences = tuple(f"Point {n} covers {keywords[0]} and {keywords[1]} for anyone."
                      for n in numbers)  # fmt: skip
    topic = general_corpus.Topic(task, "A short title", tuple(keywords), sentences)
    answer = general_corpus.respond(topic, constraints, random.Random(0))
    assert answer is not None, (task, constraints)
    return answer


def test_build_is_deterministic_and_versioned_by_seed(ctx, built, tmp_path):
    again = GENERAL.build(ctx, split="test", size=120, seed=0)
    a, b = write_set(tmp_path / "a", built), write_set(tmp_path / "b", again)
    for name in ("items.jsonl", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert GENERAL.build(ctx, split="test", size=120, seed=1).version != built.version
    assert built.name == "general" and len(built) == 120


def test_items_are_short_valid_and_compatible(built):
    seen = set()
    for it in built:
        text = it.prompt["messages"][0]["content"]
        assert len(text.split()) < _general.MAX_WORDS and text not in seen
        seen.add(text)
        constraints = it.prompt["constraints"]
        assert 1 <= len(constraints) <= 3 and it.expect["constraints"] == len(constraints)
        assert it.family == constraints[0]["type"] and not it.agent and it.scenario is None
        types = [c["type"] for c in constraints]
        assert len(set(types)) == len(types)
        assert all(ins.validate_constraint(c) for c in constraints)
        assert not any(frozenset((a, b)) in ins.CONFLICTS for a in types for b in types)
    assert {it.family for it in built} == set(ins.CONSTRAINT_TYPES)


def test_every_generated_prompt_is_satisfiable(ctx, built):
    for it in built:
        task = it.prompt["messages"][0]["content"]
        keywords = next(k for t, k in _general.TASKS if task.startswith(t))
        answer = satisfy(task, it.prompt["constraints"], keywords)
        assert score(ctx, it, answer)["strict_prompt"] == 1.0, (task, answer)


def test_disjoint_from_the_opd_prompts_and_between_splits(ctx, built, monkeypatch):
    demo = ins.load_instructions()
    ins.check_disjoint(demo, [it.prompt for it in built])
    dev = GENERAL.build(ctx, split="dev", size=60, seed=0)
    assert dev.name == "general-dev"
    assert not {ins.prompt_hash(i.prompt) for i in dev} & {ins.prompt_hash(i.prompt) for i in built}
    clash = ins.Instruction(id="opd-x", messages=tuple(built[0].prompt["messages"]))
    monkeypatch.setattr(ins, "load_instructions", lambda path=None: [*demo, clash])
    with pytest.raises(ValueError, match="overlap the OPD prompts.*opd-x"):
        GENERAL.build(ctx, split="test", size=120, seed=0)


def test_train_split_is_refused(ctx):
    with pytest.raises(ValueError, match="test and dev splits"):
        GENERAL.build(ctx, split="train", size=5, seed=0)


def test_prepare_gives_the_prompt_and_the_released_harness(ctx, built):
    prepared = GENERAL.prepare(built[0], ctx)
    assert prepared.messages == [dict(m) for m in built[0].prompt["messages"]]
    assert prepared.state.harness is ctx.harness and prepared.request is None


def test_scores_strict_loose_prompt_and_instruction(ctx):
    it = item([{"type": "all_lowercase"}, {"type": "max_words", "value": 12},
               {"type": "include_keywords", "keywords": ["wind", "string"]}])  # fmt: skip
    good = "a kite rides the wind on a long string."
    assert score(ctx, it, good) == {"strict_prompt": 1.0, "loose_prompt": 1.0,
                                    "strict_instruction": 1.0, "loose_instruction": 1.0,
                                    "avg": 1.0}  # fmt: skip
    missing = score(ctx, it, "a kite rides the wind high above the park.")
    assert missing["strict_prompt"] == 0.0 and missing["avg"] == 0.0
    assert missing["strict_instruction"] == pytest.approx(2 / 3)
    # A leading "Sure:" line breaks lower case strictly; IFEval's loose variants drop it.
    lead = score(ctx, it, "Sure:\n" + good)
    assert lead["strict_prompt"] == 0.0 and lead["strict_instruction"] == pytest.approx(2 / 3)
    assert lead["loose_prompt"] == 1.0 and lead["loose_instruction"] == 1.0


def test_score_needs_an_assistant_turn(ctx):
    it = item([{"type": "no_commas"}])
    with pytest.raises(TypeError, match="AssistantTurn"):
        GENERAL.score(it, GENERAL.prepare(it, ctx), "plain text")
