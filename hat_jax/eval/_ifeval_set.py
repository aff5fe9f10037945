"""IFEval as an evaluation set: the 541 official prompts, each scored by the official checks.

The set is built from `ifeval_prompts()` (the prompts' sha256 is checked there); its version
therefore changes only with the prompts. `size` below 541 draws a seeded subset (recorded in
the manifest as a subset: its figures are not comparable with published IFEval numbers). Each
item is one call; its scores are IFEval's prompt-level strict/loose (0 or 1) and its share of
instructions followed, strict/loose, which the run averages weighted by instruction count
(`weights`), so the run's figures are IFEval's own four.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from hat_jax import harness as hx
from hat_jax.eval._ifeval import IFEVAL_SIZE, IFEvalPrompt, ifeval_prompts, score_ifeval
from hat_jax.eval._items import EvalItem, EvalSet
from hat_jax.eval._kind import EvalContext, Prepared


class _IFEvalKind:
    name = "ifeval"
    metrics = ("strict_prompt", "loose_prompt", "strict_instruction", "loose_instruction", "avg")

    def build(self, ctx: EvalContext, *, split: str, size: int, seed: int) -> EvalSet:
        """`size` official prompts (all by default); the same whatever the room (recorded)."""
        if split != "test":
            raise ValueError(f"IFEval has only its official test prompts, not a {split!r} split")
        prompts = ifeval_prompts()
        if not 0 < size <= len(prompts):
            raise ValueError(f"IFEval: size must be in [1, {len(prompts)}], got {size}")
        chosen = prompts
        if size < len(prompts):
            chosen = sorted(random.Random(seed).sample(prompts, size), key=lambda p: p.key)
        items = tuple(
            EvalItem(
                id=f"ifeval-{p.key}",
                set=self.name,
                family=p.instruction_id_list[0].split(":")[0],
                prompt={"messages": p.messages, **p.to_record()},
            )  # fmt: skip
            for p in chosen
        )
        generator = {"source": "official", "prompts": len(prompts), "size": size,
                     "subset": size < IFEVAL_SIZE, "seed": seed if size < len(prompts) else None}  # fmt: skip
        return EvalSet(self.name, items, generator, room=ctx.room)

    def prepare(self, item: EvalItem, ctx: EvalContext) -> Prepared:
        return Prepared(
            state=hx.HarnessState(harness=ctx.harness), messages=hx.thaw(item.prompt["messages"])
        )

    def score(self, item: EvalItem, prepared: Prepared, result: Any) -> dict[str, float]:
        del prepared
        record = {k: hx.thaw(v) for k, v in item.prompt.items() if k != "messages"}
        (checked,) = score_ifeval(
            [IFEvalPrompt.from_record(record)], [result.content or ""]
        ).prompts
        strict, loose = float(checked.prompt_strict), float(checked.prompt_loose)
        return {
            "strict_prompt": strict,
            "loose_prompt": loose,
            "strict_instruction": sum(checked.strict) / max(len(checked.strict), 1),
            "loose_instruction": sum(checked.loose) / max(len(checked.loose), 1),
            "avg": strict,
        }

    def weights(self, item: EvalItem) -> Mapping[str, float]:
        """Instruction-level figures count every instruction once."""
        n = float(len(item.prompt["instruction_id_list"]))
        return {"strict_instruction": n, "loose_instruction": n}


IFEVAL = _IFEvalKind()
