"""Teacher-forced tool choice (`hat_jax.eval.tool_choice`): where the calls are, how they are
scored, and that the model wrapper's padding changes no logit."""

import jax
import numpy as np
import pytest
from flax import nnx

import data
import models
from data.tokenizer import load_tokenizer
from hat_jax import chat_format
from hat_jax import eval as hev
from hat_jax.eval import _decisions

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
    for name in ("load_skill", "search_products", "reply_public")
]


def _call(function, i, **arguments):
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": function, "arguments": arguments},
    }


def _conversation(cid="a", prompt_call=False):
    """Turn 1: load_skill then search_products; turn 2: reply_public. With `prompt_call`, an
    earlier untrained (weight 0) turn also calls reply_public."""
    msgs = [
        {"role": "system", "content": "You host a live room."},
        {"role": "user", "content": "Does the red lipstick come in a smaller size?"},
    ]
    if prompt_call:
        msgs += [
            {
                "role": "assistant",
                "content": "",
                "weight": 0,
                "reasoning_content": "too early",
                "tool_calls": [_call("reply_public", 0, x="hm")],
            },  # fmt: skip
            {"role": "tool", "content": '{"error": "no Skill loaded"}'},
        ]
    msgs += [
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Load product-qa; call search_products.",
            "tool_calls": [_call("load_skill", 1, x="product-qa"), _call("search_products", 2)],
        },
        {"role": "tool", "content": "Skill loaded."},
        {"role": "tool", "content": '{"products": ["lip-01"]}'},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Answer.",
            "tool_calls": [_call("reply_public", 3, x="Yes, a 2g mini.")],
        },
    ]
    return data.Conversation(id=cid, messages=msgs, tools=TOOLS)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _rows(conv, tokenizer):
    out = []
    for row in data.split_rows(conv):
        rendered = chat_format.render_tokens(row.messages, tokenizer, row.tools)
        enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
        out.append((rendered, list(enc["offset_mapping"])))
    return out


def test_call_sites_find_trained_calls_by_turn_and_place(tokenizer):
    ((rendered, offsets),) = _rows(_conversation(prompt_call=True), tokenizer)
    sites = _decisions.call_sites(rendered.text, offsets, rendered.loss_mask)
    # the weight-0 turn's reply_public is context, not a trained call
    assert [(s.name, s.turn, s.index) for s in sites] == [
        ("load_skill", 2, 0), ("search_products", 2, 1), ("reply_public", 3, 0)
    ]  # fmt: skip
    for site in sites:
        spelled = tokenizer.decode([rendered.ids[i] for i in site.tokens])
        assert spelled.lstrip("=") == site.name
        assert all(rendered.loss_mask[i] for i in site.tokens)
    # "Load product-qa; call search_products.": that name is first written in the reasoning,
    # before its call; load_skill and reply_public are not named there
    assert [s.in_reasoning for s in sites] == [False, True, False]
    search = sites[1]
    assert search.decision[-1] < search.tokens[0]
    assert tokenizer.decode([rendered.ids[i] for i in search.decision]).strip() == "search_products"
    assert all(rendered.loss_mask[i] for i in search.decision)
    assert sites[0].decision == sites[0].tokens and sites[2].decision == sites[2].tokens
    with pytest.raises(ValueError, match="differ"):
        _decisions.call_sites(rendered.text, offsets[:-1], rendered.loss_mask)


def search_first_mention(rendered, offsets):
    """The first token of "search_products" in the reasoning of the conversation's row."""
    sites = _decisions.call_sites(rendered.text, offsets, rendered.loss_mask)
    return next(s.decision[0] for s in sites if s.in_reasoning)


def _oracle(wrong_names=(), tokenizer=None, guess=None, wrong_at=None):
    """Predicts each next token, except at the name tokens of `wrong_names`, and at row
    position `wrong_at`, where it predicts `guess`."""

    def greedy_fn(ids):
        ids = ids[0]
        predicted = np.zeros((1, len(ids)), np.int32)
        predicted[0, :-1] = ids[1:]
        if wrong_at is not None:
            predicted[0, wrong_at - 1] = guess
        if wrong_names:
            text = tokenizer.decode(ids.tolist())
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            mask = [1] * len(ids)
            for site in _decisions.call_sites(text, list(enc["offset_mapping"]), mask):
                if site.name in wrong_names:
                    predicted[0, site.tokens[0] - 1] = guess
        return predicted

    return greedy_fn


