"""General instructions for on-policy distillation: the bundled set, Tulu3 JSONL, constraints.

General OPD (paper §3.4) samples the student on general instructions (Tulu3 in the paper) and
pulls it toward the pre-SFT base model. This module provides those prompts:

- `load_instructions(path=None)`: the bundled demo set (`data/instructions/demo.jsonl`, small
  general tasks each with verifiable constraints) or any Tulu3-format JSONL at a local path
  (`{"id", "messages": [{"role", "content"}, ...], "source", ...}`); never downloads. The
  prompt is the conversation up to its last user turn; a final assistant turn, if any, is kept
  as the reference. Malformed lines are counted and skipped with their line numbers logged.
- `check_constraints(response, constraints)`: verifies IFEval-style constraints
  (`{"type": "max_words", "value": 60}`, ...) on a response, one bool per constraint, so the
  demo can measure instruction following before and after each stage; `loose=True` applies
  IFEval's loose criterion (a constraint holds if it holds for any of the response's
  variants without its first line, its last line, both, and/or its `*` characters), and
  `pass_rates` gives IFEval's four figures (prompt- and instruction-level, strict and loose).
- `prompt_hash` / `check_disjoint`: training prompts never overlap evaluation prompts (the
  bundled held-out instructions, or a local IFEval file), checked by hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_log = logging.getLogger(__name__)

DEMO_INSTRUCTIONS = pathlib.Path(__file__).resolve().parent / "instructions" / "demo.jsonl"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One general instruction.

    Attributes:
      id: the record id.
      messages: the prompt: OpenAI-style messages ending with a user turn.
      constraints: verifiable constraints on the response (see `CONSTRAINT_TYPES`).
      reference: a reference response, when the source has one.
      source: where the record comes from.
    """

    id: str
    messages: tuple[Mapping[str, Any], ...]
    constraints: tuple[Mapping[str, Any], ...] = ()
    reference: str | None = None
    source: str = ""

    def to_record(self) -> dict[str, Any]:
        """A `{"messages"}` record (with the reference reply, when there is one) for SFT."""
        messages = [dict(m) for m in self.messages]
        if self.reference is not None:
            messages.append({"role": "assistant", "content": self.reference})
        return {"id": self.id, "messages": messages, "constraints": list(self.constraints)}


_WORD = re.compile(r"\b\w[\w'-]*\b")
_SENTENCE = re.compile(r"[^.!?]+[.!?]+|[^.!?]+$")
_BULLET = re.compile(r"^\s*[*-]\s+\S", re.M)


def _words(text: str) -> int:
    return len(_WORD.findall(text))


def _sentences(text: str) -> int:
    return len([s for s in _SENTENCE.findall(text.strip()) if s.strip()])


def _paragraphs(text: str) -> int:
    return len([p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()])


def _is_json(text: str) -> bool:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.S)
    try:
        json.loads(fenced[1] if fenced else body)
    except ValueError:
        return False
    return True


def _has_all(text: str, words: Sequence[str]) -> bool:
    return all(re.search(rf"\b{re.escape(w)}\b", text, re.I) for w in words)


def _has_none(text: str, words: Sequence[str]) -> bool:
    return not any(re.search(rf"\b{re.escape(w)}\b", text, re.I) for w in words)


# type -> (checker(response, constraint), required fields)
CONSTRAINT_TYPES: dict[str, tuple[Callable[[str, Mapping[str, Any]], bool], tuple[str, ...]]] = {
    "max_words": (lambda r, c: _words(r) <= c["value"], ("value",)),
    "min_words": (lambda r, c: _words(r) >= c["value"], ("value",)),
    "max_sentences": (lambda r, c: _sentences(r) <= c["value"], ("value",)),
    "num_bullets": (lambda r, c: len(_BULLET.findall(r)) == c["value"], ("value",)),
    "num_paragraphs": (lambda r, c: _paragraphs(r) == c["value"], ("value",)),
    "include_keywords": (lambda r, c: _has_all(r, c["keywords"]), ("keywords",)),
    "exclude_words": (lambda r, c: _has_none(r, c["words"]), ("words",)),
    "no_commas": (lambda r, c: "," not in r, ()),
    "all_lowercase": (lambda r, c: r == r.lower() and any(ch.isalpha() for ch in r), ()),
    "all_uppercase": (lambda r, c: r == r.upper() and any(ch.isalpha() for ch in r), ()),
    "start_with": (lambda r, c: r.strip().lower().startswith(c["phrase"].lower()), ("phrase",)),
    "end_with": (lambda r, c: r.strip().lower().endswith(c["phrase"].lower()), ("phrase",)),
    "json_format": (lambda r, c: _is_json(r), ()),
    "quotation": (lambda r, c: len(r.strip()) > 1 and r.strip()[0] == r.strip()[-1] == '"', ()),
    "title": (lambda r, c: re.search(r"<<[^<>\n]+>>", r) is not None, ()),
}


