"""General verifiable-instruction SFT data: the base stage's corpus, prompts with their answers.

HAT starts from a base model with general ability (paper §3): HSA-SFT may erode it and
General OPD pulls the SFT policy back toward it. The demo's tiny model starts from random
weights, so its miniature base is trained first on this data, written programmatically:

- prompts: a task from the topic bank (`data/instructions/general_topics.json`: a task, a
  title, two topical keywords and six plain sentences per topic; no topic is one of the
  evaluation's general set, `hat_jax.eval._general.TASKS`, or of OPD's prompts,
  `data/instructions/demo.jsonl`), then 0-3 compatible constraints (`CONFLICTS`) of the types
  of `CONSTRAINT_TYPES`, each stated in one of several phrasings (the evaluation's among
  them) with parameters drawn from wider ranges than the evaluation's;
- answers: `respond` composes one from the topic's sentences so that it satisfies every
  constraint, and a prompt is kept only if `check_constraints` agrees (strictly); prompts the
  responder cannot satisfy are redrawn and counted;
- reasoning: half the answers carry a one-line plan (`plan`: what each constraint asks) as
  their reasoning, the other half none, so the base answers in both thinking modes (an empty
  reasoning renders as the closed think block a non-thinking prompt ends with);
- lookup items (`lookup_share` of the records, `data._lookup`): answers copied from the
  prompt (a line repeated, a table's cell, a listed function's name, a viewer's handle), the
  in-context copying the agent task is made of and a model from random weights lacks;
- splits: `train` and `dev` draw from disjoint topics (every fifth topic is dev), so the dev
  loss measures instruction following on unseen topics.

Every draw derives from (seed, split), so a corpus is reproducible. `write_general_corpus`
writes `<split>.jsonl` and `<split>.manifest.json` (`config.states = "general"`, what
`launch.sft`'s `harness_mode="general"` expects) atomically. The manifest also records the
`floor`: IFEval's figures for the dev prompts answered on topic but ignoring every instruction
(the topic's first sentences), the score a model that learned the topics and not the
instructions would get.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from data import _instructions as ins
from data import _lookup
from hat_jax import files

SCHEMA = "hat_jax.general/1"
STATES = "general"  # the manifest's config.states: a corpus with no Harness
TOPICS_PATH = pathlib.Path(__file__).resolve().parent / "instructions" / "general_topics.json"
SPLITS = ("train", "dev")
_DEV_EVERY = 5
# Share of answers with a reasoning line (`plan`): those teach the thinking mode (the
# generation prompt opens a think block), the rest the non-thinking one (an empty block).
REASONING_SHARE = 0.5
_FILLERS = ("very", "really", "basically", "just", "thing", "simply", "actually", "stuff")
_START = ("My answer:", "In short", "Here goes", "Good question.", "To begin", "Here is my answer:")
_END = ("Hope this helps.", "That is all.", "Thanks for reading.", "Have a nice day.", "The end.")
# type -> phrasings; {v}: the value, {a} {b}: keywords, {w}: the word, {p}: the phrase
PHRASINGS: dict[str, tuple[str, ...]] = {
    "max_words": ("Keep your answer to {v} words or fewer.", "Answer in no more than {v} words.",
                  "Use at most {v} words."),
    "min_words": ("Write at least {v} words.", "Your answer must be {v} words or longer."),
    "max_sentences": ("Use at most {v} sentences.", "Answer in {v} sentences or fewer.",
                      "Do not write more than {v} sentences."),
    "num_bullets": ("Give exactly {v} bullet points, each on its own line starting with '- '.",
                    "Answer as a list of exactly {v} bullet points that start with '- '."),
    "num_paragraphs": ("Write exactly {v} paragraphs separated by blank lines.",
                       "Split your answer into {v} paragraphs with a blank line between them."),
    "include_keywords": ('Include the words "{a}" and "{b}".',
                         'Make sure to use the words "{a}" and "{b}".',
                         'Mention "{a}" and "{b}" in your answer.'),
    "exclude_words": ('Do not use the word "{w}".', 'Avoid the word "{w}".',
                      'Never use the word "{w}" in your answer.'),
    "no_commas": ("Do not use any commas.", "Write without a single comma.",
                  "Avoid commas entirely."),
    "all_lowercase": ("Use only lowercase letters.", "Write your whole answer in lowercase.",
                      "No capital letters are allowed."),
    "all_uppercase": ("Use only capital letters.", "Write your whole answer in uppercase.",
                      "Answer in all capital letters."),
    "start_with": ('Begin your response with "{p}".', 'Start your answer with the words "{p}".'),
    "end_with": ('Finish your response with the exact phrase "{p}".', 'End your answer with "{p}".'),
    "json_format": ("Format the whole answer as valid JSON.",
                    "Wrap your entire answer in JSON format."),
    "quotation": ("Put your whole response inside double quotation marks.",
                  "Wrap your entire answer in double quotes."),
    "title": ("Add a title in double angular brackets, like <<title>>.",
              "Give your answer a title wrapped in double angular brackets, such as <<my title>>."),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Topic:
    """One task of the bank: its prompt, a title, two topical keywords, plain sentences (no
    commas, no question or exclamation marks, so the responder controls every count)."""

    task: str
    title: str
    keywords: tuple[str, ...]
    sentences: tuple[str, ...]


@functools.cache
def load_topics(path: str | None = None) -> tuple[Topic, ...]:
    """The topic bank. ValueError names a topic whose sentences the responder cannot use."""
    path = pathlib.Path(path) if path else TOPICS_PATH
    topics = tuple(
        Topic(t["task"], t["title"], tuple(t["keywords"]), tuple(t["sentences"]))
        for t in json.loads(path.read_text(encoding="utf-8"))
    )
    for t in topics:
        bad = [s for s in t.sentences if re.search(r"[,?!]", s)]
        missing = [k for k in t.keywords if not any(_has_word(s, k) for s in t.sentences)]
        if bad or missing or len(t.sentences) < 5:
            raise ValueError(
                f"{path}: topic {t.task!r}: needs at least 5 sentences without , ? or ! "
                f"(bad: {bad}) that use each keyword (missing: {missing})"
            )
    return topics


def split_topics(split: str, topics: Sequence[Topic] | None = None) -> tuple[Topic, ...]:
    """The topics a split draws from (dev: every fifth topic; train: the rest)."""
    if split not in SPLITS:
        raise ValueError(f"the general corpus has splits {SPLITS}, not {split!r}")
    topics = load_topics() if topics is None else topics
    dev = split == "dev"
    return tuple(t for i, t in enumerate(topics) if (i % _DEV_EVERY == _DEV_EVERY - 1) == dev)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", text, re.I) is not None


def _draw_constraint(kind: str, rng: random.Random, topic: Topic) -> tuple[dict, str]:
    """A constraint of type `kind` for `topic` with drawn parameters, and its sentence."""
    c: dict[str, Any] = {"type": kind}
    fill: dict[str, Any] = {}
    if kind == "max_words":
        c["value"] = fill["v"] = rng.choice((20, 25, 30, 40, 50, 60, 70))
    elif kind == "min_words":
        c["value"] = fill["v"] = rng.choice((25, 30, 40, 50, 60))
    elif kind == "max_sentences":
        c["value"] = fill["v"] = rng.choice((1, 2, 3, 4))
    elif kind == "num_bullets":
        c["value"] = fill["v"] = rng.choice((2, 3, 4, 5))
    elif kind == "num_paragraphs":
        c["value"] = fill["v"] = rng.choice((2, 3, 4))
    elif kind == "include_keywords":
        c["keywords"] = list(topic.keywords)
        fill["a"], fill["b"] = topic.keywords
    elif kind == "exclude_words":
        if rng.random() < 0.5:  # a filler word, as the evaluation asks
            word = rng.choice(_FILLERS)
        else:  # a word the topic's sentences use: the answer must leave some out
            words = sorted({w.lower() for s in topic.sentences for w in re.findall(r"[A-Za-z]{4,}", s)}
                           - {k.lower() for k in topic.keywords})  # fmt: skip
            word = rng.choice(words)
        c["words"] = [word]
        fill["w"] = word
    elif kind == "start_with":
        c["phrase"] = fill["p"] = rng.choice(_START)
    elif kind == "end_with":
        c["phrase"] = fill["p"] = rng.choice(_END)
    return c, rng.choice(PHRASINGS[kind]).format(**fill)


def _body(sentences: Sequence[str], constraints: Mapping[str, Mapping[str, Any]]) -> str:
    if "num_bullets" in constraints:
        return "\n".join(f"- {s}" for s in sentences)
    if "num_paragraphs" in constraints:
        n = constraints["num_paragraphs"]["value"]
        cuts = [round(i * len(sentences) / n) for i in range(n + 1)]  # n contiguous groups
        groups = [sentences[a:b] for a, b in zip(cuts, cuts[1:])]
        return "\n\n".join(" ".join(g) for g in groups)
    return " ".join(sentences)


def _assemble(topic: Topic, sentences: Sequence[str], constraints: Mapping[str, Mapping]) -> str:
    body = _body(sentences, constraints)
    if "json_format" in constraints:
        text = json.dumps({"answer": body}, ensure_ascii=False)
    else:
        block = "num_bullets" in constraints or "num_paragraphs" in constraints
        text = f"<<{topic.title}>>\n{body}" if "title" in constraints else body
        if "start_with" in constraints:
            sep = "\n" if block or "title" in constraints else " "
            text = constraints["start_with"]["phrase"] + sep + text
        if "end_with" in constraints:
            text = text + ("\n" if "num_bullets" in constraints else " ")
            text += constraints["end_with"]["phrase"]
        if "quotation" in constraints:
            text = f'"{text}"'
    if "all_lowercase" in constraints:
        text = text.lower()
    if "all_uppercase" in constraints:
        text = text.upper()
    return text


def respond(
    topic: Topic, constraints: Sequence[Mapping[str, Any]], rng: random.Random
) -> str | None:
    """An answer on `topic` that satisfies every constraint (checked), or None if none of the
    responder's candidates does (e.g. 5 bullets with a 20-word limit)."""
    by_type = {c["type"]: c for c in constraints}
    excluded = [w for c in constraints if c["type"] == "exclude_words" for w in c["words"]]
    pool = [s for s in topic.sentences if not any(_has_word(s, w) for w in excluded)]
    required: list[str] = []
    for k in by_type.get("include_keywords", {}).get("keywords", ()):
        if not any(_has_word(s, k) for s in required):
            required += [s for s in pool if _has_word(s, k)][:1]
    rest = [s for s in pool if s not in required]
    counts = list(range(1, len(pool) + 1))
    if "num_bullets" in by_type:
        counts = [by_type["num_bullets"]["value"]]
    elif "num_paragraphs" in by_type:
        counts = [n for n in counts if n >= by_type["num_paragraphs"]["value"]]
    preferred = rng.choice((2, 3, 3, 4))
    counts.sort(key=lambda n: (abs(n - preferred), n))  # the preferred length, then nearest
    for n in counts:
        if n < len(required) or n > len(pool):
            continue
        chosen = set(required + rest[: n - len(required)])
        sentences = [s for s in topic.sentences if s in chosen]  # the topic's own order
        text = _assemble(topic, sentences, by_type)
        if all(ins.check_constraints(text, constraints)):
            return text
    return None