def test_tool_choice_scores_by_name_turn_and_place(tokenizer):
    convs = [_conversation("a"), _conversation("b")]
    perfect = hev.tool_choice(_oracle(), convs, tokenizer)
    assert (perfect["calls"], perfect["right"], perfect["accuracy"]) == (6, 6, 1.0)
    assert perfect["confusions"] == [] and perfect["rows"] == 2

    ((rendered, offsets),) = _rows(convs[0], tokenizer)
    load = _decisions.call_sites(rendered.text, offsets, rendered.loss_mask)[0]
    guess = rendered.ids[load.tokens[0]]  # the first token of "load_skill"
    report = hev.tool_choice(_oracle({"reply_public"}, tokenizer, guess), convs, tokenizer)
    assert (report["calls"], report["right"]) == (6, 4)
    assert report["by_name"]["reply_public"] == {"calls": 2, "right": 0, "accuracy": 0.0}
    assert report["by_name"]["load_skill"]["accuracy"] == 1.0
    assert report["by_turn"] == {
        "1": {"calls": 4, "right": 4, "accuracy": 1.0},
        "2": {"calls": 2, "right": 0, "accuracy": 0.0},
    }
    assert report["by_index"]["later"] == {"calls": 2, "right": 2, "accuracy": 1.0}
    (confusion,) = report["confusions"]
    assert confusion["gold"] == "reply_public" and confusion["count"] == 2
    assert "load" in confusion["predicted"]
    text = hev.format_tool_choice(report)
    assert "reply_public" in text and "4/6" in text

    assert report["reasoned"] == {"calls": 2, "right": 2, "accuracy": 1.0, "right_at_call": 2}

    # right at every call, wrong where the reasoning first names search_products: a policy
    # that copies the name it was given but would not have written it
    mention = search_first_mention(rendered, offsets)
    copier = hev.tool_choice(_oracle(wrong_at=mention, guess=guess), convs, tokenizer)
    assert (copier["calls"], copier["right"]) == (6, 6)
    assert copier["reasoned"] == {"calls": 2, "right": 0, "accuracy": 0.0, "right_at_call": 2}
    assert "named first in the reasoning" in hev.format_tool_choice(copier)

    skipped = hev.tool_choice(_oracle(), convs, tokenizer, max_len=10)
    assert skipped["calls"] == 0 and skipped["skipped_rows"] == 2


def test_skill_sites_find_the_skill_each_trained_load_names(tokenizer):
    ((rendered, offsets),) = _rows(_conversation(prompt_call=True), tokenizer)
    (site,) = _decisions.skill_sites(rendered.text, offsets, rendered.loss_mask)
    assert (site.skill, site.turn) == ("product-qa", 2)
    spell = lambda idx: tokenizer.decode([rendered.ids[i] for i in idx]).strip()  # noqa: E731
    assert spell(site.tokens) == "product-qa"
    # "Load product-qa; call search_products.": chosen where the reasoning first writes it
    assert site.decision[-1] < site.tokens[0] and spell(site.decision) == "product-qa"
    assert all(rendered.loss_mask[i] for i in site.decision + site.tokens)
    # a load whose turn's reasoning does not name the Skill is scored at its argument; an
    # untrained (weight 0) turn's load is context
    conv = _conversation()
    conv.messages[2]["reasoning_content"] = "Greet them."
    conv.messages[2]["tool_calls"][0]["function"]["arguments"] = {"x": "chit-chat"}
    conv.messages.insert(2, {"role": "assistant", "content": "", "weight": 0, "reasoning_content": "x",
                             "tool_calls": [_call("load_skill", 0, x="general-reply")]})  # fmt: skip
    conv.messages.insert(3, {"role": "tool", "content": "Skill loaded."})
    ((rendered, offsets),) = _rows(conv, tokenizer)
    (site,) = _decisions.skill_sites(rendered.text, offsets, rendered.loss_mask)
    assert site.skill == "chit-chat" and site.decision == site.tokens
    assert _decisions.skill_sites(rendered.text, offsets, rendered.loss_mask, loader="x") == []
    with pytest.raises(ValueError, match="differ"):
        _decisions.skill_sites(rendered.text, offsets[:-1], rendered.loss_mask)


def _tool(name, *params):
    properties = {p: {"type": "string"} for p in params}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"properties": properties}},
    }


def test_skill_loader_is_load_skill_or_its_renamed_surface():
    assert _decisions.skill_loader(TOOLS) == "load_skill"
    renamed = [_tool("find", "query"), _tool("use_skill", "name"), _tool("say", "text")]
    assert _decisions.skill_loader(renamed) == "use_skill"
    # two tools take only `name`: which loads Skills is not known, so the default name
    assert _decisions.skill_loader(renamed + [_tool("greet", "name")]) == "load_skill"
    assert _decisions.skill_loader(None) == "load_skill"


def test_tool_choice_finds_the_skill_of_a_renamed_loader(tokenizer):
    messages = _conversation().messages
    messages[2]["tool_calls"][0] = _call("use_skill", 1, name="product-qa")
    tools = [_tool("use_skill", "name"), _tool("search_products", "x"), _tool("say", "x")]
    conv = data.Conversation(id="renamed", messages=messages, tools=tools)
    skills = hev.tool_choice(_oracle(), [conv], tokenizer)["skills"]
    assert (skills["calls"], skills["right"]) == (1, 1)
    assert list(skills["by_skill"]) == ["product-qa"]


