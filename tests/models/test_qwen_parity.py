"""Numerical parity with transformers 5.24 (float32, 2 x 520 tokens, one row right-padded).

Each case builds a random model with transformers' own class, saves it with
`save_pretrained`, loads it with `serve.load_hf` and compares logits on every real token, at
max abs diff <= 1e-4. Cases: the Qwen3.5 pattern (3 DeltaNet + 1 gated attention), each
layer type alone, and Qwen3-MoE; and six sampled architectures (head ratios, sizes, rotary
fraction, conv width, layer order, lengths) through every MoE dispatch. A top-k routing
near-tie in the reference would make the comparison meaningless (the choice flips on 1 ulp),
so each case checks its margin first.
"""

import numpy as np
import pytest

from models._config import MOE_DISPATCHES
from serve import load_hf
from tests.models.qwen_fixtures import (
    PAD_FROM,
    batch,
    build,
    forward,
    qwen3_5_config,
    qwen3_moe_config,
    save,
)
from tests.models.qwen_fixtures import reference as hf_reference

TOLERANCE = 1e-4

CASES = {
    "qwen3_5_pattern": (lambda: qwen3_5_config(), 0),
    "qwen3_5_linear_attention_only": (
        lambda: qwen3_5_config(["linear_attention"] * 2),
        1,
    ),
    "qwen3_5_full_attention_only": (lambda: qwen3_5_config(["full_attention"] * 2), 2),
    "qwen3_moe": (lambda: qwen3_moe_config(num_layers=3), 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, tmp_path):
    make_config, seed = CASES[case]
    hf = build(make_config(), seed)
    ids, mask = batch(seed)
    ref = hf_reference(hf, ids, mask)
    assert ref["routing_margin"] > 1e-6, f"{case}: pick another seed, the reference has a tie"
    ours = _check_against(ref, save(hf, tmp_path / "hf"), "dense", ids, mask, case)
    # Padding is its own segment: it never reaches the real tokens, and the padded row's
    # real tokens equal the same prefix run alone (checked against transformers above).
    assert np.abs(ours[1, :PAD_FROM] - ref["logits"][1, :PAD_FROM]).max() <= TOLERANCE


def _check_against(ref, hf_dir, dispatch, ids, mask, label) -> np.ndarray:
    """Loads `hf_dir` with `dispatch` and checks its logits on every real token and its
    load-balancing loss (non-padding tokens, all layers) against transformers'; our logits."""
    _, model = load_hf(hf_dir, dtype="float32", moe_dispatch=dispatch)
    out = forward(model, ids, segment_ids=mask.astype(np.int32))
    ours = np.asarray(out.logits)
    diff = np.abs(ours - ref["logits"])[mask.astype(bool)].max()
    assert diff <= TOLERANCE, f"{label}, {dispatch}: max |logits diff| {diff:.3g}"
    assert float(out.aux_loss) == pytest.approx(ref["aux_loss"], rel=1e-5), (label, dispatch)
    return ours


def _sampled_case(seed: int):
    """A random architecture and batch: head counts and ratios (GQA from 1 to 8 query heads
    per key head, DeltaNet value heads per key head 1-2), head sizes, partial rotary factor,
    conv width, expert count and top-k, layer order, and a length of 2-259 tokens (rarely a
    chunk multiple) in a batch of 1 or 2 (the second right-padded)."""
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([2, 4, 8]))
    common = dict(
        hidden_size=int(rng.choice([32, 48, 64])),
        num_attention_heads=heads,
        num_key_value_heads=int(rng.choice([h for h in (1, 2, 4, 8) if heads % h == 0])),
        head_dim=int(rng.choice([16, 32, 64])),
        num_experts=(experts := int(rng.choice([4, 8, 16]))),
        num_experts_per_tok=int(rng.integers(1, min(experts - 1, 4) + 1)),
        moe_intermediate_size=int(rng.choice([16, 32])),
        rms_norm_eps=float(rng.choice([1e-6, 1e-5])),
    )
    theta = float(rng.choice([1e4, 1e6]))
    if seed % 3:  # Qwen3.5: DeltaNet and gated attention in any order, not only periodic
        kinds = [
            str(k) for k in rng.choice(["linear_attention", "full_attention"], rng.integers(2, 6))
        ]
        kinds[int(rng.integers(len(kinds)))] = "linear_attention"
        key_heads = int(rng.choice([1, 2, 4]))
        rotary = float(rng.choice([0.25, 0.5, 1.0]))
        config = qwen3_5_config(
            kinds,
            linear_num_key_heads=key_heads,
            linear_num_value_heads=key_heads * int(rng.choice([1, 2])),
            linear_key_head_dim=int(rng.choice([8, 16, 32])),
            linear_value_head_dim=int(rng.choice([8, 16, 24])),
            linear_conv_kernel_dim=int(rng.choice([2, 3, 4])),
            shared_expert_intermediate_size=int(rng.choice([16, 48])),
            rope_parameters={
                "rope_type": "default",
                "rope_theta": theta,
                "partial_rotary_factor": rotary,
            },
            **common,
        )
    else:
        config = qwen3_moe_config(
            num_layers=int(rng.integers(1, 4)),
            norm_topk_prob=bool(rng.random() < 0.5),
            rope_parameters={"rope_type": "default", "rope_theta": theta},
            **common,
        )
    rows, length = int(rng.integers(1, 3)), int(rng.integers(2, 260))
    ids = rng.integers(0, config.vocab_size, (rows, length)).astype(np.int64)
    mask = np.ones((rows, length), np.int64)
    if rows == 2:
        mask[1, int(rng.integers(1, length)) :] = 0
    return config, ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_sampled_architectures_match_transformers(seed, tmp_path):
    """Configurations no other test uses, through every MoE dispatch."""
    config, ids, mask = _sampled_case(seed)
    hf = build(config, seed)
    ref = hf_reference(hf, ids, mask)
    assert ref["routing_margin"] > 1e-6, f"seed {seed}: the reference has a top-k near-tie"
    directory = save(hf, tmp_path / "hf", fused=bool(seed % 2))
    for dispatch in MOE_DISPATCHES:
        _check_against(ref, directory, dispatch, ids, mask, f"seed {seed}")
