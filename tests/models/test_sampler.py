"""`models.Sampler`: exact greedy decoding, log-probs, stopping, bucketing, speculative decoding.

- Greedy generation of a batch of prompts of different lengths (right-padded into one bucket)
  equals transformers' `generate` on each prompt alone, for both families (random tiny models
  saved with transformers' classes, float32).
- The log-probs the sampler returns (under the sampling distribution and under the unmodified
  policy) equal those recomputed from a training forward pass on the same tokens, with an
  independent numpy reference of temperature / top-k / top-p.
- Stop tokens and per-row limits cut rows where they should; `rows()` marks sampled tokens.
- Top-k / top-p draw exactly from the renormalised support (frequencies over fixed keys).
- Calls within a bucket reuse the compiled program; bad requests fail with clear errors.
- Self-speculative decoding with an MTP head: greedy output equals plain decoding, sampled
  log-probs equal the forward pass, exact acceptance keeps the target distribution (of
  `speculative_accept` alone, and of whole speculative generations against plain ones: a
  chi-square test over 12,288 draws per temperature, which an always-accepting variant
  fails), and a shared prefix works with speculation.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from models import (
    GREEDY,
    MTPHead,
    Qwen,
    QwenConfig,
    SampleOutput,
    Sampler,
    Sampling,
    SamplingArrays,
    Standard,
    combine_acceptance,
    speculative_accept,
)
from serve import load_hf
from tests.models.qwen_fixtures import build, forward, qwen3_5_config, qwen3_moe_config, save

PROMPT_LENGTHS = (150, 41, 7)
NEW_TOKENS = 24
LOGPROB_TOLERANCE = 5e-5


def _prompts(vocab: int, lengths=PROMPT_LENGTHS, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


def _pair(hf, directory):
    """(transformers model, our model loaded from its save_pretrained directory)."""
    _, model = load_hf(save(hf, directory / "hf"), dtype="float32", moe_dispatch="dense")
    return hf, model


@pytest.fixture(scope="module")
def qwen3_5_pair(tmp_path_factory):
    return _pair(build(qwen3_5_config(), seed=0), tmp_path_factory.mktemp("qwen3_5"))


@pytest.fixture(scope="module")
def qwen3_moe_pair(tmp_path_factory):
    return _pair(build(qwen3_moe_config(num_layers=2), seed=3), tmp_path_factory.mktemp("qwen3"))


def _hf_greedy(hf, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """transformers' greedy continuation of one prompt and the smallest top-2 logit margin."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    top2 = [torch.topk(s[0], 2).values for s in out.scores]
    margin = min(float(t[0] - t[1]) for t in top2)
    return out.sequences[0, len(prompt) :].tolist(), margin


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3_5_pair", "qwen3_moe_pair"])
def test_greedy_equals_transformers_generate(family, request):
    hf, model = request.getfixturevalue(family)
    prompts = _prompts(model.config.vocab_size)
    expected = []
    for p in prompts:
        tokens, margin = _hf_greedy(hf, p, NEW_TOKENS)
        assert margin > 1e-4, "pick another seed: the reference has a near-tie"
        expected.append(tokens)
    sampler = Sampler(model)
    out = sampler(prompts, max_new_tokens=NEW_TOKENS, sampling=GREEDY)
    for i, ref in enumerate(expected):
        assert out.completion(i) == ref, f"row {i} (prompt of {len(prompts[i])} tokens)"
    assert out.lengths.tolist() == [NEW_TOKENS] * 3 and not out.stopped.any()
    assert np.all(out.logprobs == 0.0)  # greedy: the sampling distribution is one-hot

    # Stop tokens and per-row limits in the same bucket: no new program.
    stop = expected[0][5]
    limits = [NEW_TOKENS, 4, 13]
    cut = sampler(prompts, max_new_tokens=limits, sampling=GREEDY, stop_tokens=[stop])
    assert sampler.compilations == 1
    for i, ref in enumerate(expected):
        until = ref.index(stop) + 1 if stop in ref[: limits[i]] else limits[i]
        assert cut.completion(i) == ref[:until], f"row {i}"
        assert bool(cut.stopped[i]) == (stop in ref[: limits[i]])
        assert np.all(cut.tokens[i, until:] == sampler.pad_id)


