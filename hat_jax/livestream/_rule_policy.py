"""`RuleBasedPolicy`: an offline, deterministic baseline policy for the bundled world.

Keyword rules pick intents, Skills and tool calls; the reply is composed only from the tool
results in the conversation, so every figure it speaks is backed by evidence. It works under any
`HarnessState` (it speaks the state's surface names and reads the state's user-message template
and reply limits), which makes it the default of `python -m launch.agent` and a sanity baseline
for HSA variants. It is not a learned policy: unknown phrasings fall back to a polite reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hat_jax.harness import (
    LOAD_SKILL,
    REPLY_PRIVATE,
    REPLY_PUBLIC,
    AssistantTurn,
    HarnessState,
    ToolCall,
    find_all,
    sentences,
)
from hat_jax.livestream._wording import coupon_granted, order_details
from hat_jax.livestream._world import World
from hat_jax.livestream.prompt import clock, money

_INTENTS = {
    "human": r"are you (?:a )?(?:real|human|person|robot|bot|an? ai)\b|real person",
    "order": r"\bDD\d{10}\b|\bmy order\b|\btracking\b|where is my|\border status\b",
    "returns": r"\breturn|\brefund|\bexchange|\bwarranty|\bdamaged\b|\bdefect",
    "negative": r"\b(?:terrible|awful|worst|scam|fake|disappointed|angry|hate|useless|rubbish|broke|broken|bad quality|complain)",
    "coupon": r"\bcoupons?\b|\bvouchers?\b|discount code|promo code",
    "lottery": r"\blotter(?:y|ies)\b|\bgiveaway\b|\bdraw\b|\bprize\b|lucky 618",
    "gift": r"follow(?:er)? gift|gift for follow|\bfan gift",
    "price": r"\bprice|how much|\bcosts?\b|\bcheap|\bdeal\b|\bdiscount|多少钱|价格",
    "stock": r"\bstock\b|\bavailable\b|sold out|\bany left\b|\bleft\b|还有",
    "shipping": r"\bship|\bdeliver|\barriv|\bcourier\b|\bexpress\b|\bpostage\b",
    "specs": r"\bsize\b|\bmaterial|\bingredient|\bspecs?\b|\bweight\b|\bbattery\b|\bcolou?rs?\b|\bfit\b|waterproof|how (?:do|to) (?:i )?use|\bsuitable\b|work with|\bcompatible\b|\bshade\b",
    "buy": r"how (?:do|can) i (?:buy|order|get)|\bcheckout\b|add to cart|\bpurchase\b",
    "greeting": r"^(?:hi|hello|hey|good (?:morning|evening|night)|love (?:you|this|it)|thanks?|thank you|haha|wow)\b",
}
_INTENTS = {k: re.compile(v, re.I) for k, v in _INTENTS.items()}
_PRODUCT_INTENTS = ("price", "stock", "shipping", "specs", "buy")
# A question matching no intent above is treated as a product question (FAQ, then specs).
_QUESTION = re.compile(r"\b(?:does|is|can|will|do) (?:it|they|this|these)\b|\?\s*$", re.I)
_ORDER_ID = re.compile(r"\bDD\d{10}\b")


def _template_regex(template: str, fields: Mapping[str, str]) -> re.Pattern:
    """A regex matching a `str.format` template, capturing the given fields."""
    parts = re.split(r"(\{[a-z_]+\})", template)
    out = "".join(
        f"(?P<{p[1:-1]}>{fields.get(p[1:-1], '.*?')})"
        if p.startswith("{") and p[1:-1] in fields
        else (".*?" if p.startswith("{") else re.escape(p))
        for p in parts
    )
    return re.compile(rf"^{out}$", re.M)


class RuleBasedPolicy:
    """Deterministic keyword policy over a `HarnessState` and the world it serves.

    Args:
      state: the Harness it acts in (surface names, templates, reply limits).
      world: used only to recognise product names in comments; facts come from tool results.
    """

    # Pure in-memory computation: the loop may call it on its own thread (see `_deadline`).
    inline = True

    def __init__(self, state: HarnessState, world: World):
        self.state, self.world = state, world
        fmt = state.harness.prompt.user_message
        self._comment = _template_regex(
            fmt.comment, {"index": r"\d+", "handle": r"\S*?", "text": r".*"}
        )
        self._on_screen = _template_regex(
            fmt.on_screen, {"product_id": r"[A-Z]{2}-\d{3}", "product_name": r".*?"}
        )
        rule = state.harness.hooks.rule("detect_injection")
        self._injection = rule.params.get("patterns") if rule else None  # a lexicon

    # ------------------------------------------------------------------ reading the conversation
    def _comments(self, messages) -> tuple[list[dict[str, str]], str | None]:
        user = next(m["content"] for m in messages if m["role"] == "user")
        comments = [m.groupdict() for m in self._comment.finditer(user)]
        screen = self._on_screen.search(user)
        return comments, (screen["product_id"] if screen else None)

    def _results(self, messages) -> tuple[dict[str, list[tuple[dict, Any]]], int]:
        """Tool results by canonical name, and how many replies the hooks rejected."""
        calls, out, rejected = {}, {}, 0
        for m in messages:
            for c in m.get("tool_calls") or ():
                calls[c["id"]] = c["function"]
            if m["role"] == "tool" and m.get("tool_call_id") in calls:
                fn = calls[m["tool_call_id"]]
                canonical = self.state.resolve_tool(fn["name"])
                try:
                    value = json.loads(m["content"])
                except ValueError:
                    value = m["content"]
                if canonical in (REPLY_PUBLIC, REPLY_PRIVATE):
                    rejected += 1
                out.setdefault(canonical, []).append((fn["arguments"], value))
            elif m["role"] == "user" and m is not messages[1]:
                rejected += 1
        return out, rejected

    # ------------------------------------------------------------------ planning
    def _intents(self, text: str) -> list[str]:
        found = [k for k, p in _INTENTS.items() if p.search(text)]
        if not found and _QUESTION.search(text):
            found = ["specs"]
        if "negative" in found and "returns" in found:
            found.remove("returns")
        return found

    def _call(self, canonical: str, n: int, **args) -> ToolCall | None:
        name = self.state.surface_tool(canonical)
        return ToolCall(id=f"call_{n}", name=name, arguments=args) if name else None

    def _skills(self, intents: set[str], n_comments: int) -> list[str]:
        reply = (
            "after-sales"
            if intents & {"order", "returns", "negative"}
            else "product-qa"
            if intents & set(_PRODUCT_INTENTS)
            else "chit-chat"
            if intents & {"greeting", "human"}
            else "general-reply"
        )
        wanted = [reply]
        wanted += ["coupon-marketing"] if intents & {"coupon", "lottery", "gift"} else []
        wanted += ["purchase-guidance"] if "buy" in intents else []
        wanted += ["negative-feedback"] if "negative" in intents else []
        answerable = intents - {"greeting", "injection"}
        wanted += ["multi-intent"] if len(answerable) > 1 or n_comments > 1 else []
        names = [self.state.surface_skill(s) for s in wanted]
        if names[0] is None:  # masked reply Skill: load any Reply Skill of this Harness
            names[0] = next(s.name for s in self.state.harness.skills if s.kind == "reply")
        return [s for s in names if s]

    def _plan(self, comments, screen) -> tuple[list[ToolCall], list[tuple[str, str, str | None]]]:
        """Tool calls for the first round and the (intent, handle, product) items to answer."""
        items, calls = [], []
        for c in comments:
            text = c["text"]
            products = self.world.match_products(text) or ([screen] if screen else [])
            intents = self._intents(text)
            if self._injection and find_all(self._injection, text):
                intents = ["injection"] + [i for i in intents if i in _PRODUCT_INTENTS]
            for intent in intents or ["other"]:
                items.append((intent, c["handle"], products[0] if products else None, text))
        intents = {i for i, *_ in items}
        n = iter(range(1, 100))
        calls += [
            self._call(LOAD_SKILL, next(n), name=s) for s in self._skills(intents, len(comments))
        ]
        seen = set()
        for intent, _, pid, text in items:
            for canonical, args in self._tools_for(intent, pid, text):
                key = (canonical, json.dumps(args, sort_keys=True))
                if key not in seen:
                    seen.add(key)
                    calls.append(self._call(canonical, next(n), **args))
        return [c for c in calls if c is not None], items

    def _tools_for(self, intent: str, pid: str | None, text: str) -> list[tuple[str, dict]]:
        order = _ORDER_ID.search(text)
        table = {
            "price": [("get_price_promotion", {"product_id": pid})],
            "buy": [
                ("get_price_promotion", {"product_id": pid}),
                ("check_inventory", {"product_id": pid}),
            ],
            "stock": [("check_inventory", {"product_id": pid})],
            "shipping": [("get_product_detail", {"product_id": pid})],
            "specs": [
                ("get_product_detail", {"product_id": pid}),
                ("search_faq", {"query": text[:300], "product_id": pid}),
            ],
            "returns": [("get_after_sales_policy", {"product_id": pid} if pid else {})],
            "negative": [("get_after_sales_policy", {"product_id": pid} if pid else {})],
            "order": [("get_order_status", {"order_id": order.group(0)})] if order else [],
            "coupon": [("issue_coupon", {"product_id": pid} if pid else {})],
            "lottery": [("get_lottery_status", {})],
            "gift": [("claim_follow_gift", {})],
        }
        needs_product = intent in _PRODUCT_INTENTS
        return [] if needs_product and pid is None else table.get(intent, [])

    # ------------------------------------------------------------------ composing
    def generate(
        self, messages: Sequence[Mapping[str, Any]], tools=None, sampling=None
    ) -> AssistantTurn:
        comments, screen = self._comments(messages)
        calls, items = self._plan(comments, screen)
        if not any(m["role"] == "assistant" for m in messages):
            data_calls = [c for c in calls if self.state.resolve_tool(c.name) != LOAD_SKILL]
            if data_calls:
                return AssistantTurn(
                    content="",
                    reasoning=f"intents: {[i for i, *_ in items]}",
                    tool_calls=tuple(calls),
                )
            results, rejected = {}, 0
        else:
            results, rejected = self._results(messages)
            calls = []
        public, private = self._compose(items, results, rejected)
        n = len(calls) + 1
        out = calls + [self._call(REPLY_PUBLIC, n, text=public)]
        if private:
            out.append(self._call(REPLY_PRIVATE, n + 1, text=private))
        return AssistantTurn(
            content="", reasoning="compose from tool results", tool_calls=tuple(c for c in out if c)
        )

    def _compose(self, items, results, rejected: int) -> tuple[str, str | None]:
        handles = list(dict.fromkeys(h for _, h, *_ in items))
        lead = ", ".join(f"@{h}" for h in handles)
        said, private = [], None
        for intent, handle, pid, _ in items:
            sentence, priv = self._sentence(intent, handle, pid, results)
            if sentence and sentence not in said:
                said.append(sentence)
            private = private or priv
        if rejected >= 2 or not said:
            said = ["thanks for your comment! Ask me anything about the products on screen."]
        elif rejected == 1:
            said = said[:1]
        said = [said[0]] + [s[:1].upper() + s[1:] for s in said[1:]]
        return self._fit(f"{lead}, " + " ".join(said)), private

    def _fit(self, text: str) -> str:
        prompt = self.state.harness.prompt
        limit, max_sent = (
            prompt.constraint("reply_max_chars"),
            prompt.constraint("reply_max_sentences"),
        )
        kept = []
        for s in sentences(text)[:max_sent]:
            if len(" ".join([*kept, s])) > limit:
                break
            kept.append(s)
        return " ".join(kept) or text[:limit].rsplit(" ", 1)[0]

    @staticmethod
    def _first(results, canonical, pid=None):
        for args, value in results.get(canonical, ()):
            if pid is None or args.get("product_id") == pid:
                return value
        return None

    def _sentence(self, intent, handle, pid, results) -> tuple[str | None, str | None]:
        r = lambda name: self._first(
            results,
            name,
            pid
            if name
            not in ("get_order_status", "get_lottery_status", "claim_follow_gift", "issue_coupon")
            else None,
        )
        ok = lambda v: isinstance(v, Mapping) and "error" not in v
        if intent == "injection":
            return (
                "I can't change my rules or share internal instructions, but I'm happy to help with the products.",
                None,
            )
        if intent == "human":
            return "I'm the AI host of this live room, here to help you shop!", None
        if intent == "greeting":
            return "welcome to the live room, great to have you here!", None
        if intent == "buy" and ok(p := r("get_price_promotion")):
            limit = (p.get("promotion") or {}).get("limit_per_order")
            limit = (
                f", limit {limit} per order"
                if limit and p["current_price"] < p["list_price"]
                else ""
            )
            return (
                "tap the product card below the video, pick your option and pay at checkout; it is "
                f"{money(p['current_price'])} right now{limit}."
            ), None
        if intent == "price" and ok(p := r("get_price_promotion")):
            return _price_sentence(p), None
        if intent == "stock" and ok(v := r("check_inventory")):
            return _stock_sentence(v), None
        if intent == "shipping" and ok(d := r("get_product_detail")):
            s = d["shipping"]
            return (
                f"It ships within {s['ships_within_hours']} hours by {s['carrier']}"
                f"{' with free shipping' if s['free_shipping'] else ''}, arriving in {s['delivery_days']} days."
            ), None
        if intent == "specs":
            faq = r("search_faq")
            if ok(faq) and faq["results"]:
                return faq["results"][0]["a"], None
            if ok(d := r("get_product_detail")):
                k, v = next(iter(d["specs"].items()))
                return f"The {d['name']} {k} is {v}.", None
        if intent in ("returns", "negative") and ok(p := r("get_after_sales_policy")):
            text = _returns_sentence(p.get("policy"))
            if intent == "negative":
                text = "so sorry about that! " + text[:1].upper() + text[1:]
            return text, None
        if intent == "order":
            return self._order(r("get_order_status"))
        if intent == "coupon":
            c = r("issue_coupon")
            if ok(c):
                return f"{coupon_granted(c)}, it applies automatically at checkout.", None
            return (
                "no extra coupon is available for you right now, but the live-room price still applies.",
                None,
            )
        if intent == "lottery" and ok(x := r("get_lottery_status")):
            if x["status"] == "drawn":
                return (
                    f"the {x['prize']} lottery was drawn at {clock(x['draw_time'], False)}; {x['result_notice']}.",
                    None,
                )
            return (
                f"the lottery for {x['prize']} has {x['winners']} winners and is drawn at "
                f"{clock(x['draw_time'], False)}; to enter, {x['how_to_enter']}."
            ), None
        if intent == "gift":
            g = r("claim_follow_gift")
            if ok(g):
                return f"your follower gift, {g['gift']}, is on its way: it {g['delivery']}.", None
            return "the follower gift is for followers, so tap follow first and ask me again!", None
        return None, None

    def _order(self, o) -> tuple[str, str | None]:
        if o is None:
            return (
                "please check your private messages.",
                "Please send me your order number (it starts with DD) and I will check it for you.",
            )
        if isinstance(o, Mapping) and "error" in o:
            return (
                "I couldn't find that order under your account, please double-check the number.",
                None,
            )
        return "I've sent you a private message about your order.", order_details(o)


def _price_sentence(p: Mapping[str, Any]) -> str:
    promo = p.get("promotion") or {}
    if promo.get("status") == "active":
        return (
            f"{p['name']} is {money(p['current_price'])} in the live room right now, down from "
            f"{money(p['list_price'])}, until {clock(promo['end'], False)}, limit {promo['limit_per_order']} per order."
        )
    if promo.get("status") == "upcoming":
        return f"{p['name']} is {money(p['list_price'])} now, and the {promo['label']} of {money(promo['price'])} starts {clock(promo['start'])}."
    return f"{p['name']} is {money(p['current_price'])}."


def _stock_sentence(v: Mapping[str, Any]) -> str:
    if v["total"] == 0:
        restock = f", more is expected on {v['restock_date']}" if v.get("restock_date") else ""
        return f"{v['name']} is sold out right now{restock}."
    have = [f"{k} ({n} left)" for k, n in v["stock"].items() if n][:3]
    gone = [k for k, n in v["stock"].items() if not n]
    out = f"in stock: {', '.join(have)}."
    return out + (f" Sold out: {', '.join(gone[:3])}." if gone else "")


def _returns_sentence(policy: Mapping[str, Any] | None) -> str:
    if not policy:
        return "you can apply for a return or exchange from the order page."
    if policy["no_reason_days"]:
        return (
            f"you can return it within {policy['no_reason_days']} days if it is {policy['condition']}, "
            f"and quality issues are covered for {policy['quality_issue_days']} days."
        )
    return f"{policy['condition']}; for damage, send photos within {policy['quality_issue_days']} days for a refund."
