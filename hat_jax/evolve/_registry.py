"""The Harness versions of an evolution folder and the operator's decisions about them.

    <evolve_dir>/versions/<version>/     a full Harness folder (its manifest.json included),
                                         or the judge's prompt folder (a judge evolution)
    <evolve_dir>/history.json            every event: init, proposed, evaluated, decided
    <evolve_dir>/current.json            the version the agent runs: the last promoted one

A version is named by its Harness content hash (`Harness.version`), so two proposals with the
same content are one version. Nothing but `decide` changes `current.json`: a proposal or an
evaluation only adds a history event. Every file is written atomically
(`hat_jax.files.write_json`) and a version folder is written under a temporary name and renamed
into place, so a crash leaves either the whole version or none.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from hat_jax import files
from hat_jax import harness as hx

VERSIONS = "versions"
HISTORY = "history.json"
CURRENT = "current.json"
MANIFEST = "manifest.json"
ACTIONS = ("promote", "revise", "rollback")
KINDS = ("harness", "judge")


class RegistryError(RuntimeError):
    """The evolution folder does not allow the requested step (the reason is named)."""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def operator() -> str:
    """Who runs the command: `$HAT_JAX_OPERATOR`, else the login name."""
    return os.environ.get("HAT_JAX_OPERATOR") or getpass.getuser()


def version_dir(evolve_dir: os.PathLike | str, version: str) -> pathlib.Path:
    """The folder of a stored version (RegistryError when it is not stored)."""
    folder = pathlib.Path(evolve_dir) / VERSIONS / version
    if not folder.is_dir():
        raise RegistryError(f"{evolve_dir} holds no Harness version {version!r}")
    return folder


def history(evolve_dir: os.PathLike | str) -> list[dict[str, Any]]:
    path = pathlib.Path(evolve_dir) / HISTORY
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []


def current(evolve_dir: os.PathLike | str) -> str:
    """The current (last promoted) version."""
    path = pathlib.Path(evolve_dir) / CURRENT
    if not path.is_file():
        raise RegistryError(f"{evolve_dir} is not an evolution folder (no {CURRENT}): run init")
    return json.loads(path.read_text(encoding="utf-8"))["version"]


def record(evolve_dir: os.PathLike | str, event: Mapping[str, Any]) -> dict[str, Any]:
    """Appends one event (stamped with who and when) to the history."""
    entry = {"at": now(), "who": operator(), **event}
    files.write_json(pathlib.Path(evolve_dir) / HISTORY, [*history(evolve_dir), entry])
    return entry


def folder_kind(evolve_dir: os.PathLike | str) -> str:
    """What the folder evolves: "harness" or "judge" (its prompts)."""
    return next((e.get("kind", "harness") for e in history(evolve_dir) if e["event"] == "init"),
                "harness")  # fmt: skip


def load_version(folder: os.PathLike | str, kind: str = "harness") -> str:
    """Validates a folder of `kind` ("harness", or "judge": the judge's editable prompts) and
    returns its version.

    Raises:
      hx.HarnessError: every problem, each with its file and field.
    """
    if kind == "judge":
        from hat_jax.evolve._judge import judge_version

        return judge_version(folder)
    return hx.load(folder).version


def store(evolve_dir: os.PathLike | str, source: os.PathLike | str, kind: str | None = None) -> str:
    """Copies the folder `source` (a Harness, or the judge's prompts in a judge evolution
    folder) into the versions, validated; a Harness gets its manifest.

    Returns:
      The version (the content hash); an already stored version is kept as it is.

    Raises:
      hx.HarnessError: `source` does not load or validate (every problem with file and field);
        nothing is stored.
    """
    kind = kind or folder_kind(evolve_dir)
    harness = hx.load(source) if kind == "harness" else None
    if harness is not None:
        version, folder = harness.version, pathlib.Path(harness.source)
    else:
        version, folder = load_version(source, kind), pathlib.Path(source)
    target = pathlib.Path(evolve_dir) / VERSIONS / version
    if target.is_dir():
        return version
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{version}.", dir=target.parent))
    try:
        shutil.copytree(folder, tmp, dirs_exist_ok=True)
        # A Harness version carries the manifest of its content (a stale one is rewritten).
        if harness is not None and (
            not (tmp / MANIFEST).is_file() or _stale(harness, tmp / MANIFEST)
        ):
            hx.write_manifest(harness, tmp / MANIFEST)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return version


def _stale(harness: hx.Harness, manifest: pathlib.Path) -> bool:
    try:
        return bool(hx.reconcile(harness, manifest))
    except (ValueError, KeyError):
        return True


def init(evolve_dir: os.PathLike | str, source: os.PathLike | str, kind: str = "harness") -> str:
    """Starts an evolution folder of `kind` with `source` as its first promoted version.

    Raises:
      RegistryError: the folder already has a current version.
    """
    if kind not in KINDS:
        raise RegistryError(f"unknown evolution kind {kind!r}; choose one of {KINDS}")
    if (pathlib.Path(evolve_dir) / CURRENT).is_file():
        raise RegistryError(f"{evolve_dir} already has a current version {current(evolve_dir)}")
    version = store(evolve_dir, source, kind)
    record(evolve_dir, {"event": "init", "kind": kind, "version": version, "source": str(source)})
    files.write_json(pathlib.Path(evolve_dir) / CURRENT, {"version": version, "since": now()})
    return version


def promoted(evolve_dir: os.PathLike | str) -> list[str]:
    """The versions that were current, oldest first (init, promotions, rollbacks applied)."""
    stack: list[str] = []
    for e in history(evolve_dir):
        if e["event"] == "init" or (e["event"] == "decided" and e["action"] == "promote"):
            stack.append(e["version"])
        elif e["event"] == "decided" and e["action"] == "rollback":
            stack.pop()
    return stack


def decide(
    evolve_dir: os.PathLike | str,
    action: str,
    *,
    version: str | None = None,
    evidence: str | None = None,
    note: str = "",
) -> dict[str, Any]:
    """Records the operator's decision and applies it.

    - `promote` makes `version` current; it must be stored, differ from the current one and
      rest on an evaluation (`evidence`: the evaluation folder of `version` against current).
    - `revise` keeps the current version and records that `version` goes back for edits.
    - `rollback` makes the previously promoted version current again (its stored folder is
      unchanged, so a checkout restores it byte for byte).

    Raises:
      RegistryError: an unknown action, a missing version or evidence, or nothing to roll back.
    """
    if action not in ACTIONS:
        raise RegistryError(f"unknown decision {action!r}; choose one of {ACTIONS}")
    was = current(evolve_dir)
    event: dict[str, Any] = {"event": "decided", "action": action, "previous": was, "note": note}
    if action == "rollback":
        stack = promoted(evolve_dir)
        if len(stack) < 2:
            raise RegistryError(f"{evolve_dir}: nothing to roll back to ({was} is the first)")
        event["version"], event["rolled_back"] = stack[-2], stack[-1]
    else:
        if not version:
            raise RegistryError(f"decide {action} needs the version it is about")
        version_dir(evolve_dir, version)
        if action == "promote":
            if version == was:
                raise RegistryError(f"{version} is already current")
            _check_evidence(evidence, version, was)
        event["version"] = version
    if evidence:
        event["evidence"] = str(evidence)
    entry = record(evolve_dir, event)
    if action != "revise":
        files.write_json(
            pathlib.Path(evolve_dir) / CURRENT, {"version": event["version"], "since": entry["at"]}
        )
    return entry


def _check_evidence(evidence: str | None, version: str, base: str) -> None:
    path = pathlib.Path(evidence or "") / "evaluation.json"
    if not evidence or not path.is_file():
        raise RegistryError(
            f"promoting {version} needs --evidence: the folder of its evaluation "
            f"(evaluation.json) against the current {base}"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if (data.get("candidate"), data.get("baseline")) != (version, base):
        raise RegistryError(
            f"{path} evaluates {data.get('candidate')} against {data.get('baseline')}, "
            f"not {version} against the current {base}"
        )


def checkout(evolve_dir: os.PathLike | str, dest: os.PathLike | str) -> pathlib.Path:
    """Replaces the folder `dest` with the current version's files (the deployed Harness)."""
    source, dest = version_dir(evolve_dir, current(evolve_dir)), pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".checkout.", dir=dest.parent))
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
