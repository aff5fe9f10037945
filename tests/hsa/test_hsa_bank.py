"""The bundled paraphrase bank: reviewed against Harness v0 and the micro room's Harness, checked
on load."""

import shutil

import pytest
import yaml

from hat_jax import hsa
from hat_jax.hsa import link_mentions


def live_texts(harness):
    h = link_mentions(harness)
    out = set()
    norm = lambda t: " ".join(t.split())
    for s in h.skills:
        out |= {("skill.description", norm(s.description)), ("skill.intro", norm(s.intro))}
        out |= {("skill.rule", norm(r.text)) for r in s.rules}
    for t in h.tools:
        out.add(("tool.description", norm(t.description)))
        for p in t.parameters.get("properties", {}).values():
            if p.get("description"):
                out.add(("tool.parameter", norm(p["description"])))
    out |= {("prompt.item", norm(i)) for b in h.prompt.blocks for i in b.items}
    out |= {("hook.message", norm(r.message)) for r in h.hooks.hooks if r.message}
    return {(kind, text) for kind, text in out if text}  # an empty intro has nothing to reword


def test_bank_covers_exactly_the_texts_of_the_released_harnesses(base, micro):
    bank = hsa.default_bank()
    live = live_texts(base) | live_texts(micro)
    assert set(bank.texts) == live  # nothing stale, nothing missing
    assert all(len(p) >= 2 for p in bank.texts.values())


def test_every_module_has_alternative_names(base):
    bank = hsa.default_bank()
    for name in base.skill_names:
        assert len(bank.names[("skill", name)]) >= 5
    for name in base.tool_names:
        assert len(bank.names[("tool", name)]) >= 5
    assert len(bank.envelopes) >= 4 and len(bank.user_messages) >= 4


def test_bank_rewriter_is_deterministic_and_falls_back(base):
    import random

    rw = hsa.BankRewriter()
    text = base.skill("product-qa").rules[0].text
    a = rw.rewrite("skill.rule", text, random.Random(1))
    assert a == rw.rewrite("skill.rule", text, random.Random(1)) and a != text
    assert rw.rewrite("skill.rule", "An edited rule nobody reviewed.", random.Random(1)) == (
        "An edited rule nobody reviewed."
    )
    with pytest.raises(ValueError, match="unknown text kind"):
        rw.rewrite("skill.name", text, random.Random(1))


@pytest.fixture
def bank_copy(tmp_path):
    dest = tmp_path / "bank"
    shutil.copytree(hsa.BANK_DIR, dest)
    return dest


def edit(path, fn):
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))


def test_a_paraphrase_that_drops_a_placeholder_is_rejected(bank_copy):
    def drop(data):
        data["product-qa"]["rules"]["4"]["paraphrases"][0] = "Find the product first."

    edit(bank_copy / "skills.yaml", drop)
    with pytest.raises(
        hsa.BankError, match=r"skills.yaml: product-qa#4.paraphrases\[0\]: placeholders"
    ):
        hsa.load_bank(bank_copy)


def test_duplicate_and_reserved_names_are_rejected(bank_copy):
    def clash(data):
        data["tools"]["check_inventory"]["names"].append("price_lookup")
        data["tools"]["search_faq"]["names"].append("get_product_detail")

    edit(bank_copy / "tools.yaml", clash)
    with pytest.raises(hsa.BankError) as err:
        hsa.load_bank(bank_copy)
    assert "'price_lookup' is offered for" in str(err.value)
    assert "'get_product_detail' is reserved" in str(err.value)


def test_format_fields_of_hook_messages_are_checked(bank_copy):
    def bad(data):
        data["messages"]["reply_length"]["paraphrases"][0] = "Too long ({length}). Shorten it."

    edit(bank_copy / "hooks.yaml", bad)
    with pytest.raises(hsa.BankError, match="messages.reply_length.paraphrases"):
        hsa.load_bank(bank_copy)