def _reference_sampling_logp(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """Independent numpy temperature -> top-k -> top-p (log-probs, -inf off the support)."""
    z = logits.astype(np.float64) / s.temperature
    order = np.argsort(-z)
    keep = np.ones_like(z, bool)
    if s.top_k:
        keep[order[s.top_k :]] = False
    probs = np.exp(z - z[keep].max()) * keep
    probs /= probs.sum()
    if s.top_p < 1.0:
        mass_before = np.cumsum(probs[order]) - probs[order]
        keep[order[mass_before >= s.top_p]] = False
    logp = np.where(keep, z, -np.inf)
    return logp - np.log(np.sum(np.exp(logp[keep] - z[keep].max()))) - z[keep].max()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.slow
def test_logprobs_equal_a_training_forward_pass(qwen3_5_pair):
    _, model = qwen3_5_pair
    rows = [
        Sampling(temperature=0.7, top_k=20),
        Sampling(temperature=1.3, top_p=0.8),
        Sampling(temperature=1.0, top_k=40, top_p=0.9),
    ]
    prompts = _prompts(model.config.vocab_size, seed=1)
    out = Sampler(model)(prompts, max_new_tokens=NEW_TOKENS, sampling=rows, seed=7)
    batch = out.rows()
    # The sampled-vs-forced mask: 1 exactly on the generated tokens.
    for i, p in enumerate(prompts):
        n = int(out.lengths[i])
        expected = np.zeros(batch["input_ids"].shape[1], np.int32)
        expected[len(p) : len(p) + n] = 1
        np.testing.assert_array_equal(batch["sampled_mask"][i], expected)
        assert batch["input_ids"][i, : len(p)].tolist() == p
        assert batch["input_ids"][i, len(p) : len(p) + n].tolist() == out.completion(i)
    logits = np.asarray(
        forward(model, batch["input_ids"], batch["segment_ids"], batch["positions"]).logits
    )
    policy = _log_softmax(logits)
    for i, p in enumerate(prompts):
        for j, token in enumerate(out.completion(i)):
            t = len(p) + j  # the token at t is predicted at t - 1
            assert abs(out.policy_logprobs[i, j] - policy[i, t - 1, token]) < LOGPROB_TOLERANCE
            ref = _reference_sampling_logp(logits[i, t - 1], rows[i])[token]
            assert np.isfinite(ref), f"row {i} token {j} sampled outside the support"
            assert abs(out.logprobs[i, j] - ref) < LOGPROB_TOLERANCE, (i, j)
    np.testing.assert_array_equal(batch["logprobs"][batch["sampled_mask"] == 0], 0.0)


@pytest.mark.parametrize(
    "setting, support",
    [
        (Sampling(temperature=1.0, top_k=3), [0, 1, 2]),
        (Sampling(temperature=2.0, top_p=0.6), [0, 1, 2]),  # masses .35 .26 .18 .12 ...
        (Sampling(temperature=1.0, top_k=2, top_p=0.99), [0, 1]),
        (Sampling(temperature=0.5), list(range(6))),
    ],
)
def test_top_k_top_p_draw_from_the_renormalised_support(setting, support):
    logits = jnp.asarray([[3.0, 2.4, 1.7, 0.9, 0.2, -0.5]])
    params = SamplingArrays.from_rows([setting])
    strategy = Standard(top_k=setting.top_k > 0, top_p=setting.top_p < 1)
    logp = strategy(logits, params)[0]
    expected = np.full(6, -np.inf)
    expected[support] = 0.0
    np.testing.assert_array_equal(np.isfinite(np.asarray(logp)), np.isfinite(expected))
    ref = _reference_sampling_logp(np.asarray(logits[0]), setting)
    np.testing.assert_allclose(np.exp(np.asarray(logp)), np.exp(ref), atol=1e-6)
    n = 40_000
    keys = jax.random.split(jax.random.key(0), n)
    draws = np.asarray(jax.vmap(lambda k: jax.random.categorical(k, logp))(keys))
    freq = np.bincount(draws, minlength=6) / n
    assert set(np.flatnonzero(freq)) == set(support)
    sigma = np.sqrt(np.exp(ref) * (1 - np.exp(ref)) / n)
    assert np.all(np.abs(freq - np.exp(ref)) <= 5 * sigma + 1e-9)


@pytest.fixture(scope="module")
def small_sampler():
    config = QwenConfig.preset("qwen3_30b_a3b").replace(
        vocab_size=128,
        hidden_size=32,
        num_layers=1,
        layer_types=("full_attention",),
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        max_position_embeddings=64,
        dtype="float32",
        param_dtype="float32",
        remat="none",
        moe_dispatch="dense",
    )
    return Sampler(Qwen(config, rngs=nnx.Rngs(0)), min_bucket=8)


def test_calls_within_a_bucket_do_not_recompile(small_sampler):
    sampler = small_sampler
    jitted = sampler._compiled
    before_traces, before_cache = sampler.compilations, jitted._cache_size()
    # Prompts <= 8 tokens, <= 8 new tokens, 3 rows (batch bucket 3), any settings.
    for lengths, new, setting in [
        ((5, 2, 8), 3, GREEDY),
        ((1, 7, 4), 8, Sampling(temperature=0.8)),
        ((8, 8, 3), [2, 8, 5], [GREEDY, Sampling(temperature=1.5), GREEDY]),
    ]:
        out = sampler(_prompts(128, lengths), max_new_tokens=new, sampling=setting, seed=1)
        assert out.tokens.shape == (3, 8)
    assert sampler.compilations - before_traces <= 1
    assert jitted._cache_size() - before_cache <= 1
    traces = sampler.compilations
    sampler(_prompts(128, (9, 2, 2)), max_new_tokens=3, sampling=GREEDY)  # prompt bucket 12
    assert sampler.compilations == traces + 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s([], max_new_tokens=4), "no prompts"),
        (lambda s: s([[1, 2], []], max_new_tokens=4), "prompt 1 is empty"),
        (lambda s: s([[1, 2]], max_new_tokens=0), "max_new_tokens of row 0 is 0"),
        (lambda s: s([[1], [2]], max_new_tokens=[3, -1]), "row 1 is -1"),
        (lambda s: s([[1] * 60], max_new_tokens=5), "max_length=64"),
        (lambda s: s([[1, 300]], max_new_tokens=2), "outside"),
        (lambda s: s([[1], [2]], max_new_tokens=[3]), "2 prompts but 1"),
        (lambda s: s([[1]], max_new_tokens=2, stop_tokens=[128]), "stop tokens"),
    ],
)
def test_bad_requests_fail_clearly(small_sampler, call, message):
    with pytest.raises(ValueError, match=message):
        call(small_sampler)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5, float("nan")])
