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
