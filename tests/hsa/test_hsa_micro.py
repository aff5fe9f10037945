"""The training bank knows the micro room's Harness: its Skills and tools share Harness v0's names
but are worded anew, so the bank holds a reviewed paraphrase of every micro text (a list of
entries per field: v0's wording, then the micro room's) and HSA rewords the micro Harness, not
only reorders, masks and renames it."""

import re
import shutil

import pytest
import yaml

from hat_jax import harness as hx
from hat_jax import hsa
from tests.hsa.test_hsa_bank import live_texts

_REF = re.compile(r"\{(tool|skill):([A-Za-z0-9_.\-]+)\}")

# What each text dimension may reword: (kind, text) pairs of a Harness.
REWORDED = {
    hsa.Dim.SKILL_CONTENT: lambda h: (
        {("skill.rule", r.text) for s in h.skills for r in s.rules}
        | {("skill.intro", s.intro) for s in h.skills if s.intro}
    ),
    hsa.Dim.TOOL_DEF: lambda h: {("tool.description", t.description) for t in h.tools},
    hsa.Dim.SYSTEM_PROMPT: lambda h: {("prompt.item", i) for b in h.prompt.blocks for i in b.items},
}


def _canonical(state: hx.HarnessState, text: str) -> str:
    """`text` with its placeholders on canonical names and whitespace normalised."""
    r = state.renames

    def back(m):
        name = r.canonical_tool(m[2]) if m[1] == "tool" else r.canonical_skill(m[2])
        return f"{{{m[1]}:{name}}}"

    return " ".join(_REF.sub(back, text).split())


def test_every_text_of_the_micro_harness_has_a_training_paraphrase(micro):
    bank = hsa.default_bank()
    texts = live_texts(micro)
    assert len(texts) >= 40  # Skills, tools, prompt items and the Hook messages
    missing = sorted(t for t in texts if not bank.paraphrases(*t))
    assert missing == []
    for kind, text in texts:
        for p in bank.paraphrases(kind, text):
            assert p != text and hsa._bank.markers(p) == hsa._bank.markers(text), (text, p)


def test_micro_and_v0_wordings_of_one_skill_are_both_reviewed(base, micro):
    bank = hsa.default_bank()
    for h in (base, micro):
        skill = hsa.link_mentions(h).skill("product-qa")
        assert bank.paraphrases("skill.description", skill.description)
        assert bank.paraphrases("skill.rule", skill.rules[0].text)
        assert bank.paraphrases("tool.description", h.tool("check_inventory").description)
    assert base.skill("product-qa").rules[0].text != micro.skill("product-qa").rules[0].text


@pytest.mark.parametrize("dim", list(REWORDED), ids=[d.value for d in REWORDED])
def test_augmenting_the_micro_harness_rewords_its_texts(micro, dim):
    bank = hsa.default_bank()
    base = hx.HarnessState(harness=hsa.link_mentions(micro))
    before = REWORDED[dim](base.harness)
    paraphrases = {(k, p) for k, t in before for p in bank.paraphrases(k, t)}
    reworded = set()
    for seed in range(6):
        state = hsa.augment(micro, seed=seed, dims={dim})
        after = {(k, _canonical(state, t)) for k, t in REWORDED[dim](state.harness)}
        new = after - {(k, " ".join(t.split())) for k, t in before}
        assert new <= paraphrases, (seed, new - paraphrases)  # every new wording is reviewed
        reworded |= new
    assert reworded, f"{dim.value} never reworded a micro text in 6 seeds"


def test_a_bad_micro_paraphrase_is_named_by_its_entry(tmp_path):
    dest = tmp_path / "bank"
    shutil.copytree(hsa.BANK_DIR, dest)
    path = dest / "skills.yaml"
    data = yaml.safe_load(path.read_text())
    data["product-qa"]["rules"]["1"][1]["paraphrases"][0] = "Prices only from the price tool."
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    with pytest.raises(hsa.BankError, match=r"product-qa#1\[1\]\.paraphrases\[0\]: placeholders"):
        hsa.load_bank(dest)