# type -> a short note of what the constraint asks, for the answer's reasoning
_NOTES = {
    "max_words": "at most {value} words", "min_words": "at least {value} words",
    "max_sentences": "at most {value} sentences", "num_bullets": "exactly {value} bullets",
    "num_paragraphs": "exactly {value} paragraphs", "include_keywords": "use {keywords}",
    "exclude_words": "avoid {words}", "no_commas": "no commas",
    "all_lowercase": "lowercase only", "all_uppercase": "capitals only",
    "start_with": 'start with "{phrase}"', "end_with": 'end with "{phrase}"',
    "json_format": "valid JSON", "quotation": "inside double quotes", "title": "a <<title>>",
}  # fmt: skip


def plan(constraints: Sequence[Mapping[str, Any]]) -> str:
    """The answer's reasoning: one line naming what each constraint asks."""
    if not constraints:
        return "No format constraints."
    quoted = lambda ws: " and ".join(f'"{w}"' for w in ws)  # noqa: E731
    notes = [_NOTES[c["type"]].format(**{k: quoted(v) if isinstance(v, list) else v
                                         for k, v in c.items()}) for c in constraints]  # fmt: skip
    return "Constraints: " + "; ".join(notes) + "."


def floor_response(topic: Topic) -> str:
    """An on-topic answer that ignores every instruction: the topic's first three sentences."""
    return " ".join(topic.sentences[:3])


