"""The bundled, reviewed paraphrase bank that offline Harness-State Augmentation draws from.

The bank (`hat_jax/hsa/bank/*.yaml`) holds alternative names for every Harness v0 Skill and
tool, paraphrases of descriptions, Skill rules, prompt items and Hook messages, structural
variants (hook envelopes, user-message layouts, fallback replies, block titles) and synthetic
Skills. Every text paraphrase is stored with the `source` text it was reviewed against and is
looked up by that text, so an operator's edit to a Skill or a prompt item silently disables its
stale paraphrases instead of reintroducing old wording. A Skill's description, intro or rule and
a tool's description may hold a list of such entries instead of one: released Harnesses that
share a Skill or tool name but word it differently (Harness v0 and the micro room's compact
Harness) each get their own reviewed `source`. Loading checks the bank itself: names are valid
identifiers and unique, paraphrases keep the source's placeholders exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
import string
from collections.abc import Mapping
from typing import Any

import yaml

from hat_jax import harness as hx

BANK_DIR = pathlib.Path(__file__).resolve().parent / "bank"
SKILL_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")
_PLACEHOLDER = re.compile(r"\{(?:tool|skill|const|room):[A-Za-z0-9_.\-]+\}")


class BankError(ValueError):
    """The paraphrase bank is malformed; `.problems` names each file, key and problem."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        super().__init__("invalid paraphrase bank:\n  " + "\n  ".join(self.problems))


def normalize(text: str) -> str:
    """Whitespace-normalised text: the key paraphrases are stored and looked up by."""
    return " ".join(str(text).split())


def markers(text: str) -> list[str]:
    """Placeholders and format fields a rewrite must keep: `{tool:x}`-style placeholders and
    `{field}` names of `str.format` templates (hook messages), as a sorted set."""
    found = _PLACEHOLDER.findall(text)
    rest = _PLACEHOLDER.sub("", text)
    try:
        found += [f"{{{f}}}" for _, f, _, _ in string.Formatter().parse(rest) if f]
    except ValueError:
        found.append("<unbalanced braces>")
    return sorted(set(found))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticSkill:
    """A Skill HSA may add: `plausible` (looks real, covers no bundled task) or noise."""

    name: str
    kind: str
    description: str
    allowed_tools: tuple[str, ...]
    rules: tuple[str, ...]
    noise: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bank:
    """Everything offline rewriting can draw from (see module docstring).

    Attributes:
      texts: (kind, normalised source) -> paraphrases. Kinds: `skill.description`,
        `skill.intro`, `skill.rule`, `tool.description`, `tool.parameter`, `prompt.item`,
        `hook.message`.
      names: ("skill" | "tool", canonical name) -> alternative names.
      skill_titles: canonical Skill -> alternative body headings.
      block_titles: prompt block id -> alternative titles.
      envelopes: hook-message envelopes (`{hook}`, `{message}`).
      user_messages: user-turn layouts (`header`, `on_screen`, `comment`).
      fallback_replies: conservative replies.
      synthetic: Skills that may be added.
    """

    texts: Mapping[tuple[str, str], tuple[str, ...]]
    names: Mapping[tuple[str, str], tuple[str, ...]]
    skill_titles: Mapping[str, tuple[str, ...]]
    block_titles: Mapping[str, tuple[str, ...]]
    envelopes: tuple[str, ...]
    user_messages: tuple[Mapping[str, str], ...]
    fallback_replies: tuple[str, ...]
    synthetic: tuple[SyntheticSkill, ...]

    def paraphrases(self, kind: str, text: str) -> tuple[str, ...]:
        """Reviewed paraphrases of `text` (empty when the bank has none for this exact text)."""
        return self.texts.get((kind, normalize(text)), ())


class _Collector:
    def __init__(self):
        self.problems: list[str] = []
        self.texts: dict[tuple[str, str], tuple[str, ...]] = {}

    def variants(self, file: str, key: str, kind: str, entry: Any) -> None:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("source"), str):
            self.problems.append(f"{file}: {key}: needs a 'source' string and 'paraphrases'")
            return
        paras = entry.get("paraphrases")
        if not isinstance(paras, list) or not paras or not all(isinstance(p, str) for p in paras):
            self.problems.append(f"{file}: {key}: 'paraphrases' must be a non-empty string list")
            return
        source, want = normalize(entry["source"]), markers(entry["source"])
        for i, p in enumerate(paras):
            if markers(p) != want:
                self.problems.append(
                    f"{file}: {key}.paraphrases[{i}]: placeholders {markers(p)} differ from "
                    f"the source's {want}"
                )
            if normalize(p) == source:
                self.problems.append(f"{file}: {key}.paraphrases[{i}]: identical to the source")
        self.texts[(kind, source)] = tuple(normalize(p) for p in paras)

    def names(self, file: str, key: str, names: Any, pattern: re.Pattern) -> tuple[str, ...]:
        if not isinstance(names, list) or not names:
            self.problems.append(f"{file}: {key}.names: must be a non-empty list")
            return ()
        bad = [n for n in names if not isinstance(n, str) or not pattern.match(n)]
        if bad:
            self.problems.append(f"{file}: {key}.names: invalid names {bad}")
        return tuple(n for n in names if n not in bad)


