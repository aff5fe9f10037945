"""`data._lookup`: the base corpus's in-context lookup items (answers copied from the prompt),
and their share of the general corpus: every answer is found in its prompt as the item says,
the kinds alternate, nothing comes from the live-room data, the mix is seeded."""

import json
import re

import pytest

from data import _general as gen
from data import _lookup as lookup

LIVESTREAM = gen.TOPICS_PATH.parents[1] / "livestream"


@pytest.fixture(scope="module")
def items():
    return lookup.generate("train", 200, seed=0)


def test_every_answer_is_copied_from_its_prompt(items):
    for r in items:
        user, reply = r["messages"]
        prompt, answer = user["content"], reply["content"]
        assert answer == r["answer"]
        if r["kind"] == "repeat":
            assert prompt.endswith(" " + answer)
        elif r["kind"] == "table":
            rows = [line[2:].split(" | ") for line in prompt.splitlines() if line.startswith("- ")]
            question = prompt.splitlines()[-1]
            (row,) = [row for row in rows if any(cell in question for cell in row)]
            cells = {"name": row[0], "code": row[1].removeprefix("code "), "price": row[2]}
            field = re.search(r"Answer with the (\w+) only", question).group(1)
            assert answer == cells[field], r
        elif r["kind"] == "function":
            listed = dict(line[2:].split(": ", 1) for line in prompt.splitlines()
                          if line.startswith("- "))  # fmt: skip
            assert answer in listed, r
            ((_, _, what, ask),) = [job for job in lookup._JOBS if job[2] == listed[answer]]
            assert f"would you call {ask}?" in prompt
        else:
            handle = re.search(r"@(\S+):", prompt).group(1)
            name = re.search(r"the (.+?) (still|again|ship)", prompt) or re.search(
                r"is the (.+)\?", prompt
            )
            assert f"@{handle}" in answer and name.group(1) in answer, r


def test_kinds_alternate_and_half_carry_a_reasoning(items):
    assert [r["kind"] for r in items[:8]] == list(lookup.KINDS) * 2
    reasoned = [r for r in items if "reasoning_content" in r["messages"][1]]
    assert 0.35 < len(reasoned) / len(items) < 0.65
    for r in reasoned:
        if r["kind"] in ("table", "function"):
            assert r["answer"] in r["messages"][1]["reasoning_content"]


def test_arbitrary_and_meaningful_function_names_both_occur(items):
    names = [r["answer"] for r in items if r["kind"] == "function"]
    meaningful = {f"{verb}_{obj}" for verb, obj, _, _ in lookup._JOBS}
    assert any(n in meaningful for n in names) and any(n not in meaningful for n in names)


def test_no_name_comes_from_the_live_room_data(items):
    text = " ".join(r["messages"][0]["content"] for r in items)
    catalog = json.loads((LIVESTREAM / "catalog.json").read_text())
    viewers = json.loads((LIVESTREAM / "viewers.json").read_text())
    for p in catalog["products"]:
        assert p["id"] not in text and p["name"] not in text
    for v in viewers["viewers"]:
        assert f"@{v['handle']}:" not in text


def test_the_general_corpus_mixes_them_in_at_its_share():
    records, summary = gen.generate("train", 200, seed=0, lookup_share=0.25)
    kinds = [r.get("kind") for r in records]
    assert len(records) == summary["records"] == 200
    assert sum(k is not None for k in kinds) == 50 == sum(summary["lookup"].values())
    assert set(summary["lookup"]) == set(lookup.KINDS)
    assert kinds[:50].count(None) not in (0, 50)  # shuffled among the instructions
    again, _ = gen.generate("train", 200, seed=0, lookup_share=0.25)
    assert again == records
    plain, plain_summary = gen.generate("train", 200, seed=0)
    assert "lookup" not in plain_summary and all("kind" not in r for r in plain)
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="lookup_share must be in \\[0, 1\\)"):
            gen.generate("train", 10, lookup_share=share)


def test_the_share_is_part_of_the_written_corpus_config(tmp_path):
    out = tmp_path / "corpus"
    gen.write_general_corpus(out, train=40, dev=8, seed=0)
    before = (out / "train.jsonl").read_text()
    manifests = gen.write_general_corpus(out, train=40, dev=8, seed=0, lookup_share=0.5)
    assert manifests["train"]["config"]["lookup_share"] == 0.5
    assert manifests["dev"]["lookup"] and (out / "train.jsonl").read_text() != before
    lines = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert sum(r["source"] == lookup.SCHEMA for r in lines) == 20
