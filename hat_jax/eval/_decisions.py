"""Teacher-forced tool choice: given the gold conversation up to a tool call, does the policy
name the gold tool?

An episode score says whether a policy does the task; this says where one that does not is
stuck. For every trained tool call of a set of conversations (e.g. a corpus's dev split), the
tokens of the called function's name are scored teacher-forced: the call counts as chosen
right when the policy's argmax at each of those tokens is the gold token, i.e. greedy decoding
from the gold prefix would write the gold name. Calls are grouped by gold name, by the
assistant turn they belong to (1 = the first reply to the viewer), and by their place in the
turn (the first call, or a later one after other calls of the same turn), and the most common
confusions are listed. A policy that has learned the output format but not the decision
(e.g. it calls the first turn's tool in every turn) shows here as high accuracy on turn 1's
first call and near zero elsewhere. The gold prefix holds the turn's reasoning: when that
names the tool before the call (the scripted teacher's "Load after-sales; call
get_after_sales_policy." does), the score at the call may be copying the name from a few
tokens back, not deciding. So the calls whose name the turn's reasoning writes first are also
scored at that mention (`reasoned`), where the tool is chosen. And calls that every turn
makes (the Skill loader, the reply) can carry the overall figure: `by_name` separates them.

Which Skill to load is the other decision, and it is an argument, not a name: for every
trained call of the Skill loader (`load_skill`, or its renamed surface name under HSA:
`skill_loader`) the Skill it names is scored the same way, at its first writing in
the turn's reasoning ("Load after-sales; ...") when there is one, else at the argument
(`skills`: by gold Skill, with the commonest wrong choices). A policy that writes the same
Skill for every comment shows here as one Skill right and every other Skill near zero, while
its tool choice can look fine (`load_skill` itself is right in every turn).

The policy is any `greedy_fn(ids: int32[1, T]) -> int[1, T]`, the argmax next token at every
position; `model_greedy_fn` wraps a `models.Qwen` (the argmax is taken on the devices, so
only token ids come back). Rows follow the training rows (`data.split_rows`), so a call is
scored in the context it was trained in. The SFT stage logs it on its dev records
(`tool_choice_evaluation`, `eval/tool_choice*`).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from hat_jax import chat_format
from hat_jax.harness import LOAD_SKILL

_CALL = re.compile(r"<function=([^>\n]*)>")
# The first argument of a call block (the Qwen3.5 XML tool-call format: the value on its own
# lines between the parameter tags); `load_skill` takes one, the Skill's name.
_ARGUMENT = re.compile(r"\n?<parameter=[^>\n]*>\n(.*?)\n</parameter>", re.S)
_TURN = "<|im_start|>assistant"
_THINK_END = "</think>"


@dataclasses.dataclass(frozen=True)
class CallSite:
    """One trained tool call in a token row.

    Attributes:
      name: the gold function name.
      tokens: the row positions of the tokens that spell the name (a token that also holds
        the `=` before it counts: the model must predict it).
      turn: the assistant turn, 1-based within the row's conversation.
      index: the call's place in its turn, 0 = the first.
      decision: the row positions of the name's first writing in its turn: its first
        mention in the turn's reasoning (trained tokens) when there is one, else `tokens`.
    """

    name: str
    tokens: tuple[int, ...]
    turn: int
    index: int
    decision: tuple[int, ...] = ()

    @property
    def in_reasoning(self) -> bool:
        """The name is written in the turn's reasoning before the call."""
        return bool(self.decision) and self.decision != self.tokens