def _read(directory: pathlib.Path, name: str, problems: list[str]) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load((directory / name).read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{name}: missing (looked in {directory})")
        return {}
    except yaml.YAMLError as err:
        problems.append(f"{name}: invalid YAML: {err}")
        return {}
    if not isinstance(data, Mapping):
        problems.append(f"{name}: top level must be a mapping")
        return {}
    return data


def _entries(key: str, entry: Any) -> list[tuple[str, Any]]:
    """A text field's reviewed entries with their keys: one entry, or a list of them (one per
    wording of the field in a released Harness), keyed `key[i]`."""
    if isinstance(entry, list):
        return [(f"{key}[{i}]", e) for i, e in enumerate(entry)]
    return [(key, entry)]


def _skills(c: _Collector, data: Mapping, names: dict, titles: dict) -> None:
    for skill, entry in data.items():
        if not isinstance(entry, Mapping):
            c.problems.append(f"skills.yaml: {skill}: must be a mapping")
            continue
        names[("skill", skill)] = c.names("skills.yaml", skill, entry.get("names"), SKILL_NAME)
        titles[skill] = tuple(entry.get("title") or ())
        for field in ("description", "intro"):
            if field in entry:
                for key, e in _entries(f"{skill}.{field}", entry[field]):
                    c.variants("skills.yaml", key, f"skill.{field}", e)
        for number, rule in (entry.get("rules") or {}).items():
            for key, e in _entries(f"{skill}#{number}", rule):
                c.variants("skills.yaml", key, "skill.rule", e)


def _tools(c: _Collector, data: Mapping, names: dict) -> None:
    for tool, entry in (data.get("tools") or {}).items():
        names[("tool", tool)] = c.names("tools.yaml", tool, entry.get("names"), TOOL_NAME)
        if "description" in entry:
            for key, e in _entries(f"{tool}.description", entry["description"]):
                c.variants("tools.yaml", key, "tool.description", e)
    for i, entry in enumerate(data.get("parameters") or ()):
        c.variants("tools.yaml", f"parameters[{i}]", "tool.parameter", entry)


def _synthetic(c: _Collector, data: Mapping) -> tuple[SyntheticSkill, ...]:
    out = []
    for group in ("plausible", "noise"):
        for i, s in enumerate(data.get(group) or ()):
            key = f"synthetic.yaml: {group}[{i}]"
            try:
                skill = SyntheticSkill(
                    name=s["name"],
                    kind=s["kind"],
                    description=normalize(s["description"]),
                    allowed_tools=tuple(s.get("allowed_tools") or ()),
                    rules=tuple(normalize(r) for r in s["rules"]),
                    noise=group == "noise",
                )
            except (KeyError, TypeError) as err:
                c.problems.append(f"{key}: missing or malformed field {err}")
                continue
            if not SKILL_NAME.match(skill.name) or skill.kind not in hx.SKILL_KINDS:
                c.problems.append(f"{key}: bad name {skill.name!r} or kind {skill.kind!r}")
            out.append(skill)
    return tuple(out)


def _check_names(c: _Collector, names: Mapping, synthetic) -> None:
    """No alternative name may be used twice, or equal a canonical or synthetic name."""
    for kind in ("skill", "tool"):
        canonical = {k for (t, k) in names if t == kind}
        reserved = canonical | ({s.name for s in synthetic} if kind == "skill" else set())
        seen: dict[str, str] = {}
        for (t, k), alternatives in names.items():
            if t != kind:
                continue
            for n in alternatives:
                if n in reserved:
                    c.problems.append(f"{kind} {k}: alternative name {n!r} is reserved")
                if n in seen and seen[n] != k:
                    c.problems.append(f"{kind} name {n!r} is offered for {seen[n]} and {k}")
                seen[n] = k


def _structure(c: _Collector, hooks: Mapping, prompt: Mapping) -> dict[str, Any]:
    envelopes = tuple(hooks.get("envelopes") or ())
    for e in envelopes:
        if "{message}" not in e:
            c.problems.append(f"hooks.yaml: envelope {e!r} lacks {{message}}")
    layouts = tuple(hooks.get("user_messages") or ())
    for i, u in enumerate(layouts):
        if not isinstance(u, Mapping) or "{text}" not in str(u.get("comment", "")):
            c.problems.append(f"hooks.yaml: user_messages[{i}] needs a comment with {{text}}")
    for hook, entry in (hooks.get("messages") or {}).items():
        c.variants("hooks.yaml", f"messages.{hook}", "hook.message", entry)
    for i, item in enumerate(prompt.get("items") or ()):
        c.variants("prompt.yaml", f"items[{i}]", "prompt.item", item)
    return {
        "envelopes": envelopes,
        "user_messages": tuple(dict(u) for u in layouts),
        "fallback_replies": tuple(normalize(r) for r in hooks.get("fallback_replies") or ()),
        "block_titles": {k: tuple(v) for k, v in (prompt.get("block_titles") or {}).items()},
    }


def load_bank(directory: str | pathlib.Path | None = None) -> Bank:
    """Loads and checks a paraphrase bank folder (default: the bundled one).

    Raises:
      BankError: every problem found, naming file and key.
    """
    directory = pathlib.Path(directory) if directory is not None else BANK_DIR
    c, names, titles = _Collector(), {}, {}
    files = {n: _read(directory, f"{n}.yaml", c.problems) for n in ("skills", "tools", "prompt")}
    files.update(hooks=_read(directory, "hooks.yaml", c.problems))
    files.update(synthetic=_read(directory, "synthetic.yaml", c.problems))
    _skills(c, files["skills"], names, titles)
    _tools(c, files["tools"], names)
    synthetic = _synthetic(c, files["synthetic"])
    _check_names(c, names, synthetic)
    structure = _structure(c, files["hooks"], files["prompt"])
    if c.problems:
        raise BankError(c.problems)
    return Bank(texts=c.texts, names=names, skill_titles=titles, synthetic=synthetic, **structure)


@functools.cache
def default_bank() -> Bank:
    """The bundled bank, loaded once per process."""
    return load_bank()
