"""The names a policy writes under renamed tools and Skills: copied from the list, or memorised?

The HAT claim rests on one behaviour: when the Harness renames a tool or a Skill (T2's held-out
edits, HSA's renames in training), the policy calls it by the name its context shows, not by
the name it was trained on. A score alone cannot tell the two apart (both fail the call), so
the evaluation counts, for every agent item, each tool call and each Skill load by the name it
wrote:

- ``listed``: the renamed name the item's tool list (or Skill catalogue) shows;
- ``training``: the original name of a tool or Skill this item renamed (memorised);
- ``unrenamed``: a name this item did not rename (right or wrong, it is the listed one);
- ``unknown``: any other name (a name of another edit, an invented one).

`copy_share` is listed / (listed + training): among the calls that clearly meant a renamed
tool or Skill, the share written by its listed name. Items without renames add only
``unrenamed`` and ``unknown`` counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CLASSES = ("listed", "training", "unrenamed", "unknown")
LOAD_SKILL = "load_skill"


def _classify(name: Any, renames: Mapping[str, str], known: bool) -> str:
    if not isinstance(name, str):  # a malformed argument (a list, a number ...)
        return "unknown"
    if name in renames:
        return "listed"
    if name in renames.values():
        return "training"
    return "unrenamed" if known else "unknown"


def name_counts(trajectory: Mapping[str, Any]) -> dict[str, int]:
    """Counts `tool/<class>` and `skill/<class>` (`CLASSES`) over one trajectory's tool calls
    (`Trajectory.to_dict()`). A tool call's name is known when the runtime resolved it
    (`canonical` set); a Skill load's name when the Skill loaded (`loaded_skills`)."""
    renames = trajectory.get("renames") or {}
    tools, skills = renames.get("tools") or {}, renames.get("skills") or {}
    loaded = set(trajectory.get("loaded_skills") or ())
    counts = {f"{kind}/{c}": 0 for kind in ("tool", "skill") for c in CLASSES}
    for call in trajectory.get("tool_calls") or ():
        known = call.get("canonical") is not None
        counts[f"tool/{_classify(call.get('name'), tools, known)}"] += 1
        arguments = call.get("arguments")
        if call.get("canonical") == LOAD_SKILL and isinstance(arguments, Mapping):
            skill = arguments.get("name")
            known_skill = isinstance(skill, str) and skill in loaded
            counts[f"skill/{_classify(skill, skills, known_skill)}"] += 1
    return counts


def total_counts(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The sum of the records' `names` counts (`name_counts`); empty when none has any."""
    total: dict[str, int] = {}
    for r in records:
        for key, n in (r.get("names") or {}).items():
            total[key] = total.get(key, 0) + int(n)
    return total


def copy_share(counts: Mapping[str, int], kind: str) -> float | None:
    """listed / (listed + training) for `kind` ("tool" or "skill"); None when neither occurred."""
    listed, training = counts.get(f"{kind}/listed", 0), counts.get(f"{kind}/training", 0)
    return listed / (listed + training) if listed + training else None


def names_table(counts: Mapping[str, int]) -> list[str]:
    """Markdown rows: calls by class and the copy share, for tool calls and Skill loads."""
    if not counts:
        return []
    lines = [
        "| written name | listed (renamed) | training (memorised) | not renamed | unknown "
        "| copy share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, label in (("tool", "tool calls"), ("skill", "Skill loads")):
        share = copy_share(counts, kind)
        cells = [str(counts.get(f"{kind}/{c}", 0)) for c in CLASSES]
        shown = "-" if share is None else f"{100 * share:.1f}"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {shown} |")
    return lines