# Pairs of constraint types no single response satisfies (or only contrived ones).
CONFLICTS = frozenset(
    frozenset(p)
    for p in [
        ("all_lowercase", "all_uppercase"),
        ("min_words", "max_words"),
        ("min_words", "max_sentences"),
        ("max_sentences", "num_paragraphs"),
        ("max_sentences", "num_bullets"),
        ("num_bullets", "num_paragraphs"),
        ("quotation", "start_with"),
        ("quotation", "end_with"),
        ("quotation", "num_bullets"),
        *[("json_format", t) for t in ("num_bullets", "num_paragraphs", "start_with",
                                       "end_with", "quotation", "title", "max_sentences")],
    ]
)  # fmt: skip


def compatible(kind: str, chosen: Sequence[str]) -> bool:
    """Whether a constraint of type `kind` can join `chosen` (not among them, no `CONFLICTS`)."""
    return kind not in chosen and all(frozenset((kind, c)) not in CONFLICTS for c in chosen)


def validate_constraint(constraint: Any) -> Mapping[str, Any]:
    """Checks a constraint's type and fields; returns it. ValueError names the problem."""
    if not isinstance(constraint, Mapping):
        raise ValueError(f"a constraint must be an object, got {constraint!r}")
    kind = constraint.get("type")
    if kind not in CONSTRAINT_TYPES:
        raise ValueError(f"unknown constraint type {kind!r}; known: {sorted(CONSTRAINT_TYPES)}")
    missing = [f for f in CONSTRAINT_TYPES[kind][1] if f not in constraint]
    if missing:
        raise ValueError(f"constraint {kind!r} lacks field(s) {missing}")
    return constraint


def loose_variants(response: str) -> list[str]:
    """IFEval's loose variants of a response: as is, without its first line, its last line or
    both, each also without `*` characters (markdown emphasis); empty ones dropped."""
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    out = []
    for text in cut + [c.replace("*", "") for c in cut]:
        text = text.strip()
        if text and text not in out:
            out.append(text)
    return out


def check_constraints(
    response: str, constraints: Sequence[Mapping[str, Any]], *, loose: bool = False
) -> list[bool]:
    """Whether `response` satisfies each constraint (in order); `loose`: whether any of its
    `loose_variants` does. An empty (or blank) response follows nothing, strictly or loosely,
    as in IFEval's own scorer (else "at most 3 sentences" would pass on no answer)."""
    variants = loose_variants(response) if loose else [response] if response.strip() else []
    return [
        any(bool(CONSTRAINT_TYPES[validate_constraint(c)["type"]][0](r, c)) for r in variants)
        for c in constraints
    ]


def pass_rates(
    responses: Sequence[str], constraints: Sequence[Sequence[Mapping[str, Any]]]
) -> dict[str, float]:
    """IFEval's figures over responses to prompts with constraints (prompts without any are
    left out): `prompt_strict` / `prompt_loose` (share of prompts whose every constraint
    holds), `instruction_strict` / `instruction_loose` (share of all constraints that hold),
    and `prompts` / `instructions` (the counts)."""
    if len(responses) != len(constraints):
        raise ValueError(f"pass_rates: {len(responses)} responses, {len(constraints)} prompts")
    out: dict[str, float] = {}
    pairs = [(r, c) for r, c in zip(responses, constraints) if c]
    for mode in ("strict", "loose"):
        checks = [check_constraints(r, c, loose=mode == "loose") for r, c in pairs]
        held = sum(sum(c) for c in checks)
        total = sum(len(c) for c in checks)
        out[f"prompt_{mode}"] = sum(all(c) for c in checks) / max(len(checks), 1)
        out[f"instruction_{mode}"] = held / max(total, 1)
    out["prompts"] = float(len(pairs))
    out["instructions"] = float(sum(len(c) for _, c in pairs))
    return out


