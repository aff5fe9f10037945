"""General instructions for OPD: the bundled set, the Tulu3 loader, constraint checks, and
the prompt pipeline."""

import json
import logging

import numpy as np
import pytest

import data
from hat_jax import chat_format


def test_bundled_set_is_well_formed_and_its_references_pass():
    instructions = data.load_instructions()
    assert len(instructions) >= 100
    assert len({i.id for i in instructions}) == len(instructions)
    kinds = set()
    for i in instructions:
        assert i.messages[-1]["role"] == "user" and i.constraints
        kinds |= {c["type"] for c in i.constraints}
        if i.reference is not None:
            assert all(data.check_constraints(i.reference, i.constraints)), i.id
    assert kinds == set(data.CONSTRAINT_TYPES)
    assert sum(i.reference is not None for i in instructions) >= 20


@pytest.mark.parametrize(
    "constraint, good, bad",
    [
        ({"type": "max_words", "value": 3}, "one two three", "one two three four"),
        ({"type": "min_words", "value": 3}, "one two three", "one two"),
        ({"type": "max_sentences", "value": 2}, "Hi there. Bye!", "One. Two. Three."),
        ({"type": "num_bullets", "value": 2}, "- a\n- b", "- a\n- b\n- c"),
        ({"type": "num_paragraphs", "value": 2}, "a b\n\nc d", "a b\nc d"),
        ({"type": "include_keywords", "keywords": ["tea", "cup"]}, "A cup of Tea.", "A cup."),
        ({"type": "exclude_words", "words": ["never"]}, "nevertheless fine", "never again"),
        ({"type": "no_commas"}, "no commas here", "one, two"),
        ({"type": "all_lowercase"}, "all lower", "Not lower"),
        ({"type": "all_uppercase"}, "ALL UPPER 1", "NOT Upper"),
        ({"type": "start_with", "phrase": "Here is"}, "here is it", "It is here"),
        ({"type": "end_with", "phrase": "Any other questions?"}, "Ok. Any other questions?", "Ok."),
        ({"type": "json_format"}, '```json\n{"a": 1}\n```', "{a: 1}"),
        ({"type": "quotation"}, '"quoted"', "not quoted"),
        ({"type": "title"}, "<<Title>>\nbody", "<Title>\nbody"),
    ],
)
def test_constraint_checks(constraint, good, bad):
    assert data.check_constraints(good, [constraint]) == [True]
    assert data.check_constraints(bad, [constraint]) == [False]


def test_unknown_or_incomplete_constraints_are_errors():
    with pytest.raises(ValueError, match="unknown constraint type 'rhyme'"):
        data.check_constraints("x", [{"type": "rhyme"}])
    with pytest.raises(ValueError, match="lacks field"):
        data.check_constraints("x", [{"type": "max_words"}])


