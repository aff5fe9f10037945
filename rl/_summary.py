"""A stage's summary files: `<run>/<name>.json` (the result and the config) and
`<run>/<name>.md` (a readable table), both written atomically."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Any

from hat_jax import files


def jsonable(result: Any) -> dict[str, Any]:
    """A result dataclass as a dict of JSON values (paths as strings)."""
    out = dataclasses.asdict(result)
    return {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in out.items()}


def write_summary(
    run_dir: pathlib.Path, name: str, result: Any, config: Any, lines: Sequence[str]
) -> pathlib.Path:
    """Writes `<name>.json` (`jsonable(result)` and the config) and `<name>.md` (`lines`)."""
    record = jsonable(result) | {"config": dataclasses.asdict(config)}
    path = run_dir / f"{name}.json"
    files.write_json(path, json.loads(json.dumps(record, default=str)))
    files.write_text(run_dir / f"{name}.md", "\n".join(lines) + "\n")
    return path
