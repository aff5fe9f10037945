"""Packed sequences: a packed row equals its documents run one by one, for both families.

The packed row holds document A (0:64, ending on a DeltaNet chunk edge), B (64:154, ending
inside a chunk), a padding run (154:160), C (160:261) and trailing padding. Each document is
compared with itself run alone at the start of a row (right-padded, positions from 0).
Padding token values must not matter either.
"""

import numpy as np
import pytest
from flax import nnx

from models import Qwen, QwenConfig
from tests.models.qwen_fixtures import forward, tiny_qwen3_moe

LENGTH = 272
DOCS = {1: (0, 64), 2: (64, 154), 3: (160, 261)}
TOLERANCE = 2e-5

CONFIGS = {
    "qwen3_5": QwenConfig.preset("tiny"),
    "qwen3_moe": tiny_qwen3_moe(vocab_size=2048, moe_dispatch="sorted"),
}


def _packed() -> np.ndarray:
    # Three copies of the packed row: the same batch shape as the documents run alone, so
    # both share one compiled program.
    seg = np.zeros((len(DOCS), LENGTH), np.int32)
    for doc, (lo, hi) in DOCS.items():
        seg[:, lo:hi] = doc
    return seg


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_packed_row_equals_documents_run_alone(family):
    config = CONFIGS[family]
    model = Qwen(config, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    ids = np.repeat(rng.integers(0, config.vocab_size, (1, LENGTH)), len(DOCS), 0).astype(np.int32)
    seg = _packed()
    packed = np.asarray(forward(model, ids, segment_ids=seg).logits)[0]

    alone_ids = np.zeros((len(DOCS), LENGTH), np.int32)
    alone_seg = np.zeros((len(DOCS), LENGTH), np.int32)
    for row, (lo, hi) in enumerate(DOCS.values()):
        alone_ids[row, : hi - lo] = ids[0, lo:hi]
        alone_seg[row, : hi - lo] = 1
    alone = np.asarray(forward(model, alone_ids, segment_ids=alone_seg).logits)
    for row, (lo, hi) in enumerate(DOCS.values()):
        diff = np.abs(packed[lo:hi] - alone[row, : hi - lo]).max()
        assert diff <= TOLERANCE, f"{family}: document {row + 1} differs by {diff:.3g}"

    # Other padding tokens (and explicit per-segment positions) change nothing on real tokens.
    noisy = np.where(seg == 0, rng.integers(0, config.vocab_size, seg.shape), ids)
    positions = np.zeros_like(seg)
    for lo, hi in [*DOCS.values(), (154, 160), (261, LENGTH)]:
        positions[:, lo:hi] = np.arange(hi - lo)
    again = np.asarray(forward(model, noisy, segment_ids=seg, positions=positions).logits)[0]
    real = seg[0] != 0
    np.testing.assert_allclose(again[real], packed[real], atol=TOLERANCE)