def prompt_text(record: Mapping[str, Any] | Instruction) -> str:
    """The user-visible text of a prompt: its messages' contents (an `Instruction` or a
    Tulu-3 `messages` record), or an IFEval record's `prompt`; whitespace normalised."""
    if isinstance(record, Instruction):
        messages = record.messages
    elif "messages" in record:
        messages = record["messages"]
    elif isinstance(record.get("prompt"), str):
        messages = [{"role": "user", "content": record["prompt"]}]
    else:
        raise ValueError(f"a prompt record needs 'messages' or 'prompt', got keys {sorted(record)}")
    text = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") != "assistant")
    return " ".join(text.split())


def prompt_hash(record: Mapping[str, Any] | Instruction) -> str:
    """A hash of `prompt_text`: equal for the same prompt from any of the formats."""
    return hashlib.sha256(prompt_text(record).encode("utf-8")).hexdigest()


def read_prompt_records(path: os.PathLike | str) -> list[dict[str, Any]]:
    """The records of a local JSONL prompt file (Tulu-3 `messages` or IFEval `prompt`).

    Raises:
      FileNotFoundError: the file does not exist. ValueError: a line is not a JSON object
      with a prompt (the line is named), or the file has none.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                prompt_text(record)
            except (ValueError, AttributeError, TypeError) as err:
                raise ValueError(f"{path}:{n}: not a prompt record ({err})") from err
            records.append(record)
    if not records:
        raise ValueError(f"prompt file {path} is empty")
    return records


def check_disjoint(
    train: Sequence[Mapping[str, Any] | Instruction],
    evaluation: Sequence[Mapping[str, Any] | Instruction],
    *,
    what: str = "evaluation",
) -> None:
    """Raises ValueError naming the overlap if any training prompt is an evaluation prompt
    (same `prompt_hash`)."""
    held = {prompt_hash(r) for r in evaluation}
    clash = [r for r in train if prompt_hash(r) in held]
    if clash:
        names = [getattr(r, "id", None) or r.get("id") or r.get("key") for r in clash[:5]]
        raise ValueError(
            f"{len(clash)} training prompt(s) are also {what} prompts (e.g. {names}); "
            "remove them from the training set"
        )


def parse_instruction(record: Mapping[str, Any], default_id: str) -> Instruction:
    """An `Instruction` from a Tulu3-format record (ValueError names the bad field)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("field 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{i}]: expected a system, user or assistant message")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}].content must be a string")
    reference = None
    if messages[-1]["role"] == "assistant":
        reference, messages = messages[-1]["content"], messages[:-1]
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("the prompt must end with a user message")
    constraints = tuple(validate_constraint(c) for c in record.get("constraints") or ())
    return Instruction(
        id=str(record.get("id") or default_id),
        messages=tuple({"role": m["role"], "content": m["content"]} for m in messages),
        constraints=constraints,
        reference=reference,
        source=str(record.get("source") or ""),
    )


def load_instructions(path: os.PathLike | str | None = None) -> list[Instruction]:
    """The bundled demo set (`path=None`) or a local Tulu3-format JSONL file.

    Malformed lines are skipped, counted and logged by line number; a file with no usable line
    is an error.

    Raises:
      FileNotFoundError: `path` does not exist (nothing is ever downloaded).
      ValueError: no line of the file is a usable instruction.
    """
    path = pathlib.Path(path) if path is not None else DEMO_INSTRUCTIONS
    if not path.is_file():
        raise FileNotFoundError(f"instruction file {path} does not exist")
    out, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(parse_instruction(json.loads(line), f"{path.stem}-{n}"))
            except ValueError as err:
                bad += 1
                _log.warning("skipping %s:%d: %s", path, n, err)
    if not out:
        raise ValueError(f"{path}: no usable instruction ({bad} malformed lines)")
    if bad:
        _log.warning("%s: %d malformed lines skipped, %d instructions read", path, bad, len(out))
    return out