def token_offsets(rendered: Any, tokenizer: Any, name: str) -> list[tuple[int, int]]:
    """Each token's character span in a `chat_format.render_tokens` row (a fast tokenizer's
    offsets). ValueError names the row (`name`) when the tokenizer's ids differ from the row's."""
    enc = tokenizer(rendered.text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != list(rendered.ids):
        raise ValueError(f"{name}: the tokenizer's offsets do not match the row's ids")
    return list(enc["offset_mapping"])


class _Row:
    """A rendered row's token spans: which trained tokens cover a character range, and where a
    name is first written in an assistant turn's reasoning."""

    def __init__(self, text: str, offsets: list[tuple[int, int]], loss_mask: list[int]):
        if len(offsets) != len(loss_mask):
            raise ValueError(f"offsets ({len(offsets)}) and loss_mask ({len(loss_mask)}) differ")
        self.text, self.loss_mask = text, loss_mask
        self.starts = np.array([s for s, _ in offsets], dtype=np.int64)
        self.ends = np.array([e for _, e in offsets], dtype=np.int64)
        self.turn_starts = [m.start() for m in re.finditer(re.escape(_TURN), text)]

    def covering(self, lo: int, hi: int) -> tuple[int, ...] | None:
        """The tokens overlapping [lo, hi) when every one is trained."""
        idx = np.nonzero((self.starts < hi) & (self.ends > lo))[0]
        if not len(idx) or not all(self.loss_mask[i] for i in idx):
            return None
        return tuple(int(i) for i in idx)

    def turn(self, pos: int) -> int:
        """How many assistant turns open before character `pos` (its turn, 1-based)."""
        return bisect.bisect_left(self.turn_starts, pos)

    def first_mention(self, turn: int, before: int, name: str) -> tuple[int, ...] | None:
        """The trained tokens of `name`'s first whole-word writing in turn `turn`'s reasoning
        (the think block, before character `before`), or None."""
        if not turn:
            return None
        start = self.turn_starts[turn - 1]
        head = self.text[start:before]
        think = head.find(_THINK_END)
        reasoning = head[:think] if think >= 0 else ""  # no think block: no mention
        named = _mention(name).search(reasoning)
        return self.covering(start + named.start(), start + named.end()) if named else None


def call_sites(text: str, offsets: list[tuple[int, int]], loss_mask: list[int]) -> list[CallSite]:
    """The trained tool calls of one rendered row.

    Args:
      text: the rendered text.
      offsets: each token's character span in `text`.
      loss_mask: 1 on the assistant's (trained) tokens.

    Raises:
      ValueError: the offsets and the mask differ in length.
    """
    row = _Row(text, offsets, loss_mask)
    sites: list[CallSite] = []
    per_turn: collections.Counter[int] = collections.Counter()
    for match in _CALL.finditer(text):
        lo, hi = match.span(1)
        if hi <= lo:
            continue
        tokens = row.covering(lo, hi)
        if tokens is None:
            continue  # a call in a prompt turn or an untrained (weight 0) turn
        turn = row.turn(match.start())
        decision = row.first_mention(turn, match.start(), match.group(1)) or tokens
        sites.append(CallSite(match.group(1), tokens, turn, per_turn[turn], decision))
        per_turn[turn] += 1
    return sites


@dataclasses.dataclass(frozen=True)
class SkillSite:
    """The Skill one trained call of the Skill loader names (`skill_sites`).

    Attributes:
      skill: the gold Skill name (as the row's Harness state spells it).
      tokens: the row positions of the argument's tokens.
      turn: the assistant turn, 1-based within the row's conversation.
      decision: the row positions of the Skill's first writing in its turn's reasoning when
        there is one (where it is chosen), else `tokens`.
    """

    skill: str
    tokens: tuple[int, ...]
    turn: int
    decision: tuple[int, ...]


def skill_loader(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The surface name of the Skill-loading tool in a row's tool schemas: `load_skill`, or,
    in a Harness state that renamed it, the one tool whose only parameter is `name` (HSA
    renames tools but never their parameters, and in the bundled Harness `load_skill(name)` is
    the only such tool). `load_skill` when none or several qualify."""
    names = []
    for tool in tools or ():
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        if fn.get("name") == LOAD_SKILL:
            return LOAD_SKILL
        if list(props) == ["name"]:
            names.append(fn.get("name"))
    return names[0] if len(names) == 1 and isinstance(names[0], str) else LOAD_SKILL


def skill_sites(
    text: str,
    offsets: list[tuple[int, int]],
    loss_mask: list[int],
    *,
    loader: str = LOAD_SKILL,
) -> list[SkillSite]:
    """The Skills named by the trained calls of `loader` (the Skill-loading tool) in one
    rendered row; arguments are as in `call_sites`.

    Raises:
      ValueError: the offsets and the mask differ in length.
    """
    row = _Row(text, offsets, loss_mask)
    sites: list[SkillSite] = []
    for match in _CALL.finditer(text):
        if match.group(1) != loader:
            continue
        argument = _ARGUMENT.match(text, match.end())
        if argument is None or not argument.group(1).strip():
            continue
        value = argument.group(1).strip()
        lo = argument.start(1) + argument.group(1).index(value)
        tokens = row.covering(lo, lo + len(value))
        if tokens is None:
            continue  # a prompt turn's or an untrained turn's call
        turn = row.turn(match.start())
        decision = row.first_mention(turn, match.start(), value) or tokens
        sites.append(SkillSite(value, tokens, turn, decision))
    return sites


@functools.lru_cache(maxsize=256)
def _mention(name: str) -> re.Pattern:
    """The name as a whole word (not inside a longer identifier)."""
    return re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")


@dataclasses.dataclass
class _Tally:
    calls: int = 0
    right: int = 0

    def add(self, ok: bool) -> None:
        self.calls += 1
        self.right += int(ok)

    def as_dict(self) -> dict[str, Any]:
        acc = self.right / self.calls if self.calls else float("nan")
        return {"calls": self.calls, "right": self.right, "accuracy": acc}


def tool_choice(
    greedy_fn: Callable[[np.ndarray], Any],
    conversations: Iterable[Any],
    tokenizer: Any,
    *,
    enable_thinking: bool = True,
    max_len: int = 0,
    confusions: int = 10,
) -> dict[str, Any]:
    """Teacher-forced tool-choice accuracy of a policy on conversations.

    Args:
      greedy_fn: `int32[1, T] -> int[1, T]`, the argmax next token at each position.
      conversations: `data.Conversation`s (records' conversations, e.g. a corpus split).
      tokenizer: a fast tokenizer (character offsets).
      enable_thinking: the thinking mode the conversations were generated in.
      max_len: > 0 skips rows longer than this (counted as `skipped_rows`).
      confusions: how many of the commonest wrong choices to list.

    Returns:
      `{"calls", "right", "accuracy", "by_name", "by_turn", "by_index", "reasoned",
      "confusions", "rows", "skipped_rows"}`; `by_index` keys are "first" and "later" (calls
      after another in the same turn); `reasoned` counts the calls whose name the turn's
      reasoning writes first, scored there (`CallSite.decision`), with `right_at_call` how
      many of them are right at the call; a confusion is `{"gold", "predicted", "count"}`
      with the predicted name decoded from the argmax tokens. `skills` scores the Skill
      each trained call of the row's Skill loader (`skill_loader`: `load_skill` or its
      renamed surface name) names (`skill_sites`) where it is first written:
      `{"calls", "right", "accuracy", "right_at_argument", "by_skill", "confusions"}`.
    """
    import data  # the training rows' own split

    total, names, turns, index = _Tally(), {}, {}, {"first": _Tally(), "later": _Tally()}
    reasoned, reasoned_at_call = _Tally(), 0
    wrong: collections.Counter[tuple[str, str]] = collections.Counter()
    skills, skill_names, skills_at_argument = _Tally(), {}, 0
    wrong_skill: collections.Counter[tuple[str, str]] = collections.Counter()
    rows = skipped = 0
    for conv in conversations:
        for row in data.split_rows(conv, enable_thinking=enable_thinking):
            rendered = chat_format.render_tokens(
                row.messages, tokenizer, row.tools, enable_thinking=enable_thinking
            )
            if max_len and len(rendered.ids) > max_len:
                skipped += 1
                continue
            offsets = token_offsets(rendered, tokenizer, conv.id)
            sites = call_sites(rendered.text, offsets, rendered.loss_mask)
            if not sites:
                continue
            rows += 1
            ids = np.asarray(rendered.ids, dtype=np.int32)
            predicted = np.asarray(greedy_fn(ids[None]))[0]  # [i]: the guess for token i + 1
            for site in sites:
                guess = _argmax_at(predicted, site.tokens)
                ok = guess == _gold_at(ids, site.tokens)
                total.add(ok)
                names.setdefault(site.name, _Tally()).add(ok)
                turns.setdefault(site.turn, _Tally()).add(ok)
                index["first" if site.index == 0 else "later"].add(ok)
                if site.in_reasoning:
                    reasoned.add(
                        _argmax_at(predicted, site.decision) == _gold_at(ids, site.decision)
                    )
                    reasoned_at_call += int(ok)
                if not ok:
                    wrong[(site.name, _guessed_name(tokenizer, guess))] += 1
            loader = skill_loader(row.tools)
            for site in skill_sites(rendered.text, offsets, rendered.loss_mask, loader=loader):
                guess = _argmax_at(predicted, site.decision)
                ok = guess == _gold_at(ids, site.decision)
                skills.add(ok)
                skill_names.setdefault(site.skill, _Tally()).add(ok)
                skills_at_argument += int(
                    _argmax_at(predicted, site.tokens) == _gold_at(ids, site.tokens)
                )
                if not ok:
                    wrong_skill[(site.skill, tokenizer.decode(guess).strip())] += 1
    return total.as_dict() | {
        "by_name": {k: v.as_dict() for k, v in sorted(names.items())},
        "by_turn": {str(k): v.as_dict() for k, v in sorted(turns.items())},
        "by_index": {k: v.as_dict() for k, v in index.items()},
        "reasoned": reasoned.as_dict() | {"right_at_call": reasoned_at_call},
        "confusions": _confusion_list(wrong, confusions),
        "skills": skills.as_dict()
        | {
            "right_at_argument": skills_at_argument,
            "by_skill": {k: v.as_dict() for k, v in sorted(skill_names.items())},
            "confusions": _confusion_list(wrong_skill, confusions),
        },
        "rows": rows,
        "skipped_rows": skipped,
    }


def _argmax_at(predicted: np.ndarray, positions: Sequence[int]) -> list[int]:
    """The policy's guesses for the tokens at `positions` (`predicted[i]` guesses token i+1)."""
    return [int(predicted[i - 1]) for i in positions]


def _gold_at(ids: np.ndarray, positions: Sequence[int]) -> list[int]:
    return [int(ids[i]) for i in positions]


def _confusion_list(wrong: collections.Counter, n: int) -> list[dict[str, Any]]:
    return [{"gold": g, "predicted": p, "count": k} for (g, p), k in wrong.most_common(n)]


def _confusion_lines(title: str, confusions: Sequence[Mapping[str, Any]]) -> list[str]:
    if not confusions:
        return []
    return [f"  {title} (gold -> predicted):"] + [
        f"    {c['gold']} -> {c['predicted']!r}: {c['count']}" for c in confusions
    ]


def _guessed_name(tokenizer: Any, guess: list[int]) -> str:
    text = tokenizer.decode(guess)
    return text[1:] if text.startswith("=") else text


@functools.cache
def _greedy_program():
    """The compiled argmax forward, keyed by the model's graph (JAX imported on first use)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @functools.partial(jax.jit, static_argnums=0)
    def greedy(graphdef, state, ids, segments):
        return jnp.argmax(nnx.merge(graphdef, state)(ids, segment_ids=segments).logits, axis=-1)

    return greedy


def model_greedy_fn(model: Any, *, bucket: int = 512) -> Callable[[np.ndarray], np.ndarray]:
    """A `greedy_fn` over a `models.Qwen`: rows are padded at the end to a multiple of `bucket`
    (causal, so the padding changes no prediction of the row; marked as padding) to bound
    recompilations; the program is cached by the model's graph, so evaluating each new state
    of one training run compiles nothing new.

    In a job of several processes the model's parameters may lie on every process's devices,
    so the forward pass is one program of the whole job: every process calls `greedy_fn` with
    the same rows (given to the program as replicated host data; a process whose rows differ
    from process 0's raises), and every process gets the whole result. Scoring code that reads
    the same records on every process therefore computes the same figures everywhere."""
    from flax import nnx

    from hat_jax.sharding import check_same_on_all_processes, to_host

    graphdef, state = nnx.split(model)
    program = _greedy_program()

    def greedy_fn(ids: np.ndarray) -> np.ndarray:
        n = ids.shape[1]
        padded = np.zeros((ids.shape[0], -(-n // bucket) * bucket), dtype=np.int32)
        padded[:, :n] = ids
        segments = np.zeros_like(padded)
        segments[:, :n] = 1  # 0: padding
        check_same_on_all_processes([padded], "greedy_fn rows")  # nothing with one process
        return np.asarray(to_host(program(graphdef, state, padded, segments)))[:, :n]

    return greedy_fn


def tool_choice_evaluation(
    conversations: Sequence[Any], tokenizer: Any, *, enable_thinking: bool = True
) -> Callable[[Any], dict[str, float]]:
    """`model -> figures` for a training stage's evaluations: `tool_choice` (all calls),
    `tool_choice_first_turn` (calls of the first assistant turn), `tool_choice_later_turns`
    (calls of every later assistant turn), `tool_decision` (the calls whose name the turn's
    reasoning writes first, scored at that mention: where the tool is chosen; NaN when the
    reasoning names none) and `skill_decision` (the Skill each call of the Skill loader names,
    scored where it is first written; NaN when no call loads one)."""
    conversations = list(conversations)
    if not conversations:
        raise ValueError("tool_choice_evaluation: no conversations")

    def evaluate(model: Any) -> dict[str, float]:
        report = tool_choice(model_greedy_fn(model), conversations, tokenizer,
                             enable_thinking=enable_thinking)  # fmt: skip
        first = report["by_turn"].get("1", {"calls": 0, "right": 0})
        later = [v for k, v in report["by_turn"].items() if k != "1"]
        n_later, r_later = sum(v["calls"] for v in later), sum(v["right"] for v in later)
        nan = float("nan")
        return {
            "tool_choice": report["accuracy"],
            "tool_choice_first_turn": first["right"] / first["calls"] if first["calls"] else nan,
            "tool_choice_later_turns": r_later / n_later if n_later else nan,
            "tool_decision": report["reasoned"]["accuracy"],
            "skill_decision": report["skills"]["accuracy"],
        }

    return evaluate


def format_tool_choice(report: Mapping[str, Any]) -> str:
    """A plain-text table of a `tool_choice` report."""

    def line(label: str, t: Mapping[str, Any]) -> str:
        return f"  {label:<28} {t['right']:>5}/{t['calls']:<5} {100 * t['accuracy']:6.1f}%"

    out = [line("all calls", report)]
    out += [line(f"turn {k}", v) for k, v in report["by_turn"].items()]
    out += [line(f"{k} call of its turn", v) for k, v in report["by_index"].items() if v["calls"]]
    if report.get("reasoned", {}).get("calls"):
        d = report["reasoned"]
        out.append(line("named first in the reasoning", d)
                   + f"  (at the call {d['right_at_call']}/{d['calls']})")  # fmt: skip
    out += [line(name, v) for name, v in report["by_name"].items()]
    out += _confusion_lines("commonest wrong choices", report["confusions"])
    skills = report.get("skills", {})
    if skills.get("calls"):
        out.append(line("Skill named (where first written)", skills)
                   + f"  (at the argument {skills['right_at_argument']}/{skills['calls']})")  # fmt: skip
        out += [line(f"Skill {name}", v) for name, v in skills["by_skill"].items()]
        out += _confusion_lines("commonest wrong Skills", skills["confusions"])
    return "\n".join(out)
