"""`data._general`: the base stage's general-instruction corpus: every answer satisfies its
constraints, topics are disjoint between splits and from every evaluation and OPD prompt, the
reasoning line, impossible prompts, the files and their reuse."""

import json
import random

import pytest

from data import _general as gen
from data import _instructions as ins
from hat_jax.eval import _general as eval_general


@pytest.fixture(scope="module")
def train():
    return gen.generate("train", 400, seed=0)


def test_every_answer_satisfies_its_constraints(train):
    records, summary = train
    dev, _ = gen.generate("dev", 120, seed=0)
    for r in records + dev:
        user, reply = r["messages"]
        assert user["role"] == "user" and reply["role"] == "assistant"
        constraints = [ins.validate_constraint(c) for c in r["constraints"]]
        assert all(ins.check_constraints(reply["content"], constraints)), r
        assert all(ins.check_constraints(reply["content"], constraints, loose=True)), r
    assert summary["records"] == len(records) == 400
    assert set(summary["constraints"]) == set(ins.CONSTRAINT_TYPES)  # every type is taught
    assert len({r["messages"][0]["content"] for r in records}) == len(records)


def test_half_the_answers_carry_a_plan_of_their_constraints(train):
    records, _ = train
    planned = [r for r in records if "reasoning_content" in r["messages"][1]]
    assert 0.4 < len(planned) / len(records) < 0.6
    for r in planned:
        assert r["messages"][1]["reasoning_content"] == gen.plan(r["constraints"])
    assert gen.plan([]) == "No format constraints."
    assert gen.plan([
        {"type": "max_words", "value": 30},
        {"type": "include_keywords", "keywords": ["heat", "air"]},
        {"type": "start_with", "phrase": "In short"},
    ]) == 'Constraints: at most 30 words; use "heat" and "air"; start with "In short".'  # fmt: skip


def test_topics_are_disjoint_between_splits_and_from_the_evaluation(train):
    records, _ = train
    train_topics = {t.task for t in gen.split_topics("train")}
    dev_topics = {t.task for t in gen.split_topics("dev")}
    assert train_topics and dev_topics and not train_topics & dev_topics
    assert {r["topic"] for r in records} <= train_topics
    assert not (train_topics | dev_topics) & {task for task, _ in eval_general.TASKS}
    opd = ins.load_instructions()
    opd_tasks = {i.messages[-1]["content"].split(".")[0] for i in opd}
    assert not {t.split(".")[0] for t in train_topics | dev_topics} & opd_tasks
    dev, _ = gen.generate("dev", 120, seed=0)
    for split in ("test", "dev"):  # no prompt is an evaluation prompt, nor an OPD one
        ins.check_disjoint(records + dev, eval_general.generate(split, 40, seed=0))
    ins.check_disjoint(records + dev, opd)
    with pytest.raises(ValueError, match="splits \\('train', 'dev'\\), not 'test'"):
        gen.split_topics("test")


def test_the_responder_on_hand_picked_constraints():
    topic = gen.load_topics()[0]  # bicycle gears
    rng = random.Random(0)
    content_word = "chain"
    assert any(content_word in s for s in topic.sentences)
    for constraints in (
        [{"type": "exclude_words", "words": [content_word]}, {"type": "min_words", "value": 40}],
        [{"type": "num_paragraphs", "value": 3}, {"type": "title"},
         {"type": "start_with", "phrase": "In short"}],
        [{"type": "num_bullets", "value": 4}, {"type": "end_with", "phrase": "That is all."},
         {"type": "all_lowercase"}],
        [{"type": "json_format"}, {"type": "all_uppercase"}, {"type": "no_commas"}],
        [{"type": "include_keywords", "keywords": list(topic.keywords)},
         {"type": "max_sentences", "value": 2}],
    ):  # fmt: skip
        answer = gen.respond(topic, constraints, rng)
        assert answer is not None and all(ins.check_constraints(answer, constraints)), answer
    assert content_word not in gen.respond(
        topic, [{"type": "exclude_words", "words": [content_word]}], rng
    )
    # Five bullets do not fit in ten words: no answer, and `generate` redraws such prompts.
    impossible = [{"type": "num_bullets", "value": 5}, {"type": "max_words", "value": 10}]
    assert gen.respond(topic, impossible, rng) is None


def test_the_corpus_is_seeded():
    a, _ = gen.generate("train", 50, seed=0)
    b, _ = gen.generate("train", 50, seed=0)
    c, _ = gen.generate("train", 50, seed=1)
    assert a == b and a != c


def test_files_are_written_once_and_rewritten_when_the_config_changes(tmp_path):
    out = tmp_path / "corpus"
    first = gen.write_general_corpus(out, train=30, dev=10, seed=0)
    assert set(first) == {"train", "dev"}
    lines = (out / "train.jsonl").read_text().splitlines()
    assert len(lines) == 30 and json.loads(lines[0])["source"] == gen.SCHEMA
    manifest = json.loads((out / "train.manifest.json").read_text())
    assert manifest["config"] == {"states": "general", "split": "train", "size": 30, "seed": 0}
    assert 0 <= manifest["floor"]["prompt_strict"] < 0.5  # ignoring instructions scores low
    stamp = (out / "train.jsonl").stat().st_mtime_ns
    assert gen.write_general_corpus(out, train=30, dev=10, seed=0) == first
    assert (out / "train.jsonl").stat().st_mtime_ns == stamp  # complete: kept
    gen.write_general_corpus(out, train=30, dev=0, seed=1)
    assert (out / "train.jsonl").read_text().splitlines() != lines  # another seed: rewritten


def test_a_topic_bank_the_responder_cannot_use_is_refused_by_name(tmp_path):
    bank = [{"task": "Explain tides.", "title": "Tides", "keywords": ["moon", "sea"],
             "sentences": ["The moon pulls the sea, twice a day."] * 5}]  # fmt: skip
    path = tmp_path / "topics.json"
    path.write_text(json.dumps(bank))
    with pytest.raises(ValueError, match="topic 'Explain tides.'"):
        gen.load_topics(str(path))