def test_top_p_outside_the_unit_interval_is_rejected(top_p):
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=top_p)


def test_speculative_accept_keeps_the_target_distribution():
    """Two drafts over 4 tokens: the first emitted token is distributed as p0 (accepted draft
    or residual draw), the second as p1, and the first draft passes with sum(min(p0, q0))."""
    p = np.asarray([[0.5, 0.2, 0.2, 0.1], [0.1, 0.6, 0.1, 0.2], [0.25, 0.25, 0.25, 0.25]])
    q = np.asarray([[0.2, 0.5, 0.1, 0.2], [0.3, 0.3, 0.3, 0.1]])
    n = 100_000
    key_d0, key_d1, key_acc = jax.random.split(jax.random.key(0), 3)
    drafts = jnp.stack(
        [
            jax.random.categorical(key_d0, jnp.log(q[0]), shape=(n,)),
            jax.random.categorical(key_d1, jnp.log(q[1]), shape=(n,)),
        ],
        1,
    )
    target = jnp.broadcast_to(jnp.log(p), (n, 3, 4))
    draft = jnp.broadcast_to(jnp.log(q), (n, 2, 4))
    accepted, token = jax.jit(speculative_accept)(key_acc, target, draft, drafts)  # n rows
    accepted, token, drafts = map(np.asarray, (accepted, token, drafts))
    first = np.where(accepted >= 1, drafts[:, 0], token)
    second_ok = accepted >= 1
    second = np.where(accepted >= 2, drafts[:, 1], token)[second_ok]

    def close(samples, probs):
        freq = np.bincount(samples, minlength=4) / len(samples)
        sigma = np.sqrt(probs * (1 - probs) / len(samples))
        return np.all(np.abs(freq - probs) <= 5 * sigma)

    assert close(first, p[0])
    assert close(second, p[1])
    alpha = np.minimum(p[0], q[0]).sum()
    assert abs(second_ok.mean() - alpha) <= 5 * np.sqrt(alpha * (1 - alpha) / n)
    # Deterministic edges: a one-hot draft matching a one-hot target always passes, a draft
    # the target cannot emit never does, and after all drafts the bonus comes from p[k].
    one_hot = jnp.log(jnp.eye(4)[jnp.asarray([[2, 1, 3]])])
    acc, tok = speculative_accept(jax.random.key(1), one_hot, one_hot[:, :2], jnp.asarray([[2, 1]]))
    assert acc.tolist() == [2] and tok.tolist() == [3]
    acc, tok = speculative_accept(jax.random.key(1), one_hot, one_hot[:, :2], jnp.asarray([[0, 1]]))
    assert acc.tolist() == [0] and tok.tolist() == [2]


