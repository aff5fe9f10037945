"""A request to the agent: viewer comment(s) plus the context the prompt pipeline draws on.

Single-comment mode answers one comment; multi-comment mode answers a group of related comments
in one reply. `group_comments` forms those groups from a comment stream: comments are related
when the same viewer writes again within the window, or when they mention the same product.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hat_jax.harness._frozen import FrozenDict, freeze, thaw

MODES = ("single", "multi")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comment:
    """One viewer comment. `ts` is seconds on the stream clock (used to group comments)."""

    text: str
    viewer_id: str = "anonymous"
    handle: str = ""
    ts: float = 0.0

    def __post_init__(self):
        if not isinstance(self.text, str):
            raise TypeError(f"Comment.text must be a string, got {type(self.text).__name__}")
        if not self.handle:
            object.__setattr__(self, "handle", self.viewer_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "viewer_id": self.viewer_id,
            "handle": self.handle,
            "ts": self.ts,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class RequestContext:
    """What the prompt pipeline assembles: live-room state, the product on screen, a pool of
    candidate FAQ entries (the pipeline retrieves the top ones) and recent dialogue turns
    (`{"handle", "comment", "reply"}`)."""

    room: Mapping[str, Any] = dataclasses.field(default_factory=FrozenDict)
    product: Mapping[str, Any] | None = None
    faq_pool: tuple[Mapping[str, Any], ...] = ()
    history: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self):
        for name in ("room", "product", "faq_pool", "history"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data, computed once per context and shared: treat it as read-only."""
        return self._plain

    @functools.cached_property
    def _plain(self) -> dict[str, Any]:
        return {k: thaw(getattr(self, k)) for k in ("room", "product", "faq_pool", "history")}

    @functools.cached_property
    def renderings(self) -> dict[str, tuple[str, ...]]:
        """Memo of prompt text derived from this (immutable) context, by block: one context
        serves many runs (a group of rollouts, a Harness variant per run), so the prompt
        pipeline renders its product and room blocks once. Filled by the pipeline only."""
        return {}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One unit of work for `run_agent`.

    Attributes:
      request_id: caller-chosen id, copied into the trajectory.
      comments: the comment (single mode) or the related comments (multi mode), in time order.
      mode: "single" or "multi".
      context: room, product, FAQ pool and history.
      flags: annotations set by input hooks (e.g. "injection").
    """

    request_id: str
    comments: tuple[Comment, ...]
    mode: str = "single"
    context: RequestContext = dataclasses.field(default_factory=RequestContext)
    flags: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "comments", tuple(self.comments))
        object.__setattr__(self, "flags", tuple(self.flags))
        if self.mode not in MODES:
            raise ValueError(f"Request.mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "single" and len(self.comments) > 1:
            raise ValueError(
                f"single-comment mode takes one comment, got {len(self.comments)}; use mode='multi'"
            )

    @property
    def viewer_id(self) -> str:
        """The primary viewer (author of the first comment): target of private replies and of
        marketing actions."""
        return self.comments[0].viewer_id if self.comments else "anonymous"

    def tool_context(self) -> dict[str, str]:
        """Values for tools' context arguments (never chosen by the policy)."""
        return {
            "viewer_id": self.viewer_id,
            "room_id": str(self.context.room.get("room_id", "")),
            "now": str(self.context.room.get("now", "")),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "mode": self.mode,
            "comments": [c.to_dict() for c in self.comments],
            "context": self.context.to_dict(),
            "flags": list(self.flags),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        ctx = data.get("context") or {}
        return cls(
            request_id=data["request_id"],
            mode=data.get("mode", "single"),
            comments=tuple(Comment(**c) for c in data["comments"]),
            context=RequestContext(
                room=ctx.get("room") or {},
                product=ctx.get("product"),
                faq_pool=tuple(ctx.get("faq_pool") or ()),
                history=tuple(ctx.get("history") or ()),
            ),
            flags=tuple(data.get("flags") or ()),
        )


def group_comments(
    comments: Iterable[Comment],
    *,
    topics: Callable[[str], Iterable[str]] | None = None,
    window_s: float = 30.0,
    max_group: int = 5,
) -> list[tuple[Comment, ...]]:
    """Groups related comments for multi-comment mode.

    Two comments within `window_s` of each other are related when they share a viewer or a
    topic (`topics(text)` returns e.g. the product ids a comment mentions). Relation is
    transitive; groups keep time order and are split into chunks of at most `max_group`.

    Returns:
      The groups, ordered by their first comment.
    """
    items = sorted(comments, key=lambda c: c.ts)
    parent = list(range(len(items)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    keys = [set(topics(c.text)) if topics else set() for c in items]
    for i, a in enumerate(items):
        for j in range(i + 1, len(items)):
            b = items[j]
            if b.ts - a.ts > window_s:
                break
            if a.viewer_id == b.viewer_id or keys[i] & keys[j]:
                parent[find(j)] = find(i)
    groups: dict[int, list[Comment]] = {}
    for i, c in enumerate(items):
        groups.setdefault(find(i), []).append(c)
    out = []
    for members in sorted(groups.values(), key=lambda g: g[0].ts):
        out += [tuple(members[k : k + max_group]) for k in range(0, len(members), max_group)]
    return out
