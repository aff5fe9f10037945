"""Harness edits: a revision of the system prompt and Skills, written down as data, applied
with the model's weights fixed (paper §2.3 and the Harness-edit test of §5.5).

An edit file (YAML) names what it changes; nothing else of the Harness moves:

    name: host-voice
    description: Speak as the host; never expose tools or uncertainty.
    prompt:                       # blocks of prompt.yaml, by id
      - block: global_rules
        add: ["Speak as the host in the room ..."]          # items appended to the block
        replace: [{old: "say you will check", new: "say the team will confirm it"}]
    skills:                       # Skills, by name
      - skill: product-qa
        add: ["Give the fact you found in one confident sentence."]   # rules appended
        replace: [{old: "...", new: "..."}]                            # in the Skill's rules

`replace` rewrites the text of every item (rule) of that block (Skill) holding `old`, and
fails when none does. Added text may use the Harness's placeholders ({tool:NAME},
{skill:NAME}, {const:NAME}); the edited Harness is validated (`validate`) and refused, with
every problem named, when a placeholder or anything else no longer holds. An edited Harness
has a new `version` (a content hash), so every run records which revision it ran under.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from hat_jax.harness._loader import HarnessError, Problem
from hat_jax.harness._spec import Harness, Rule
from hat_jax.harness._validate import validate_harness


@dataclasses.dataclass(frozen=True)
class EditPart:
    """What an edit does to one prompt block or one Skill."""

    target: str  # a prompt block id or a Skill name
    add: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()  # (old, new) pairs


@dataclasses.dataclass(frozen=True)
class HarnessEdit:
    """A named revision of the system prompt and Skills (see the module docstring)."""

    name: str
    description: str = ""
    prompt: tuple[EditPart, ...] = ()
    skills: tuple[EditPart, ...] = ()
    source: str = ""  # the file it came from

    @property
    def digest(self) -> str:
        """A content hash (16 hex digits) of what the edit changes (not its source path)."""
        body = dataclasses.asdict(self)
        body.pop("source")
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "digest": self.digest, "source": self.source}


def _parts(data: Any, key: str, target_key: str, file: str, problems: list[Problem]):
    out = []
    if data is None:
        return ()
    if not isinstance(data, list):
        problems.append(Problem(file, key, f"expected a list, got {type(data).__name__}"))
        return ()
    for i, entry in enumerate(data):
        where = f"{key}[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get(target_key), str):
            problems.append(Problem(file, where, f"expected a mapping with a {target_key!r} name"))
            continue
        unknown = sorted(set(entry) - {target_key, "add", "replace"})
        if unknown:
            problems.append(Problem(file, where, f"unknown field(s) {unknown}"))
        add = entry.get("add") or []
        if not isinstance(add, list) or not all(isinstance(a, str) and a.strip() for a in add):
            problems.append(Problem(file, f"{where}.add", "expected a list of non-empty strings"))
            add = []
        pairs = []
        for j, r in enumerate(entry.get("replace") or []):
            if not (isinstance(r, Mapping) and isinstance(r.get("old"), str) and r["old"]
                    and isinstance(r.get("new"), str)):  # fmt: skip
                problems.append(Problem(file, f"{where}.replace[{j}]",
                                        "expected {old: <non-empty text>, new: <text>}"))  # fmt: skip
                continue
            pairs.append((r["old"], r["new"]))
        if not add and not pairs:
            problems.append(Problem(file, where, "changes nothing (no 'add' or 'replace')"))
        out.append(EditPart(entry[target_key], tuple(" ".join(a.split()) for a in add),
                            tuple(pairs)))  # fmt: skip
    return tuple(out)


def parse_edit(data: Any, file: str = "<edit>") -> HarnessEdit:
    """An edit from its YAML data (`HarnessError` lists every problem, file and field named)."""
    problems: list[Problem] = []
    if not isinstance(data, Mapping):
        raise HarnessError([Problem(file, "<root>", "expected a mapping")])
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(Problem(file, "name", "missing"))
    unknown = sorted(set(data) - {"name", "description", "prompt", "skills"})
    if unknown:
        problems.append(Problem(file, "<root>", f"unknown field(s) {unknown}"))
    prompt = _parts(data.get("prompt"), "prompt", "block", file, problems)
    skills = _parts(data.get("skills"), "skills", "skill", file, problems)
    if not prompt and not skills and not problems:
        problems.append(Problem(file, "<root>", "changes nothing (no 'prompt' or 'skills')"))
    if problems:
        raise HarnessError(problems)
    return HarnessEdit(name=name, description=str(data.get("description") or ""),
                       prompt=prompt, skills=skills, source=file)  # fmt: skip


def load_edit(path: str | pathlib.Path) -> HarnessEdit:
    """Reads an edit file (`HarnessError` names the file and each problem)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Harness edit {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise HarnessError([Problem(str(path), "<root>", f"not valid YAML: {err}")]) from err
    return parse_edit(data, str(path))


def _rewrite(texts: Sequence[str], part: EditPart, where: str, problems: list[Problem]):
    out = list(texts)
    for old, new in part.replace:
        hits = [i for i, t in enumerate(out) if old in t]
        if not hits:
            problems.append(Problem(where, "replace", f"no text holds {old!r}"))
        for i in hits:
            out[i] = out[i].replace(old, new)
    return out + list(part.add)


def apply_edit(harness: Harness, edit: HarnessEdit) -> Harness:
    """The Harness with the edit applied, validated.

    Raises:
      HarnessError: the edit names a block or Skill the Harness lacks, a `replace` matches no
        text, or the edited Harness does not validate (every problem named).
    """
    problems: list[Problem] = []
    src = edit.source or edit.name
    blocks = {b.id: b for b in harness.prompt.blocks}
    new_blocks = dict(blocks)
    for part in edit.prompt:
        block = blocks.get(part.target)
        if block is None:
            problems.append(Problem(src, "prompt", f"no prompt block {part.target!r} (blocks: "
                                    f"{sorted(blocks)})"))  # fmt: skip
            continue
        items = _rewrite(new_blocks[part.target].items, part, f"{src}: block {part.target}",
                         problems)  # fmt: skip
        new_blocks[part.target] = dataclasses.replace(block, items=tuple(items))
    skills = {s.name: s for s in harness.skills}
    for part in edit.skills:
        skill = skills.get(part.target)
        if skill is None:
            problems.append(Problem(src, "skills", f"no Skill {part.target!r} (Skills: "
                                    f"{sorted(skills)})"))  # fmt: skip
            continue
        texts = _rewrite([r.text for r in skill.rules], part, f"{src}: Skill {part.target}",
                         problems)  # fmt: skip
        old = skill.rules
        rules = tuple(dataclasses.replace(old[i], text=t) if i < len(old) else
                      Rule(id=f"{skill.name}#{i + 1}", text=t) for i, t in enumerate(texts))  # fmt: skip
        skills[part.target] = dataclasses.replace(skill, rules=rules)
    if problems:
        raise HarnessError(problems)
    prompt = dataclasses.replace(harness.prompt,
                                 blocks=tuple(new_blocks[b.id] for b in harness.prompt.blocks))  # fmt: skip
    edited = dataclasses.replace(harness, prompt=prompt,
                                 skills=tuple(skills[s.name] for s in harness.skills))  # fmt: skip
    found = validate_harness(edited)
    if found:
        raise HarnessError([Problem(src, f"{p.file}: {p.field}", p.message) for p in found])
    return edited