def _scaled(module: nnx.Module, factor: float) -> nnx.Module:
    """The module with every matrix multiplied by `factor` (sharper, more varied outputs)."""
    graphdef, state = nnx.split(module)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a * factor if a.ndim >= 2 else a, state))


@pytest.fixture(scope="module")
def speculative_setup():
    # A random model at init scale decodes greedily in a 2-cycle and a random head always
    # drafts one token; scaled weights give varied greedy text and drafts, and a vocabulary of
    # 4 makes drafts often right, so partial and full acceptances (and rewinds) all happen.
    config = QwenConfig.preset("tiny", vocab_size=4, moe_dispatch="dense", deltanet_chunk_size=16)
    model = _scaled(Qwen(config, rngs=nnx.Rngs(0)), 4.0)
    head = _scaled(MTPHead(config, rngs=nnx.Rngs(1)), 10.0)
    plain = Sampler(model, pad_id=0)
    spec = Sampler(model, mtp=head, num_draft_tokens=3, pad_id=0)
    return model, plain, spec


@pytest.mark.slow
def test_speculative_greedy_equals_plain_decoding(speculative_setup):
    _, plain, spec = speculative_setup
    prompts = _prompts(4, (37, 5, 2, 20), seed=4)
    kwargs = dict(max_new_tokens=[40, 33, 40, 17], sampling=GREEDY)
    ref, out = plain(prompts, **kwargs), spec(prompts, **kwargs)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.stopped, ref.stopped)
    np.testing.assert_allclose(out.policy_logprobs, ref.policy_logprobs, atol=LOGPROB_TOLERANCE)
    print("greedy acceptance length", out.acceptance_length, "lengths", out.lengths)
    assert out.acceptance_length > 1.2, "the drafts were rarely accepted: little was tested"


@pytest.mark.slow
def test_speculative_sampling_logprobs_equal_the_forward_pass(speculative_setup):
    model, _, spec = speculative_setup
    prompts = _prompts(4, (37, 5, 2, 20), seed=5)
    rows = [Sampling(temperature=t) for t in (0.6, 1.0, 1.4, 0.8)]
    out = spec(prompts, max_new_tokens=40, sampling=rows, seed=3)
    print("sampled acceptance length", out.acceptance_length)
    assert out.acceptance_length > 1.2
    batch = out.rows()
    logits = np.asarray(
        forward(model, batch["input_ids"], batch["segment_ids"], batch["positions"]).logits
    )
    for i, p in enumerate(prompts):
        for j, token in enumerate(out.completion(i)):
            t = len(p) + j
            policy = _log_softmax(logits[i, t - 1])[token]
            sampled = _reference_sampling_logp(logits[i, t - 1], rows[i])[token]
            assert abs(out.policy_logprobs[i, j] - policy) < LOGPROB_TOLERANCE, (i, j)
            assert abs(out.logprobs[i, j] - sampled) < LOGPROB_TOLERANCE, (i, j)


def _joint_counts(out, rows_per_setting: int, settings: int) -> np.ndarray:
    """[settings, 4**4] counts of the first four generated tokens (vocabulary 4) per setting
    (rows are grouped by setting, `rows_per_setting` each)."""
    tokens = out.tokens[:, :4].reshape(settings, rows_per_setting, 4)
    codes = (tokens * np.asarray([64, 16, 4, 1])).sum(-1)
    return np.stack([np.bincount(c, minlength=256) for c in codes])


