"""In-context lookup items for the base stage's corpus: answers copied from the prompt.

Almost every decision of the live-room agent is a copy from its context: a tool's (possibly
renamed) name from the tool list, a product's name and id from a tool's result, a viewer's
handle from the message. A pretrained model copies from its first step; the demo's miniature
base starts from random weights, and teacher-forced probes of its HSA-SFT policy showed it
predicting the same tool name in every conversation (`hat_jax.eval.copy_score` measures the
ability). These items teach the base to copy, with answers that are right by construction:

- `repeat`: a line of names, codes and handles to repeat exactly;
- `table`: a small table of items (name, code, price); the answer is one cell, asked for by
  another cell of its row (the code of a name, the name of a code, the price of a name);
- `function`: a list of functions with one-line descriptions; the answer is the name of the
  one that does what the question asks (names are meaningful or arbitrary, as a renamed
  Harness's may be);
- `handle`: a viewer's message asking about an item; the answer greets the viewer by handle
  and names the item.

Every name, code and handle is invented from syllables (nothing from the live-room catalog,
viewers or tools), so the items teach the skill and not the agent's data. Every draw derives
from (split, seed).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

KINDS = ("repeat", "table", "function", "handle")
SCHEMA = "hat_jax.lookup/1"
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "kl",
           "st", "tr", "sh", "ch")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "s", "x", "l")
_GOODS = ("Lamp", "Kettle", "Scarf", "Backpack", "Mug", "Candle", "Blanket", "Notebook", "Pillow",
          "Jacket", "Teapot", "Umbrella", "Speaker", "Planter", "Towel", "Wallet")  # fmt: skip
# (verb, object, what the function does, what the question asks for in other words)
_JOBS = (
    ("get", "weather", "returns the weather forecast for a city", "to see tomorrow's weather"),
    ("find", "recipe", "searches recipes by ingredient", "to find a recipe that uses leeks"),
    ("track", "parcel", "reports where a parcel is", "to learn where a parcel is now"),
    ("convert", "currency", "converts an amount between currencies", "to turn euros into yen"),
    ("book", "table", "reserves a restaurant table", "to reserve a table for dinner"),
    ("send", "invoice", "emails an invoice to a customer", "to email a customer their invoice"),
    ("list", "trains", "lists train departures between two stations", "to see which trains leave"),
    ("set", "alarm", "sets an alarm at a given time", "to be woken at seven"),
    ("translate", "text", "translates text into another language", "to put a sentence in French"),
    ("play", "song", "plays a song by name", "to hear a song"),
    ("count", "steps", "counts the steps walked today", "to know how far you walked today"),
    ("check", "flight", "shows a flight's status", "to know if a flight is delayed"),
)
_GREETINGS = ("Hi", "Hello", "Thanks", "Welcome")


def _rng(split: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"lookup-items|{split}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(syllables))  # fmt: skip


def _name(rng: random.Random) -> str:
    return f"{_word(rng, rng.choice((2, 3))).capitalize()} {rng.choice(_GOODS)}"


def _code(rng: random.Random) -> str:
    letters = "".join(rng.choice("ABCDEFGHJKLMNPRSTVXZ") for _ in range(2))
    return f"{letters}-{rng.randrange(100, 1000)}"


def _handle(rng: random.Random) -> str:
    tail = rng.choice((str(rng.randrange(1, 100)), _word(rng, 1), ""))
    return "_".join(p for p in (_word(rng, rng.choice((1, 2))), _word(rng, 1), tail) if p)


def _distinct(make, rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = make(rng)
        if v not in out:
            out.append(v)
    return out


def _repeat(rng: random.Random) -> tuple[str, str, str]:
    makers = (_name, _code, _handle, lambda r: _word(r, rng.choice((1, 2, 3))))
    items = [rng.choice(makers)(rng) for _ in range(rng.randrange(3, 9))]
    line = " ".join(items)
    ask = rng.choice(("Repeat this line exactly: {x}", "Copy these words in the same order: {x}",
                      "Say back exactly what follows. {x}"))  # fmt: skip
    return ask.format(x=line), line, "The answer is the line itself, copied."


def _table(rng: random.Random) -> tuple[str, str, str]:
    n = rng.randrange(3, 8)
    names, codes = _distinct(_name, rng, n), _distinct(_code, rng, n)
    prices = [rng.randrange(5, 500) for _ in range(n)]
    rows = "\n".join(f"- {a} | code {c} | {p} yuan" for a, c, p in zip(names, codes, prices))
    i = rng.randrange(n)
    field = rng.choice(("code", "name", "price"))
    if field == "code":
        question, answer = f"What is the code of the {names[i]}?", codes[i]
    elif field == "name":
        question, answer = f"Which item has the code {codes[i]}?", names[i]
    else:
        question, answer = f"How much is the {names[i]}?", f"{prices[i]} yuan"
    key = codes[i] if field == "name" else names[i]
    prompt = f"Items:\n{rows}\n{question} Answer with the {field} only."
    return prompt, answer, f"The row of {key} gives the {field}: {answer}."


def _function(rng: random.Random) -> tuple[str, str, str]:
    jobs = rng.sample(_JOBS, rng.randrange(3, 7))
    arbitrary = rng.random() < 0.5  # a renamed list: names say nothing about the job
    names = (_distinct(lambda r: f"{_word(r, 2)}_{_word(r, 1)}", rng, len(jobs)) if arbitrary
             else [f"{verb}_{obj}" for verb, obj, _, _ in jobs])  # fmt: skip
    lines = "\n".join(f"- {n}: {what}" for n, (_, _, what, _) in zip(names, jobs))
    i = rng.randrange(len(jobs))
    prompt = (f"You can call these functions:\n{lines}\nWhich function would you call "
              f"{jobs[i][3]}? Answer with its name only.")  # fmt: skip
    return prompt, names[i], f"The function that {jobs[i][2]} is {names[i]}."


def _handle_item(rng: random.Random) -> tuple[str, str, str]:
    handle, name = _handle(rng), _name(rng)
    ask = rng.choice(("is the {x} still available?", "how much is the {x}?",
                      "can you show the {x} again?", "does the {x} ship today?"))  # fmt: skip
    greeting = rng.choice(_GREETINGS)
    prompt = (f"A viewer writes. @{handle}: {ask.format(x=name)}\nReply to the viewer by "
              "handle and name the item they asked about.")  # fmt: skip
    answer = f"{greeting} @{handle}! You asked about the {name}; let me check that for you."
    return prompt, answer, f"Address @{handle} and name the {name}."


_MAKERS = {"repeat": _repeat, "table": _table, "function": _function, "handle": _handle_item}


def generate(split: str, size: int, seed: int = 0, *, reasoning_share: float = 0.5
             ) -> list[dict[str, Any]]:  # fmt: skip
    """`size` records `{"id", "messages": [user, assistant], "kind", "answer", "source"}`, the
    kinds in turn; `reasoning_share` of the answers carry a one-line reasoning (where the
    answer is found), the rest none."""
    if size < 0:
        raise ValueError(f"lookup items: size must be >= 0, got {size}")
    rng = _rng(split, seed)
    records = []
    for i in range(size):
        kind = KINDS[i % len(KINDS)]
        prompt, answer, why = _MAKERS[kind](rng)
        reply: dict[str, Any] = {"role": "assistant", "content": answer}
        if rng.random() < reasoning_share:
            reply["reasoning_content"] = why
        records.append({
            "id": f"lookup-{split}-{i:06d}",
            "messages": [{"role": "user", "content": prompt}, reply],
            "kind": kind,
            "answer": answer,
            "source": SCHEMA,
        })  # fmt: skip
    return records
