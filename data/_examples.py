"""Records to token rows: parse, optional online HSA, render with a loss mask, truncate.

Pure functions; `data.pipeline` runs them under Grain. One record (a corpus record, or any
`{"messages": [...], "tools": [...]}` chat record) becomes a `Prepared`: zero or more rows of
`input_ids` and `loss_mask` (int32, 1 exactly on assistant-produced tokens) and what happened to
it. Nothing here raises on bad data: a record that cannot be read or rendered is returned with
`status="bad"` and the reason, so one bad line never stops an epoch.

Truncation policy, for a row longer than `seq_len`:
- `"drop"` (default): the row is dropped and counted (`too_long`). Agent rows end with the reply,
  so a cut row would train a reply without its end.
- `"right"`: the first `seq_len` tokens are kept and counted (`truncated`); a row left without a
  trained token is dropped (`too_long`). The system prompt and Harness come first, so what the
  kept turns were conditioned on is intact.
Rows are never cut on the left: the prompt carries the Harness state the behaviour depends on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from data._convert import (
    Conversation,
    ConversionError,
    split_rows,
    trajectory_conversation,
)
from data._rerender import RerenderError, loaded_skills, rerender
from data._sources import open_source
from hat_jax import chat_format
from hat_jax import harness as hx

TRUNCATION_POLICIES = ("drop", "right")

# Augmenter: a fresh Harness state from a random generator, keeping the canonical Skills the
# stored behaviour loads (see `data.pipeline.make_augmenter`).
Augmenter = Callable[[np.random.Generator, frozenset[str]], hx.HarnessState]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """How conversations become rows.

    Attributes:
      seq_len: the packed row length; longer rows follow `truncation`.
      truncation: "drop" or "right" (see the module docstring).
      enable_thinking: the thinking mode the assistant turns were generated in.
      preserve_thinking: keep reasoning on every assistant turn (the Qwen3.6 template option).
      hsa_probability: chance that a record with a stored trajectory is re-rendered under a
        fresh augmentation (needs an augmenter).
      bare_probability: chance per record and epoch that a corpus record of the room's
        original Harness state (`state.kind == "original"`) is rendered bare: without its
        system prompt and tool schemas, so the viewer's comment is the whole prompt. A
        curriculum for a model without pretraining, which does not at first read a comment
        behind a long Harness; the stored turns are unchanged (the original state's names,
        which the whole renders teach to copy from the tool list). Records of augmented
        states and records without a state (plain chat data) always render whole. 0 = off.
    """

    seq_len: int
    truncation: str = "drop"
    enable_thinking: bool = True
    preserve_thinking: bool = False
    hsa_probability: float = 0.0
    bare_probability: float = 0.0

    def __post_init__(self):
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {self.seq_len}")
        if self.truncation not in TRUNCATION_POLICIES:
            raise ValueError(
                f"truncation must be one of {TRUNCATION_POLICIES}, got {self.truncation!r}"
            )
        if not 0.0 <= self.hsa_probability <= 1.0:
            raise ValueError(f"hsa_probability must be in [0, 1], got {self.hsa_probability}")
        if not 0.0 <= self.bare_probability <= 1.0:
            raise ValueError(f"bare_probability must be in [0, 1], got {self.bare_probability}")


@dataclasses.dataclass
class Prepared:
    """What became of one record.

    Attributes:
      record_id: the record's id (or `<index>` when it has none).
      rows: `{"input_ids", "loss_mask"}` int32 arrays, each at most `seq_len` long.
      status: "ok", "bad" (unreadable or unrenderable: skipped) or "empty" (every row dropped).
      reason: why, when not ok.
      truncated: rows cut to `seq_len`.
      too_long: rows dropped for length.
      untrainable: rows dropped because no token of theirs is trained.
      hsa: "" (not attempted), "applied", or "refused" (the new state could not express the
        behaviour; rendered as stored).
      bare: rendered without its system prompt and tool schemas (`bare_probability`).
    """

    record_id: str
    rows: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)
    status: str = "ok"
    reason: str = ""
    truncated: int = 0
    too_long: int = 0
    untrainable: int = 0
    hsa: str = ""
    bare: bool = False


def decode_record(raw: Any) -> dict[str, Any]:
    """A record as a dict from bytes / str (JSON) or a mapping. Raises ValueError if not one."""
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8")
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, Mapping):
        raise ValueError(f"a record must be a JSON object, got {type(raw).__name__}")
    return dict(raw)


def record_conversation(record: Mapping[str, Any], record_id: str) -> Conversation:
    """The conversation a record trains on: its `messages`, else its converted `trajectory`."""
    tools = record.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError(f"field 'tools' must be a list of schemas, got {type(tools).__name__}")
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("field 'messages' must be a non-empty list of message dicts")
        return Conversation(id=record_id, messages=messages, tools=tools)
    if "trajectory" in record:
        traj = hx.Trajectory.from_dict(record["trajectory"])
        keep = record.get("retry_history") == "full"
        return trajectory_conversation(traj, tools, keep_retries=keep, conversation_id=record_id)
    raise ValueError("the record has neither 'messages' nor 'trajectory'")


def _original_state(record: Mapping[str, Any]) -> bool:
    """A corpus record generated in its room's original Harness state."""
    state = record.get("state")
    return isinstance(state, Mapping) and state.get("kind") == "original"