def _rng(split: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"general-corpus|{split}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate(
    split: str, size: int, seed: int = 0, *, lookup_share: float = 0.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`size` records with distinct prompts, and statistics (constraint counts, redrawn
    prompts, the floor). `lookup_share` of them (rounded) are in-context lookup items
    (`data._lookup`: `{"id", "messages", "kind", "answer"}`), shuffled among the instruction
    records (`{"id", "messages": [user, assistant], "constraints", "topic"}`).

    Raises:
      ValueError: unknown split, `lookup_share` outside [0, 1), or the bank cannot give the
        instruction records distinct answerable prompts.
    """
    if not 0.0 <= lookup_share < 1.0:
        raise ValueError(f"general corpus: lookup_share must be in [0, 1), got {lookup_share}")
    lookups = _lookup.generate(split, round(size * lookup_share), seed,
                               reasoning_share=REASONING_SHARE)  # fmt: skip
    records, summary = _instructions(split, size - len(lookups), seed)
    if lookups:
        records = records + lookups
        random.Random(f"general-mix|{split}|{seed}").shuffle(records)
        summary["records"] = len(records)
        summary["lookup"] = dict(sorted(Counter(r["kind"] for r in lookups).items()))
    return records, summary


def _instructions(split: str, size: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The instruction records of `generate` and their statistics."""
    topics, kinds = split_topics(split), sorted(ins.CONSTRAINT_TYPES)
    rng = _rng(split, seed)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    stats: Counter = Counter()
    floor = []
    for _ in range(size * 20):
        if len(records) == size:
            break
        topic = rng.choice(topics)
        chosen: list[str] = []
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3))):
            chosen.append(rng.choice([k for k in kinds if ins.compatible(k, chosen)]))
        pairs = [_draw_constraint(k, rng, topic) for k in chosen]
        text = " ".join([topic.task, *(sentence for _, sentence in pairs)])
        if text in seen:
            stats["duplicate_prompts"] += 1
            continue
        constraints = [ins.validate_constraint(c) for c, _ in pairs]
        answer = respond(topic, constraints, rng)
        if answer is None:
            stats["unanswerable_prompts"] += 1
            continue
        seen.add(text)
        stats.update(f"constraint:{c['type']}" for c in constraints)
        floor.append((floor_response(topic), constraints))
        reply = {"role": "assistant", "content": answer}
        if rng.random() < REASONING_SHARE:
            reply["reasoning_content"] = plan(constraints)
        records.append({
            "id": f"general-{split}-{len(records):06d}",
            "messages": [{"role": "user", "content": text}, reply],
            "constraints": constraints,
            "topic": topic.task,
            "source": SCHEMA,
        })  # fmt: skip
    if len(records) < size:
        raise ValueError(
            f"general-{split}: the topic bank gives only {len(records)} distinct answerable "
            f"prompts, not {size}"
        )
    summary = {
        "records": len(records),
        "topics": len({r["topic"] for r in records}),
        "constraints": dict(
            sorted((k.split(":", 1)[1], v) for k, v in stats.items() if k.startswith("constraint:"))
        ),  # fmt: skip
        "duplicate_prompts": stats["duplicate_prompts"],
        "unanswerable_prompts": stats["unanswerable_prompts"],
        "floor": ins.pass_rates([r for r, _ in floor], [c for _, c in floor]),
    }
    return records, summary


