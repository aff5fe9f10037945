"""Training data and training of the learned injection detector (`_detector`).

Attacks come from templates filled from slot banks (`data/guard/attacks.yaml`), in English
and Simplified Chinese; Traditional Chinese is the Simplified expansion converted by OpenCC,
mixed text fills a template's slots from both banks, and a share of every text (attacks and
benign alike, so obfuscation itself is no signal) gets an obfuscated copy: full-width forms,
look-alike letters, invisible characters, case, spaced or leet letters, spaces inside Chinese,
a friendly prefix. Benign texts are the caller's (the simulator's comments, the world's
strings) plus `data/guard/benign.yaml`. The model is scikit-learn's logistic regression
(liblinear, fixed seed) over the detector's own hashed n-grams, exported to numpy arrays; the
threshold sits a margin above the highest benign logit (obfuscated copies aside: a
letter-spaced JSON key is no text anyone sends; `negatives_flagged` counts them all). The
held-out files (`HELDOUT`, `heldout_benign.yaml`) are only read for evaluation. This module
imports scikit-learn and OpenCC when training; the detector's runtime (`_detector`) needs numpy
and the guardrails' fold only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import pathlib
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import yaml

from hat_jax.harness import _detector
from hat_jax.harness._detector import NGRAMS, WINDOW, Detector, feature_text, load, save
from hat_jax.harness._detector import default as shipped

LANGS = ("en", "zh-Hans", "zh-Hant", "mixed")
_SLOT = re.compile(r"\{(\w+)\}")
_ZW = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u202e", "\u2066", "\u2069"]
_CYRILLIC = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "i": "і", "x": "х", "y": "у"}
_LEET = str.maketrans({"o": "0", "i": "1", "e": "3", "a": "4", "s": "5", "t": "7"})
_PREFIXES = ["hi! ", "主播好 ", "love this stream, ", "serum? ", "哈哈 ", "btw ", "@host "]
_SUFFIXES = [" thx", " 谢谢", " pls", "!!", " 😂", " ok?", "～"]
_CJK = re.compile(r"[\u3400-\u9fff]")


@dataclasses.dataclass(frozen=True)
class Example:
    text: str
    family: str
    lang: str


def data_dir() -> pathlib.Path:
    return _detector.default_path().parent


# ---------------------------------------------------------------------------------- expansion
def _fill(template: str, banks: Sequence[Mapping[str, list]], rng: random.Random) -> str:
    def one(m: re.Match) -> str:
        bank = rng.choice(banks)
        if m.group(1) not in bank:
            bank = banks[0]
        value = rng.choice(bank[m.group(1)])
        value = _fill(str(value), banks, rng)
        return f" {value} " if len(banks) > 1 else value

    return (
        " ".join(_SLOT.sub(one, template).split()) if len(banks) > 1 else _SLOT.sub(one, template)
    )


def _handle(text: str, rng: random.Random) -> str:
    words = re.findall(r"\w+", text)
    style = rng.randrange(4)
    if style == 3:
        return "".join(w[:1].upper() + w[1:] for w in words)[:40]
    return ["_", ".", "-"][style].join(words)[:40]


@functools.cache
def _converters():
    import opencc

    return opencc.OpenCC("s2t"), opencc.OpenCC("s2tw")


def to_traditional(text: str, rng: random.Random) -> str:
    """`text` in Traditional Chinese (OpenCC's s2t or s2tw, drawn)."""
    return rng.choice(_converters()).convert(text)


def expand(path: str | pathlib.Path, *, per_template: int, seed: int) -> list[Example]:
    """Every family's templates filled `per_template` times in each language (duplicates
    dropped, order deterministic in `seed`)."""
    data = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    slots, rng, out = data["slots"], random.Random(seed), []
    for family, by_lang in data["families"].items():
        for lang, templates in by_lang.items():
            other = "zh" if lang == "en" else "en"
            for template in templates:
                for _ in range(per_template):
                    text = _fill(template, [slots[lang]], rng)
                    mixed = _fill(template, [slots[lang], slots[other]], rng)
                    rows = [(text, "en" if lang == "en" else "zh-Hans"), (mixed, "mixed")]
                    if lang == "zh":
                        rows.append((to_traditional(text, rng), "zh-Hant"))
                    if rng.random() < 0.3:
                        rows.append((to_traditional(mixed, rng), "mixed"))
                    for t, lg in rows:
                        t = _handle(t, rng) if family == "handle" else t
                        out.append(Example(t, family, lg))
    return list(dict.fromkeys(out))


def obfuscate(text: str, rng: random.Random) -> str:
    """One drawn obfuscation of `text` (see module docstring)."""
    kind = rng.randrange(9)
    if kind == 0:
        return "".join(
            chr(ord(c) + 0xFEE0) if "!" <= c <= "~" and rng.random() < 0.6 else c for c in text
        )
    if kind == 1:
        return "".join(_CYRILLIC.get(c, c) if rng.random() < 0.5 else c for c in text)
    if kind == 2:
        return "".join(c + (rng.choice(_ZW) if rng.random() < 0.25 else "") for c in text)
    if kind == 3:
        return "".join(c.upper() if rng.random() < 0.5 else c for c in text)
    if kind == 4:
        words = text.split(" ")
        i = rng.randrange(len(words))
        words[i] = " ".join(words[i])
        return " ".join(words)
    if kind == 5:
        return text.translate(_LEET) if not _CJK.search(text) else text.replace("优惠", "优 惠")
    if kind == 6:
        return "".join(c + (" " if _CJK.match(c) and rng.random() < 0.3 else "") for c in text)
    if kind == 7:
        return rng.choice(_PREFIXES) + text
    return text + rng.choice(_SUFFIXES)


def with_obfuscations(examples: Iterable[Example], *, share: float, seed: int) -> list[Example]:
    """`examples` plus an obfuscated copy of a `share` of them."""
    rng, out = random.Random(seed), []
    for e in examples:
        out.append(e)
        if rng.random() < share:
            out.append(dataclasses.replace(e, text=obfuscate(e.text, rng)))
    return list(dict.fromkeys(out))


def json_strings(value: Any) -> Iterable[str]:
    """Every string (keys and values) of a JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield k
            yield from json_strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from json_strings(v)


# ---------------------------------------------------------------------------------- held out
HELDOUT = ("heldout_attacks.yaml", "heldout_attacks_b.yaml", "heldout_attacks_c.yaml")
HELDOUT_BENIGN = ("heldout_benign.yaml", "heldout_benign_c.yaml")


def _data_file(path: str | pathlib.Path | None, default: str) -> pathlib.Path:
    """`path`, a bare file name looked up in `data_dir()`, or `default` there."""
    if path is not None and "/" in str(path):
        return pathlib.Path(path)
    return data_dir() / (path or default)


def heldout_attacks(path: str | pathlib.Path | None = None) -> list[Example]:
    """Held-out attacks (default: the first set, `HELDOUT[0]`; a bare file name is looked up
    in `data_dir()`); a `split` entry's comments joined by a space."""
    path = _data_file(path, HELDOUT[0])
    data = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    out = []
    for family, by_lang in data["families"].items():
        for lang, texts in by_lang.items():
            out += [Example(t if isinstance(t, str) else " ".join(t), family, lang) for t in texts]
    return out


def heldout_benign(path: str | pathlib.Path | None = None) -> list[Example]:
    """Held-out benign questions (default: the first set, `HELDOUT_BENIGN[0]`; a bare file
    name is looked up in `data_dir()`)."""
    path = _data_file(path, HELDOUT_BENIGN[0])
    data = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    return [Example(t, "benign", lang) for lang, ts in data["questions"].items() for t in ts]


def written_benign(path: str | pathlib.Path | None = None) -> list[Example]:
    """The written benign comments of `benign_comments.yaml` (training negatives), by language."""
    path = path or data_dir() / "benign_comments.yaml"
    data = yaml.safe_load(pathlib.Path(path).read_text(encoding="utf-8"))
    return [Example(t, "written", lang) for lang, ts in data["comments"].items() for t in ts]


# ---------------------------------------------------------------------------------- training
@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    bits: int = 18
    c: float = 4.0  # inverse L2 strength of the logistic regression
    margin: float = 0.5  # logits between the highest benign text and the threshold
    seed: int = 0


def _matrix(texts: Sequence[str], bits: int):
    """Rows of L2-normalised binary n-gram features; a long text is trained on its first
    window (the threshold is still set on every window's score)."""
    from scipy import sparse

    rows, cols, vals = [], [], []
    for r, text in enumerate(texts):
        windows = _detector.window_ids(text, bits)
        ids = sorted(set(windows[0])) if windows else []
        rows += [r] * len(ids)
        cols += ids
        vals += [1.0 / math.sqrt(len(ids))] * len(ids)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(texts), 1 << bits))