def _same_distribution_p(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test of homogeneity of two count vectors (cells with fewer than 10 draws in
    both together are pooled into one)."""
    from scipy import stats

    keep = (a + b) >= 10
    table = np.stack([np.append(a[keep], a[~keep].sum()), np.append(b[keep], b[~keep].sum())])
    return float(stats.chi2_contingency(table[:, table.sum(0) > 0])[1])


@pytest.mark.slow
def test_speculative_generations_have_the_plain_distribution(speculative_setup, monkeypatch):
    """One prompt continued by 8,192 rows per call, half at temperature 0.7 and half at 1.3,
    three calls each way: the first four generated tokens (the first from prefill, the rest
    drafted and verified) have the same joint distribution with and without speculation
    (chi-square over 256 outcomes, 12,288 draws per temperature). The test has power: a
    variant that accepts every draft is rejected by it at p ~ 0."""
    from models import _sampler_loop

    model, _, _ = speculative_setup
    head = _scaled(MTPHead(model.config, rngs=nnx.Rngs(1)), 10.0)
    prompt = _prompts(4, (6,), seed=4)[0]
    rows, temperatures = 8192, (0.7, 1.3)
    settings = [Sampling(temperature=t) for t in temperatures for _ in range(rows // 2)]

    def counts(sampler, seeds):
        total = 0
        for seed in seeds:
            out = sampler([prompt] * rows, max_new_tokens=4, sampling=settings, seed=seed)
            total = total + _joint_counts(out, rows // 2, len(temperatures))
        return total, out.acceptance_length

    plain, _ = counts(Sampler(model, min_bucket=4), range(3))
    spec = Sampler(model, mtp=head, num_draft_tokens=3, min_bucket=4)
    speculative, acceptance = counts(spec, range(100, 103))
    assert 1.5 < acceptance < 3.5, f"acceptance length {acceptance}: drafts must pass and fail"
    for i, t in enumerate(temperatures):
        assert plain[i].sum() == speculative[i].sum() == 12_288
        p = _same_distribution_p(plain[i], speculative[i])
        assert p > 1e-3, f"temperature {t}: speculative vs plain p = {p:.2e}"

    def accept_all(key, target_logp, draft_logp, drafts):
        del key, draft_logp
        rows_, k = drafts.shape
        return jnp.full((rows_,), k, jnp.int32), jnp.argmax(target_logp[:, k], -1).astype(jnp.int32)

    monkeypatch.setattr(_sampler_loop, "speculative_accept", accept_all)
    wrong, _ = counts(Sampler(model, mtp=head, num_draft_tokens=3, min_bucket=4), [200])
    for i in range(len(temperatures)):
        assert _same_distribution_p(plain[i], wrong[i]) < 1e-6


@pytest.mark.slow
def test_speculative_decoding_with_a_shared_prefix(speculative_setup):
    """The prefix's target cache and the head's cache of its pairs are computed once: greedy
    output equals plain decoding, and sampled output (same seed) equals speculative decoding
    without sharing."""
    _, plain, spec = speculative_setup
    head = _prompts(4, (40,), seed=7)[0]
    prompts = [head + tail for tail in _prompts(4, (5, 1, 17, 9), seed=8)]
    greedy = dict(max_new_tokens=[30, 20, 30, 12], sampling=GREEDY)
    ref = plain(prompts, **greedy)
    out = spec(prompts, shared_prefix=32, **greedy)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.policy_logprobs, ref.policy_logprobs, atol=LOGPROB_TOLERANCE)
    assert out.acceptance_length > 1.2
    rows = [Sampling(temperature=t) for t in (0.6, 1.0, 1.4, 0.8)]
    whole = spec(prompts, max_new_tokens=30, sampling=rows, seed=3)
    shared = spec(prompts, max_new_tokens=30, sampling=rows, seed=3, shared_prefix=32)
    np.testing.assert_array_equal(shared.tokens, whole.tokens)
    np.testing.assert_allclose(shared.logprobs, whole.logprobs, atol=LOGPROB_TOLERANCE)
    assert shared.acceptance_length == whole.acceptance_length


@pytest.mark.slow
def test_a_flash_prefill_equals_the_dense_one():
    """With `attention_impl="flash"` the prefill of an empty cache attends block-wise among
    the prompt's own tokens (no [T, T] scores): the same tokens, the same log-probs."""
    config = QwenConfig.preset("tiny", vocab_size=512, dtype="float32", param_dtype="float32",
                               moe_dispatch="dense", attention_block_size=64)  # fmt: skip
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 512, n).tolist() for n in (300, 41, 257)]
    sampling = Sampling(temperature=1.0)
    outs = {}
    for impl in ("dense", "flash"):
        model = Qwen(config.replace(attention_impl=impl), rngs=nnx.Rngs(0))
        assert model.init_cache(2, 8).empty
        outs[impl] = Sampler(model)(prompts, max_new_tokens=12, sampling=sampling, seed=3)
    dense, flash = outs["dense"], outs["flash"]
    np.testing.assert_array_equal(flash.tokens, dense.tokens)
    np.testing.assert_allclose(flash.policy_logprobs, dense.policy_logprobs, atol=1e-5)