def write_general_corpus(
    out: str | pathlib.Path, *, train: int, dev: int = 0, seed: int = 0, lookup_share: float = 0.0
) -> dict[str, dict[str, Any]]:
    """Writes `<out>/<split>.jsonl` and `<split>.manifest.json` for train (and dev when
    `dev > 0`), `lookup_share` of each split in-context lookup items; a split whose manifest
    exists with the same config is kept. Returns each split's manifest."""
    out = pathlib.Path(out)
    manifests = {}
    for split, size in (("train", train), ("dev", dev)):
        if size <= 0:
            continue
        path = out / f"{split}.manifest.json"
        config = {"states": STATES, "split": split, "size": size, "seed": seed}
        if lookup_share:  # absent at 0: corpora written before the field stay valid
            config["lookup_share"] = lookup_share
        if path.is_file():
            old = json.loads(path.read_text())
            if old.get("config") == config and (out / f"{split}.jsonl").is_file():
                manifests[split] = old
                continue
        records, summary = generate(split, size, seed, lookup_share=lookup_share)
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        files.write_text(out / f"{split}.jsonl", lines)
        manifest = {"schema": SCHEMA, "config": config, **summary}
        files.write_json(path, manifest)  # last: its presence means the split is complete
        manifests[split] = manifest
    return manifests
