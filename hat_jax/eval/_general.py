"""The general instruction set: verifiable-instruction prompts, scored by rule (IFEval-style).

Prompts are generated deterministically from the seed: a task from a small bank, then one to
three compatible constraints of the types of `data._instructions.CONSTRAINT_TYPES` (two
constraints are compatible unless one response could not satisfy both, see `data._instructions.CONFLICTS`), the
instruction text stating each. Prompts stay under `MAX_WORDS` words so a tiny model can follow
them. The task bank is split in two disjoint halves: the test split draws from one, the dev
split from the other (`train` is refused: the OPD training prompts are
`data/instructions/demo.jsonl`, and the built set is checked to share no prompt with them).

Items are single-call: `prompt = {"messages": [user turn], "constraints": [...]}` and
`expect = {"constraints": n}` (the number of constraints, for the instruction-level mean over
all constraints of a run). Scores: `strict_prompt` / `loose_prompt` (every constraint holds,
strictly or under IFEval's loose criterion), `strict_instruction` / `loose_instruction` (the
item's share of constraints that hold), `avg` = `strict_prompt`. Family: the first
constraint's type.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping
from typing import Any

from data import _instructions as ins
from hat_jax import harness as hx
from hat_jax.eval._items import EvalItem, EvalSet
from hat_jax.eval._kind import EvalContext, Prepared, set_name

MAX_WORDS = 60
# (task, topical keywords a good answer naturally uses)
TASKS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("Explain how a refrigerator keeps food cold.", ("heat", "air")),
    ("Describe what makes a good team meeting.", ("agenda", "time")),
    ("Give advice to someone adopting their first cat.", ("food", "space")),
    ("Explain why bridges are built with expansion joints.", ("heat", "steel")),
    ("Describe a busy farmers market on a Saturday morning.", ("fruit", "crowd")),
    ("Explain how to choose a comfortable pair of walking shoes.", ("size", "heel")),
    ("Summarize why people keep a daily journal.", ("thoughts", "habit")),
    ("Explain what a power bank is and when it is useful.", ("battery", "phone")),
    ("Give tips for taking clear photos with a phone.", ("light", "focus")),
    ("Describe how bees make honey.", ("nectar", "hive")),
    ("Explain how to store fresh herbs so they last longer.", ("water", "fridge")),
    ("Write a short note thanking a teacher at the end of the year.", ("class", "year")),
    ("Explain why people wear sunscreen on cloudy days.", ("skin", "rays")),
    ("Describe how to set up a small home aquarium.", ("water", "fish")),
    ("Give tips for a first visit to a large museum.", ("map", "time")),
    ("Explain how a train timetable helps travellers.", ("times", "station")),
    ("Describe what to look for when buying a winter coat.", ("warmth", "zipper")),
    ("Explain how composting turns scraps into soil.", ("soil", "worms")),
    ("Give advice for packing a healthy school lunch.", ("fruit", "water")),
    ("Explain why stretching before exercise can help.", ("muscles", "injury")),
    ("Describe the sounds of a city at night.", ("traffic", "wind")),
    ("Explain what a loyalty card in a shop offers.", ("points", "discount")),
    ("Give tips for keeping a tidy desk.", ("drawer", "papers")),
    ("Explain how to care for a wooden cutting board.", ("oil", "water")),
)
_AVOID = ("very", "really", "basically", "just", "thing")
_START = ("My answer:", "In short", "Here goes")
_END = ("Hope this helps.", "That is all.", "Thanks for reading.")


def _constraint(kind: str, rng: random.Random, keywords: tuple[str, str]) -> tuple[dict, str]:
    """A constraint of type `kind` with drawn parameters, and the sentence that states it."""
    if kind == "max_words":
        v = rng.choice((30, 40, 50, 60))
        return {"type": kind, "value": v}, f"Keep your answer to {v} words or fewer."
    if kind == "min_words":
        v = rng.choice((40, 60))
        return {"type": kind, "value": v}, f"Write at least {v} words."
    if kind == "max_sentences":
        v = rng.choice((2, 3))
        return {"type": kind, "value": v}, f"Use at most {v} sentences."
    if kind == "num_bullets":
        v = rng.choice((3, 4))
        return {"type": kind, "value": v}, (
            f"Give exactly {v} bullet points, each on its own line starting with '- '."
        )
    if kind == "num_paragraphs":
        v = rng.choice((2, 3))
        return {"type": kind, "value": v}, (
            f"Write exactly {v} paragraphs separated by blank lines."
        )
    if kind == "include_keywords":
        return {"type": kind, "keywords": list(keywords)}, (
            f'Include the words "{keywords[0]}" and "{keywords[1]}".'
        )
    if kind == "exclude_words":
        w = rng.choice(_AVOID)
        return {"type": kind, "words": [w]}, f'Do not use the word "{w}".'
    if kind == "no_commas":
        return {"type": kind}, "Do not use any commas."
    if kind == "all_lowercase":
        return {"type": kind}, "Use only lowercase letters."
    if kind == "all_uppercase":
        return {"type": kind}, "Use only capital letters."
    if kind == "start_with":
        p = rng.choice(_START)
        return {"type": kind, "phrase": p}, f'Begin your response with "{p}".'
    if kind == "end_with":
        p = rng.choice(_END)
        return {"type": kind, "phrase": p}, f'Finish your response with the exact phrase "{p}".'
    if kind == "json_format":
        return {"type": kind}, "Format the whole answer as valid JSON."
    if kind == "quotation":
        return {"type": kind}, "Put your whole response inside double quotation marks."
    if kind == "title":
        return {"type": kind}, "Add a title in double angular brackets, like <<title>>."
    raise ValueError(f"no template for constraint type {kind!r}")


def tasks_for(split: str) -> tuple[tuple[str, tuple[str, str]], ...]:
    """The half of the task bank a split draws from (test: even positions, dev: odd)."""
    if split not in ("test", "dev"):
        raise ValueError(
            f"the general set has test and dev splits, not {split!r} (train prompts for OPD "
            "are data/instructions/demo.jsonl)"
        )
    return TASKS[0 if split == "test" else 1 :: 2]


def generate(split: str, size: int, seed: int) -> list[dict[str, Any]]:
    """`size` distinct prompt records `{"messages", "constraints"}` for `split`.

    Raises:
      ValueError: the split is unknown, a prompt is too long, or the bank cannot give `size`
        distinct prompts.
    """
    tasks, kinds = tasks_for(split), sorted(ins.CONSTRAINT_TYPES)
    rng = random.Random(
        int.from_bytes(hashlib.sha256(f"general|{split}|{seed}".encode()).digest()[:8], "big")
    )
    out, seen = [], set()
    for _ in range(size * 50):
        if len(out) == size:
            break
        task, keywords = rng.choice(tasks)
        chosen: list[str] = []
        for _ in range(rng.choice((1, 1, 2, 2, 3))):
            options = [k for k in kinds if ins.compatible(k, chosen)]
            chosen.append(rng.choice(options))
        pairs = [_constraint(k, rng, keywords) for k in chosen]
        text = " ".join([task, *(sentence for _, sentence in pairs)])
        if len(text.split()) >= MAX_WORDS:
            raise ValueError(
                f"general prompt of {len(text.split())} words (>= {MAX_WORDS}): {text}"
            )
        if text in seen:
            continue
        seen.add(text)
        constraints = [ins.validate_constraint(c) for c, _ in pairs]
        out.append({"messages": [{"role": "user", "content": text}], "constraints": constraints})
    if len(out) < size:
        raise ValueError(
            f"general-{split}: the bank gives only {len(out)} distinct prompts, not {size}"
        )
    return out


@dataclasses.dataclass(frozen=True)
class _GeneralKind:
    """The general instruction set (see the module docstring)."""

    name: str = "general"
    metrics: tuple[str, ...] = (
        "strict_prompt",
        "loose_prompt",
        "strict_instruction",
        "loose_instruction",
        "avg",
    )

    def build(self, ctx: EvalContext, *, split: str = "test", size: int, seed: int) -> EvalSet:
        name = set_name(self.name, split)
        records = generate(split, size, seed)
        try:
            ins.check_disjoint(ins.load_instructions(), records, what=f"{name} evaluation")
        except ValueError as err:
            raise ValueError(
                f"{name}: the generated prompts overlap the OPD prompts: {err}"
            ) from err
        items = tuple(
            EvalItem(
                id=f"{name}-{k:04d}",
                set=name,
                family=r["constraints"][0]["type"],
                prompt=r,
                expect={"constraints": len(r["constraints"])},
            )
            for k, r in enumerate(records)
        )
        generator = {"kind": self.name, "split": split, "size": size, "seed": seed,
                     "tasks": len(tasks_for(split)), "max_words": MAX_WORDS}  # fmt: skip
        return EvalSet(name, items, generator, room=ctx.room)

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        if item.prompt is None:
            raise ValueError(f"{item.id}: a general item needs a prompt")
        messages = [dict(m) for m in hx.thaw(item.prompt)["messages"]]
        return Prepared(state=hx.HarnessState(harness=ctx.harness), messages=messages)

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]:
        if not isinstance(result, hx.AssistantTurn):
            raise TypeError(f"{item.id}: expected an hx.AssistantTurn, got {type(result).__name__}")
        constraints: list[Mapping[str, Any]] = hx.thaw(item.prompt)["constraints"]
        strict = ins.check_constraints(result.content, constraints)
        loose = ins.check_constraints(result.content, constraints, loose=True)
        out = {
            "strict_prompt": float(all(strict)),
            "loose_prompt": float(all(loose)),
            "strict_instruction": sum(strict) / len(strict),
            "loose_instruction": sum(loose) / len(loose),
        }
        out["avg"] = out["strict_prompt"]
        return out


GENERAL = _GeneralKind()