@pytest.mark.slow
def test_a_shared_prefix_prefilled_once_equals_transformers_generate(qwen3_5_pair):
    """Rows sharing a system prompt: the shared tokens prefilled once and their cache given to
    every row (`shared_prefix`: attention keys/values and DeltaNet states), then each row's own
    tokens; greedy output equals transformers' `generate` on each whole prompt, and the
    log-probs equal the unshared call's."""
    from models import shared_prefix_length

    hf, model = qwen3_5_pair
    vocab = model.config.vocab_size
    head = _prompts(vocab, lengths=(70,), seed=5)[0]
    prompts = [head + tail for tail in _prompts(vocab, lengths=(9, 33, 1), seed=6)]
    shared = shared_prefix_length(prompts, multiple=32)
    assert shared == 64
    sampler = Sampler(model)
    out = sampler(prompts, max_new_tokens=NEW_TOKENS, sampling=GREEDY, shared_prefix=shared)
    for i, p in enumerate(prompts):
        ref, margin = _hf_greedy(hf, p, NEW_TOKENS)
        assert margin > 1e-4, "pick another seed: the reference has a near-tie"
        assert out.completion(i) == ref, f"row {i}"
    plain = sampler(prompts, max_new_tokens=NEW_TOKENS, sampling=Sampling(temperature=1.0),
                    seed=2)  # fmt: skip
    again = sampler(prompts, max_new_tokens=NEW_TOKENS, sampling=Sampling(temperature=1.0),
                    seed=2, shared_prefix=shared)  # fmt: skip
    np.testing.assert_array_equal(again.tokens, plain.tokens)
    np.testing.assert_allclose(again.policy_logprobs, plain.policy_logprobs, atol=LOGPROB_TOLERANCE)
    assert out.prompts[0].tolist() == prompts[0]  # the output keeps the whole prompts


def test_shared_prefix_requests_are_checked():
    from models import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4, 5]], multiple=1) == 0  # one row: nothing shared
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 9, 9]], multiple=1) == 3
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]], multiple=1) == 2  # one token of its own
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 9, 9]], multiple=2) == 2
    config = QwenConfig.preset("tiny", vocab_size=256, dtype="float32", param_dtype="float32")
    sampler = Sampler(Qwen(config, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match=r"rows \[1\] do not share the first 3 tokens"):
        sampler([[1, 2, 3, 4], [1, 2, 5, 6]], max_new_tokens=2, shared_prefix=3)
    with pytest.raises(ValueError, match="at least one token of its own"):
        sampler([[1, 2, 3], [1, 2, 3, 4]], max_new_tokens=2, shared_prefix=3)


def test_combine_acceptance_weights_each_call_by_its_verifications():
    """Pooled acceptance is total emitted over total verified: calls of 10 verifications at
    length 3.0 and 30 at 1.5 pool to 1 + (20 + 15) / 40; plain calls are left out."""

    def out(acceptance, verified):
        zeros = np.zeros((1, 1))
        return SampleOutput((), zeros, zeros, zeros, zeros, zeros, 0, acceptance, verified)

    pooled = combine_acceptance([out(3.0, 10), out(1.5, 30), out(None, 0)])
    assert pooled == pytest.approx(1.0 + 35 / 40)
    assert combine_acceptance([out(None, 0)]) is None