def bare_conversation(conv: Conversation) -> Conversation:
    """`conv` without its system messages and tool schemas (see `RenderOptions`)."""
    messages = [m for m in conv.messages if m.get("role") != "system"]
    if not messages:
        raise ValueError("a bare render of the record leaves no message")
    return Conversation(id=conv.id, messages=messages, tools=None)


def _augment(
    conv: Conversation, record: Mapping[str, Any], augmenter: Augmenter, rng: np.random.Generator
) -> tuple[Conversation, str]:
    """Re-renders `conv` under a fresh state; ("refused") when the state cannot express it."""
    traj = record.get("trajectory")
    state = record.get("state") or {}
    if not isinstance(traj, Mapping) or "request" not in traj:
        return conv, ""
    base = getattr(augmenter, "base_version", None)
    if base is not None and state.get("base_version") not in (None, base):
        return conv, "refused"  # generated from another Harness: its names would not map
    renames = traj.get("renames") or {}
    try:
        new = rerender(
            conv,
            request=traj["request"],
            renames=renames,
            new_state=augmenter(rng, loaded_skills(conv, renames)),
            constraints=state.get("constraints"),
        )
    except RerenderError:
        return conv, "refused"
    return new, "applied"


def _fit(rendered: chat_format.RenderedTokens, options: RenderOptions, out: Prepared) -> None:
    ids = np.asarray(rendered.ids, np.int32)
    mask = np.asarray(rendered.loss_mask, np.int32)
    if len(ids) > options.seq_len:
        if options.truncation == "drop" or not mask[1 : options.seq_len].any():
            out.too_long += 1
            return
        ids, mask = ids[: options.seq_len], mask[: options.seq_len]
        out.truncated += 1
    if not mask[1:].any():
        out.untrainable += 1
        return
    out.rows.append({"input_ids": ids, "loss_mask": mask})


def read_conversations(
    paths: Sequence[os.PathLike | str], split: str | None, *, limit: int
) -> list[Conversation]:
    """The conversations of the first `limit` records of a split (`open_source`'s paths)."""
    source = open_source(paths, split)
    out = []
    for i in range(min(len(source), limit)):
        record = decode_record(source[i])
        out.append(record_conversation(record, str(record.get("id") or i)))
    return out


def prepare(
    raw: Any,
    *,
    record_id: str,
    tokenizer: Any,
    options: RenderOptions,
    rng: np.random.Generator | None = None,
    augmenter: Augmenter | None = None,
) -> Prepared:
    """One record to token rows (see the module docstring). Never raises on bad data."""
    out = Prepared(record_id=record_id)
    try:
        record = decode_record(raw)
        out.record_id = str(record.get("id") or record_id)
        conv = record_conversation(record, out.record_id)
        # Each draw is made only when its option is on, so a run without it keeps its stream.
        bare = rng is not None and options.bare_probability > 0 and _original_state(record)
        if bare and rng.random() < options.bare_probability:
            conv, out.bare = bare_conversation(conv), True
        hsa = augmenter is not None and rng is not None and options.hsa_probability > 0
        if not out.bare and hsa and rng.random() < options.hsa_probability:
            conv, out.hsa = _augment(conv, record, augmenter, rng)
        kw = dict(
            enable_thinking=options.enable_thinking, preserve_thinking=options.preserve_thinking
        )
        for row in split_rows(conv, **kw):
            rendered = chat_format.render_tokens(row.messages, tokenizer, row.tools, **kw)
            _fit(rendered, options, out)
    except (ValueError, TypeError, KeyError, ConversionError) as err:
        return Prepared(record_id=out.record_id, status="bad", reason=_reason(err))
    if not out.rows:
        out.status, out.reason = "empty", "every row was dropped (too long or nothing to train)"
    return out


def _reason(err: Exception) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= 300 else text[:297] + "..."
