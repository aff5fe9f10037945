"""OPD's student sampler decoding self-speculatively (`sampling.num_draft_tokens`): greedy, the
tokens and verifier log-probs of plain sampling, in one call and in chunks (the chunks'
acceptance pooled); no head, no speculation."""

import numpy as np
import pytest
from flax import nnx

import models
from rl._opd_sampling import StudentSampler


@pytest.fixture(scope="module")
def model():
    config = models.QwenConfig.preset("tiny", vocab_size=512, moe_dispatch="dense")
    return models.Qwen(config, rngs=nnx.Rngs(0))


def test_speculative_student_samples_are_the_plain_ones(model):
    import jax

    head = models.MTPHead(model.config, rngs=nnx.Rngs(1))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 512, n).tolist() for n in (5, 17, 9)]
    greedy = models.GREEDY
    outs = {}
    for name, kwargs in {"plain": {}, "spec": dict(draft_head=head, num_draft_tokens=3),
                         "spec_chunks": dict(draft_head=head, num_draft_tokens=3, chunk=2)}.items():  # fmt: skip
        sampler = StudentSampler(pad_id=0, stop_tokens=(1,), **kwargs)
        outs[name] = sampler(model, prompts, max_new_tokens=12, sampling=greedy,
                             seed=jax.random.key(0))  # fmt: skip
    plain = outs["plain"]
    assert plain.acceptance_length is None
    for name in ("spec", "spec_chunks"):
        out = outs[name]
        np.testing.assert_array_equal(out.lengths, plain.lengths)
        for i, n in enumerate(plain.lengths):
            np.testing.assert_array_equal(out.tokens[i, :n], plain.tokens[i, :n])
            np.testing.assert_allclose(out.policy_logprobs[i, :n], plain.policy_logprobs[i, :n],
                                       rtol=0, atol=1e-4)  # fmt: skip
        assert out.acceptance_length >= 1.0 and out.verifications > 0, name
    with pytest.raises(ValueError, match="needs an MTP draft head"):
        StudentSampler(pad_id=0, stop_tokens=(1,), num_draft_tokens=2)