def test_tool_choice_scores_the_skill_where_it_is_chosen(tokenizer):
    convs = [_conversation("a"), _conversation("b")]
    perfect = hev.tool_choice(_oracle(), convs, tokenizer)["skills"]
    assert (perfect["calls"], perfect["right"], perfect["right_at_argument"]) == (2, 2, 2)
    assert perfect["by_skill"] == {"product-qa": {"calls": 2, "right": 2, "accuracy": 1.0}}

    # wrong where the reasoning first writes the Skill, right at the argument (copied from
    # the reasoning): the Skill was not chosen
    ((rendered, offsets),) = _rows(convs[0], tokenizer)
    (site,) = _decisions.skill_sites(rendered.text, offsets, rendered.loss_mask)
    other = tokenizer("general", add_special_tokens=False)["input_ids"][0]
    report = hev.tool_choice(_oracle(wrong_at=site.decision[0], guess=other), convs, tokenizer)
    skills = report["skills"]
    assert (skills["calls"], skills["right"], skills["accuracy"]) == (2, 0, 0.0)
    assert skills["right_at_argument"] == 2
    (confusion,) = skills["confusions"]
    assert confusion["gold"] == "product-qa" and confusion["count"] == 2
    wrote = [other] + [rendered.ids[i] for i in site.decision[1:]]
    assert confusion["predicted"] == tokenizer.decode(wrote).strip() != "product-qa"
    assert report["accuracy"] == 1.0  # every tool name is still right
    text = hev.format_tool_choice(report)
    assert "Skill named (where first written)" in text and "Skill product-qa" in text


@pytest.mark.slow
def test_model_greedy_fn_is_the_unpadded_argmax_and_the_evaluation_reads_it(tokenizer):
    config = models.PRESETS["tiny"].replace(vocab_size=-(-len(tokenizer) // 128) * 128)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    ids = np.asarray(jax.random.randint(jax.random.key(1), (1, 37), 1, 256), np.int32)
    want = np.asarray(model(ids).logits).argmax(-1)
    np.testing.assert_array_equal(hev.model_greedy_fn(model, bucket=16)(ids), want)

    convs = [_conversation("a"), _conversation("b")]
    figures = hev.tool_choice_evaluation(convs, tokenizer)(model)
    report = hev.tool_choice(hev.model_greedy_fn(model), convs, tokenizer)
    assert figures["tool_choice"] == report["accuracy"]
    np.testing.assert_equal(figures["tool_decision"], report["reasoned"]["accuracy"])
    np.testing.assert_equal(figures["skill_decision"], report["skills"]["accuracy"])
    assert set(figures) == {"tool_choice", "tool_choice_first_turn", "tool_choice_later_turns",
                            "tool_decision", "skill_decision"}  # fmt: skip
    with pytest.raises(ValueError, match="no conversations"):
        hev.tool_choice_evaluation([], tokenizer)


@pytest.mark.slow
def test_launch_tool_choice_from_the_command_line(tmp_path, tokenizer):
    """A random tiny checkpoint scored on a JSONL split of two conversations: a report per
    checkpoint in the JSON with the copying probe, and a missing checkpoint named."""
    import json
    import pathlib
    import subprocess
    import sys

    from hat_jax.checkpoint import save_params

    repo = pathlib.Path(__file__).resolve().parents[2]
    config = models.QwenConfig.preset("tiny").replace(vocab_size=-(-len(tokenizer) // 128) * 128)
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    save_params(tmp_path / "ckpt", nnx.state(model, nnx.Param), model_config=config.to_dict())
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [{"id": c.id, "messages": c.messages, "tools": c.tools}
               for c in (_conversation("a"), _conversation("b"))]  # fmt: skip
    (corpus / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cmd = [sys.executable, "-m", "launch.tool_choice", f"--corpus={corpus}",
           f"--out={tmp_path / 'choice.json'}"]  # fmt: skip
    done = subprocess.run(cmd + [f"--checkpoints={tmp_path / 'ckpt'}"], cwd=repo,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "all calls" in done.stdout and "turn 2" in done.stdout
    out = json.loads((tmp_path / "choice.json").read_text())
    report = out["reports"][str(tmp_path / "ckpt")]
    assert out["records"] == 2 and report["calls"] == 6 and report["rows"] == 2
    assert set(report["by_name"]) == {"load_skill", "search_products", "reply_public"}
    # the copying probe comes with it (8 rows of 128 tokens twice: 8 x 127 predictions)
    assert "in-context copying" in done.stdout and report["copy"]["tokens"] == 8 * 127

    missing = subprocess.run(cmd + [f"--checkpoints={tmp_path / 'nope'}"], cwd=repo,
                             capture_output=True, text=True)  # fmt: skip
    assert missing.returncode != 0 and "nope does not exist" in missing.stderr
