"""Numerical parity with transformers 5.24 (float32, 2 x 520 tokens, one row right-padded).

Each case builds a random model with transformers' own class, saves it with
`save_pretrained`, loads it with `serve.load_hf` and compares logits on every real token, at
max abs diff <= 1e-4. Cases: the Qwen3.5 pattern (3 DeltaNet + 1 gated attention), each
layer type alone, and Qwen3-MoE. A top-k routing near-tie in the reference would make the
comparison meaningless (the choice flips on 1 ulp), so each case checks its margin first.
"""

import numpy as np
import pytest

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
    _, model = load_hf(save(hf, tmp_path / "hf"), dtype="float32", moe_dispatch="dense")
    out = forward(model, ids, segment_ids=mask.astype(np.int32))
    ours = np.asarray(out.logits)
    real = mask.astype(bool)
    diff = np.abs(ours - ref["logits"])[real]
    assert diff.max() <= TOLERANCE, f"{case}: max |logits diff| {diff.max():.3g}"
    # Padding is its own segment: it never reaches the real tokens, and the padded row's
    # real tokens equal the same prefix run alone (checked against transformers above).
    assert np.abs(ours[1, :PAD_FROM] - ref["logits"][1, :PAD_FROM]).max() <= TOLERANCE
    # The load-balancing loss over the non-padding tokens of all layers.
    assert float(out.aux_loss) == pytest.approx(ref["aux_loss"], rel=1e-5)