def test_tulu3_jsonl_loader(tmp_path, caplog):
    lines = [
        {"id": "a", "messages": [{"role": "user", "content": "Hi?"}], "source": "tulu"},
        {
            "id": "b",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a fruit."},
                {"role": "assistant", "content": "Apple."},
            ],
        },
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
        {"id": "bad-role", "messages": [{"role": "robot", "content": "x"}]},
        {"id": "no-user", "messages": [{"role": "assistant", "content": "x"}]},
        {
            "id": "bad-constraint",
            "messages": [{"role": "user", "content": "x"}],
            "constraints": [{}],
        },
    ]
    path = tmp_path / "tulu.jsonl"
    path.write_text("\n".join([json.dumps(x) for x in lines] + ["{broken", ""]) + "\n")
    with caplog.at_level(logging.WARNING):
        out = data.load_instructions(path)
    assert [i.id for i in out] == ["a", "b", "tulu-3"]
    assert out[1].messages[0]["role"] == "system" and out[1].reference == "Apple."
    assert out[0].reference is None and out[0].source == "tulu"
    assert out[1].to_record()["messages"][-1] == {"role": "assistant", "content": "Apple."}
    for n in (4, 5, 6, 7):
        assert f"tulu.jsonl:{n}" in caplog.text
    assert "4 malformed lines" in caplog.text
    with pytest.raises(FileNotFoundError):
        data.load_instructions(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("{broken\n")
    with pytest.raises(ValueError, match="no usable instruction"):
        data.load_instructions(tmp_path / "empty.jsonl")


def _prompts(instructions, tokenizer, **kw):
    kw.setdefault("global_batch_size", 4)
    kw.setdefault("max_prompt_len", 64)
    return data.opd_prompt_data(
        instructions, tokenizer=tokenizer, process_index=0, process_count=1, **kw
    )


def test_opd_prompt_batches(tokenizer):
    instructions = data.load_instructions()
    it = _prompts(instructions, tokenizer, seed=1)
    pad = data.pad_id(tokenizer)
    for _ in range(5):
        batch = next(it)
        assert batch["prompt_ids"].shape == (4, 64) and batch["prompt_ids"].dtype == np.int32
        for ids, n, k in zip(batch["prompt_ids"], batch["prompt_lengths"], batch["index"]):
            expected = chat_format.render_tokens(
                list(instructions[k].messages), tokenizer, add_generation_prompt=True
            ).ids
            assert ids[:n].tolist() == expected and np.all(ids[n:] == pad)
            assert tokenizer.decode(ids[:n].tolist()).endswith(chat_format.generation_prompt())
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(3)]
    resumed = _prompts(instructions, tokenizer, seed=1)
    resumed.set_state(state)
    for a, b in zip(expected, [next(resumed) for _ in range(3)], strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_opd_prompts_too_long_are_dropped_and_counted(tokenizer):
    instructions = data.load_instructions()
    lengths = [
        len(chat_format.render_tokens(list(i.messages), tokenizer, add_generation_prompt=True).ids)
        for i in instructions
    ]
    limit = int(np.median(lengths))
    it = _prompts(instructions, tokenizer, max_prompt_len=limit, num_epochs=1, global_batch_size=1)
    seen = [int(b["index"][0]) for b in it]
    assert sorted(seen) == [k for k, n in enumerate(lengths) if n <= limit]
    assert it.stats()["too_long"] == sum(n > limit for n in lengths)


def test_loose_checks_forgive_a_preamble_a_sign_off_and_markdown_emphasis():
    starts = {"type": "start_with", "phrase": "Dear"}
    response = "Sure, here it is:\nDear friend, thanks.\nHope this helps!"
    assert data.check_constraints(response, [starts]) == [False]
    assert data.check_constraints(response, [starts], loose=True) == [True]
    lower = {"type": "all_lowercase"}
    assert data.check_constraints("**hello** there", [lower], loose=True) == [True]
    never = {"type": "include_keywords", "keywords": ["tea"]}
    assert data.check_constraints("coffee\nmore coffee", [never], loose=True) == [False]


def test_an_empty_response_follows_no_constraint():
    short = [{"type": "max_sentences", "value": 3}, {"type": "max_words", "value": 5}]
    assert data.check_constraints("Fine.", short) == [True, True]
    for blank in ("", "  \n "):
        assert data.check_constraints(blank, short) == [False, False]
        assert data.check_constraints(blank, short, loose=True) == [False, False]


def test_pass_rates_are_ifeval_prompt_and_instruction_level_strict_and_loose():
    words = {"type": "max_words", "value": 3}
    commas = {"type": "no_commas"}
    ends = {"type": "end_with", "phrase": "bye"}
    responses = ["one two", "one, two", "ok bye\n(signed)", "anything"]
    constraints = [[words, commas], [words, commas], [ends], []]  # the last: no constraint
    rates = data.pass_rates(responses, constraints)
    # strict: prompt 1 passes both, prompt 2 one of two, prompt 3 fails (its last line).
    assert rates["prompts"] == 3 and rates["instructions"] == 5
    assert rates["prompt_strict"] == pytest.approx(1 / 3)
    assert rates["instruction_strict"] == pytest.approx(3 / 5)
    # loose: without its last line prompt 3 ends with "bye".
    assert rates["prompt_loose"] == pytest.approx(2 / 3)
    assert rates["instruction_loose"] == pytest.approx(4 / 5)
    with pytest.raises(ValueError, match="2 responses, 1 prompts"):
        data.pass_rates(["a", "b"], [[words]])


def test_prompt_hashes_match_across_formats_and_overlap_is_refused(tmp_path):
    instruction = data.load_instructions()[0]
    text = instruction.messages[-1]["content"]
    ifeval = {"key": 7, "prompt": "  " + text.replace(" ", "  ") + "\n"}
    tulu = {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}]}
    assert data.prompt_hash(instruction) == data.prompt_hash(ifeval) == data.prompt_hash(tulu)
    with pytest.raises(ValueError, match=r"1 training prompt\(s\) are also IFEval prompts.*7"):
        data.check_disjoint([{"key": 7, **ifeval}], [instruction], what="IFEval")
    data.check_disjoint(data.load_instructions()[1:3], [instruction])
    path = tmp_path / "ifeval.jsonl"
    path.write_text(json.dumps(ifeval) + "\n\n" + json.dumps(tulu) + "\n")
    assert len(data.read_prompt_records(path)) == 2
    path.write_text(json.dumps(ifeval) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match="ifeval.jsonl:2: not a prompt record"):
        data.read_prompt_records(path)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        data.read_prompt_records(tmp_path / "empty.jsonl")
