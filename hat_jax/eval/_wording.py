"""The automatic check of the Harness-edit test (paper §5.5): is a reply worded as a live host
speaks to the room?

`host_wording(reply, fallback=...)` returns the problems found, in a fixed order:

- `no reply`: nothing was said.
- `fallback`: the Harness's conservative reply (the loop's, after the policy failed), not the
  policy's own words.
- `internals`: the reply exposes the machinery: tool calls or results, loading Skills, the
  system prompt, identifiers such as `get_price`, JSON, an API or database, an AI or a
  language model (product words such as
  "functions" or "tool kit" are not flagged).
- `uncertainty`: the reply exposes the host's own uncertainty ("I'm not sure", "I don't
  know", "maybe", "I can't tell", "no information") instead of a fact or a hand-over (a fact
  such as "I couldn't find that order" is not uncertainty).
- `markup`: markdown, links, emoji or line breaks (the speech-format Hook removes them from a
  public reply; they show here only when that Hook is off).

English and Chinese phrasings are both matched (after the Guardrails' text folding).
"""

from __future__ import annotations

import re

from hat_jax import harness as hx

CATEGORIES = ("no reply", "fallback", "internals", "uncertainty", "markup")

_INTERNALS = re.compile(
    r"\b(?:tool (?:calls?|results?|outputs?)|(?:the|my|a) tools?\b(?! ?(?:kit|set|box|bag))|"
    r"function calls?|(?:load|loaded|loading) (?:the |a )?skills?|skills? (?:file|loaded)|"
    r"system prompt|my (?:instructions|rules say)|json|api|backend|database|as an ai|"
    r"an ai (?:model|assistant)|language model|llm|call(?:s|ed|ing)? (?:the |a )?\w+ tool)\b|"
    r"(?<![@\w])[a-z]+(?:_[a-z0-9]+)+\b|"  # an identifier such as get_price (not @a_handle)
    r"调用工具|工具返回|系统提示|提示词|数据库|人工智能|语言模型"
)
_UNCERTAIN = re.compile(
    r"\b(?:i(?:'m| am) not (?:sure|certain)|not sure|i (?:do not|don't|dont) know|no idea|"
    r"maybe|perhaps|probably|i (?:can't|cannot|couldn't|could not) (?:tell|confirm|say)|"
    r"(?:no|(?:do not|don't) have (?:any |the )?)information|unable to (?:confirm|tell))\b|"
    r"不确定|不知道|不清楚|可能|也许|大概|没有信息"
)


def host_wording(reply: str, *, fallback: str = "") -> tuple[str, ...]:
    """The problems (`CATEGORIES`, in order) of a reply as a host's spoken words."""
    text = (reply or "").strip()
    if not text:
        return ("no reply",)
    if fallback and " ".join(text.split()) == " ".join(fallback.split()):
        return ("fallback",)
    folded = hx.fold(text)
    found = []
    if _INTERNALS.search(folded):
        found.append("internals")
    if _UNCERTAIN.search(folded):
        found.append("uncertainty")
    if hx.to_speech(text)[1]:
        found.append("markup")
    return tuple(found)
