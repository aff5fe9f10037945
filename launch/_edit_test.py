"""The held-out Harness-edit test of the miniature reproduction (paper §5.5).

Cases are simulator scenarios in the style of T1 (the released Harness, no faults): a
development sample of the `dev` split and a held-out sample of the `test` split. The automatic
check is `hat_jax.eval.host_wording`: an item is an error when the reply the viewer gets is
not the policy's own, well-worded host reply (no reply, the Harness's fallback, exposed
machinery or uncertainty, markup).

1. Development: every candidate edit (`hat_jax.harness.load_edit` files) and the unedited
   Harness run on the development cases with each checkpoint under test; the candidate with
   the fewest errors, summed over the checkpoints, is chosen (ties: the first listed) and
   frozen (its digest recorded).
2. Held out: each checkpoint runs the held-out cases under the unedited and the chosen
   Harness; its error reduction is (before - after) / before, against its own count, with a
   paired bootstrap interval of the per-case change in the error rate.

Every run is a `launch.eval` run under `<workdir>/edit_test/<phase>/<arm>/<edit>` (resumable),
so its items, trajectories and report stay inspectable.
"""

from __future__ import annotations

import pathlib
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

ORIGINAL = "original"
_PHASES = {"dev": "dev", "heldout": "test"}  # phase -> scenario split


def candidate_files(spec: str) -> list[pathlib.Path]:
    """Edit files from a comma-separated list of files and directories (a directory: its
    `*.yaml`, sorted)."""
    out: list[pathlib.Path] = []
    for part in (s.strip() for s in spec.split(",") if s.strip()):
        path = pathlib.Path(part)
        if path.is_dir():
            out += sorted(path.glob("*.yaml"))
        elif path.is_file():
            out.append(path)
        else:
            raise FileNotFoundError(f"edit_test.candidates: {path} is neither a file nor a folder")
    if not out:
        raise ValueError(f"edit_test.candidates={spec!r}: no edit files")
    return out


def check_candidates(spec: str) -> dict[str, tuple[Any, str]]:
    """`{name: (edit, file)}` of the candidates, each applied once to the released Harness
    (a bad file, a clash of names or an edit that does not apply fails here, by name)."""
    from hat_jax import harness as hx
    from hat_jax import livestream

    released = hx.load(livestream.default_world_dir())
    edits: dict[str, tuple[Any, str]] = {}
    for path in candidate_files(spec):
        edit = hx.load_edit(path)
        if edit.name in edits or edit.name == ORIGINAL:
            raise ValueError(f"edit_test: two candidates named {edit.name!r} ({path})")
        hx.apply_edit(released, edit)
        edits[edit.name] = (edit, str(path))
    return edits


def _eval_config(base: ml_collections.ConfigDict, *, policy: str, split: str, size: int,
                 sets_dir: pathlib.Path, run_dir: pathlib.Path, edit: str) -> ml_collections.ConfigDict:  # fmt: skip
    e = base.copy_and_resolve_references()
    e.unlock()
    e.update(dict(sets="t1", split=split, sets_dir=str(sets_dir), run_dir=str(run_dir),
                  baseline="", harness_edit=edit))  # fmt: skip
    e.sizes.t1 = size
    e.policy.update(dict(kind="jax", checkpoint=policy))
    return e


def item_errors(run_dir: pathlib.Path, set_name: str, fallback: str) -> dict[str, tuple[str, ...]]:
    """`{item id: problems}` of a run's replies (an empty tuple: a well-worded own reply)."""
    from hat_jax import eval as hev

    return {str(r["id"]): hev.host_wording(r.get("output") or "", fallback=fallback)
            for r in hev.read_items(run_dir, set_name)}  # fmt: skip


def _count(errors: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    problems = Counter(p for found in errors.values() for p in found)
    return {"cases": len(errors), "errors": sum(bool(f) for f in errors.values()),
            "problems": dict(sorted(problems.items()))}  # fmt: skip


def run_edit_test(
    t: ml_collections.ConfigDict,
    *,
    eval_block: ml_collections.ConfigDict,
    policies: Mapping[str, str],
    root: pathlib.Path,
    resamples: int,
    seed: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the test (see the module docstring) for the checkpoints `policies` ({arm: orbax
    checkpoints}); returns its record for the reproduction's manifest."""
    from hat_jax import eval as hev
    from hat_jax import harness as hx
    from hat_jax import livestream
    from launch import eval as eval_launch

    edits = check_candidates(t.candidates)  # every candidate applies before anything runs
    released = hx.load(livestream.default_world_dir())
    fallback = released.hooks.fallback.conservative_reply
    out_root = root / "edit_test"

    def run(phase: str, arm: str, name: str) -> dict[str, tuple[str, ...]]:
        split = _PHASES[phase]
        size = t.dev_cases if phase == "dev" else t.heldout_cases
        run_dir = out_root / phase / arm / name
        e = _eval_config(eval_block, policy=policies[arm], split=split, size=size,
                         sets_dir=out_root / "sets", run_dir=run_dir,
                         edit="" if name == ORIGINAL else edits[name][1])  # fmt: skip
        log(f"[edit_test] {phase}: {arm} under {name} ...")
        eval_launch.run(e, run_dir=str(run_dir))
        return item_errors(run_dir, "t1" if split == "test" else f"t1-{split}", fallback)

    dev = {name: {arm: _count(run("dev", arm, name)) for arm in policies}
           for name in (ORIGINAL, *edits)}  # fmt: skip
    totals = {name: sum(c["errors"] for c in dev[name].values()) for name in edits}
    chosen = min(edits, key=lambda n: (totals[n], list(edits).index(n)))
    record: dict[str, Any] = {
        "arms": list(policies),
        "candidates": {n: {**e.describe(), "source": s, "harness": hx.apply_edit(released,
                       e).version} for n, (e, s) in edits.items()},  # fmt: skip
        "released": released.version,
        "dev": dev,
        "chosen": chosen,
        "chosen_beats_original_on_dev": totals[chosen] < sum(
            c["errors"] for c in dev[ORIGINAL].values()),
        "heldout": {},
    }  # fmt: skip
    for arm in policies:
        before, after = run("heldout", arm, ORIGINAL), run("heldout", arm, chosen)
        ids = sorted(before)
        if sorted(after) != ids:
            raise RuntimeError(f"edit_test: {arm}'s held-out runs scored different cases")
        a = [float(bool(before[i])) for i in ids]
        b = [float(bool(after[i])) for i in ids]
        boot = hev.paired_bootstrap(a, b, resamples=resamples, seed=seed) if ids else None
        n_before, n_after = int(sum(a)), int(sum(b))
        record["heldout"][arm] = {
            "before": _count(before), "after": _count(after),
            "reduction": (n_before - n_after) / n_before if n_before else None,
            "error_rate_change": boot.to_dict() if boot else None,
        }  # fmt: skip
    return record