def texts_hash(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def data_hashes(positives: Sequence[Example], negatives: Sequence[Example]) -> dict[str, str]:
    """`data_hash` of the labelled training texts and `feature_hash` of what the model reads
    of them (it changes when the guardrails' normalisation does)."""
    rows = [(1, e.text) for e in positives] + [(0, e.text) for e in negatives]
    return {
        "data_hash": texts_hash(f"{label}\t{text}" for label, text in rows),
        "feature_hash": texts_hash(f"{label}\t{feature_text(text)}" for label, text in rows),
    }


def train(
    positives: Sequence[str],
    negatives: Sequence[str],
    config: TrainConfig,
    *,
    benign: Sequence[str] | None = None,
) -> tuple[Detector, dict]:
    """Fits the model, exports it to a `Detector` and sets its threshold `config.margin` logits
    above the highest of `benign` (default: every negative; the trainer passes the negatives
    without their obfuscated copies, since a letter-spaced JSON key is no text anyone sends).
    Returns the detector and its training figures."""
    from sklearn.linear_model import LogisticRegression

    x = _matrix([*positives, *negatives], config.bits)
    y = np.r_[np.ones(len(positives)), np.zeros(len(negatives))]
    model = LogisticRegression(
        C=config.c, solver="liblinear", class_weight="balanced", random_state=config.seed
    )
    model.fit(x, y)
    weights = model.coef_[0].astype(np.float32)
    bias = float(model.intercept_[0])
    raw = Detector(weights, bias, 1.0)
    neg = np.array([raw.logit(t) for t in (negatives if benign is None else benign)])
    every_neg = np.array([raw.logit(t) for t in negatives])
    pos = np.array([raw.logit(t) for t in positives])
    cut = float(neg.max()) + config.margin
    detector = dataclasses.replace(raw, threshold=1.0 / (1.0 + math.exp(-cut)))
    figures = {
        "positives": len(positives),
        "negatives": len(negatives),
        "highest_benign_logit": round(float(neg.max()), 4),
        "threshold_logit": round(cut, 4),
        "train_recall": round(float((pos >= cut).mean()), 4),
        "negatives_flagged": int((every_neg >= cut).sum()),
        "nonzero_weights": int(np.count_nonzero(weights)),
    }
    return detector, figures


def scenario_texts(scenarios: Iterable[Any]) -> tuple[list[str], list[str]]:
    """The viewer-controlled texts of simulator scenarios (comments, handles, history comments),
    unique, as (benign, attacks): the comments of a scenario with an `injection` intent are
    attacks, its handles and history are not."""
    benign, attacks = {}, {}
    for s in scenarios:
        attack = any(i.kind == "injection" for i in s.gold.intents)
        for c in s.comments:
            (attacks if attack else benign)[c.text] = None
            benign[c.handle] = None
        benign.update((h["comment"], None) for h in s.history if "comment" in h)
    benign = {t: None for t in benign if t and t not in attacks}
    return list(benign), list(attacks)


def model_hash(detector: Detector) -> str:
    """A hash of the model's arrays (the `.npz` itself holds write times)."""
    h = hashlib.sha256(np.ascontiguousarray(detector.weights, np.float32).tobytes())
    h.update(repr((round(detector.bias, 9), round(detector.threshold, 12))).encode())
    return h.hexdigest()[:16]


__all__ = [
    "HELDOUT",
    "HELDOUT_BENIGN",
    "LANGS",
    "NGRAMS",
    "WINDOW",
    "Detector",
    "Example",
    "TrainConfig",
    "data_dir",
    "data_hashes",
    "expand",
    "feature_text",
    "heldout_attacks",
    "heldout_benign",
    "json_strings",
    "load",
    "model_hash",
    "obfuscate",
    "save",
    "scenario_texts",
    "shipped",
    "texts_hash",
    "to_traditional",
    "train",
    "with_obfuscations",
    "written_benign",
]
