"""Hand-computed tests of GRPO, GDPO, HAT's segment pools, q(L) and zero-advantage filtering."""

import functools
import math

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rl import (
    REPLY,
    TOOL,
    HatAdvantageConfig,
    cot_length_penalty,
    gdpo,
    grpo,
    hat_advantages,
    zero_advantage_filter,
)

SQRT_HALF = 1.0 / math.sqrt(2.0)  # any non-constant pair (a, b) normalises to ±1/√2 (ddof=1)


def np_group_norm(x, groups, valid, eps):
    """First-principles reference: (x − mean)/(std_ddof1 + eps) per group, 0 if constant."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for g in np.unique(groups[valid]):
        idx = (groups == g) & valid
        vals = x[idx]
        if len(vals) < 2 or np.all(vals == vals[0]):
            continue
        out[idx] = (vals - vals.mean()) / (vals.std(ddof=1) + eps)
    return out


def np_gdpo(rewards, groups, weights, valid, eps, batch_norm=True):
    total = sum(w * np_group_norm(rewards[:, k], groups, valid, eps) for k, w in enumerate(weights))
    if batch_norm and valid.sum() > 1:
        total = np.where(valid, total / (total[valid].std(ddof=1) + eps), 0.0)
    return total


# ---------------------------------------------------------------- GRPO


def test_grpo_hand_computed_with_unsorted_noncontiguous_groups():
    # group 10: r = [1, 0, 0.5] -> mean 0.5, deviations [.5, -.5, 0],
    #   var (ddof=1) = (.25 + .25 + 0)/2 = .25, std .5 -> A = dev/(.5 + 1e-6) = [0.999998, -0.999998, 0]
    # group -3: r = [2, 2] all equal -> 0;  group 99: single rollout -> 0
    rewards = np.array([1.0, 2.0, 0.0, 7.0, 2.0, 0.5])
    groups = np.array([10, -3, 10, 99, -3, 10], jnp.int32)
    adv = grpo(rewards, groups, eps=1e-6)
    np.testing.assert_allclose(adv, [0.999998, 0.0, -0.999998, 0.0, 0.0, 0.0], atol=1e-6)


def test_grpo_without_std_scaling_only_centres():
    adv = grpo(np.array([1.0, 0.0, 0.5, 3.0]), np.array([0, 0, 0, 1]), eps=1e-6, scale_by_std=False)
    np.testing.assert_allclose(adv, [0.5, -0.5, 0.0, 0.0], atol=1e-7)


def test_grpo_all_equal_group_is_exactly_zero_despite_rounding():
    # 0.1 is not representable: sum/count != 0.1 in f32, so a σ-threshold would leak noise.
    adv = grpo(np.full((3,), 0.1), np.zeros(3, np.int32), eps=1e-6)
    assert np.all(np.asarray(adv) == 0.0)
    adv = grpo(np.full((3,), 0.1), np.zeros(3, np.int32), eps=1e-6, scale_by_std=False)
    assert np.all(np.asarray(adv) == 0.0)


def test_grpo_padding_rows_excluded_and_zero():
    # Row 2 is padding (even NaN); the real group is [1, 0] -> ±.5/(std .70711 + eps) = ±.70711.
    rewards = np.array([1.0, 0.0, jnp.nan])
    adv = grpo(rewards, np.array([4, 4, 4]), eps=0.0, valid=np.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(adv, [SQRT_HALF, -SQRT_HALF, 0.0], rtol=1e-6)


def test_grpo_rejects_bad_input():
    with pytest.raises(ValueError, match="group_ids must have shape"):
        grpo(np.zeros(3), np.zeros(2, np.int32), eps=1e-6)
    with pytest.raises(ValueError, match="integers"):
        grpo(np.zeros(3), np.zeros(3), eps=1e-6)
    with pytest.raises(ValueError, match=r"NaN or inf in rows \[1\]"):
        grpo(np.array([0.0, jnp.inf, 1.0]), np.zeros(3, np.int32), eps=1e-6)


# ---------------------------------------------------------------- GDPO (REFERENCE.md §6 vectors)


def test_gdpo_reference_vector_one_group_of_four():
    # dim 0 = [1,1,0,0]: mean .5, std sqrt(1/3) = .57735 -> ±.5/.57745 = ±.86588
    # dim 1 = [1,0,0,0]: mean .25, var (.5625 + 3*.0625)/3 = .25, std .5 -> [1.4997, -.4999, -.4999, -.4999]
    # sum -> [2.3656, 0.3660, -1.3658, -1.3658]
    rewards = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    groups = np.zeros(4, np.int32)
    adv = gdpo(rewards, groups, np.ones(2), eps=1e-4, batch_norm=False)
    np.testing.assert_allclose(adv, [2.3656, 0.3660, -1.3658, -1.3658], atol=1e-4)
    # GRPO on the summed reward [2,1,0,0]: mean .75, std sqrt(2.75/3) = .957427
    summed = grpo(rewards.sum(axis=1), groups, eps=1e-4)
    np.testing.assert_allclose(summed, [1.3054, 0.2611, -0.7833, -0.7833], atol=1e-4)


def test_gdpo_reference_vector_cancelling_dimensions_is_zero():
    # each dim is [1,0,1,0] or [0,1,0,1]: normalised values ±.866 cancel exactly row by row
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    adv = gdpo(rewards, np.zeros(4, np.int32), np.ones(2), eps=1e-4)
    assert np.all(np.asarray(adv) == 0.0)


def test_gdpo_reference_vector_two_groups_with_batch_norm():
    # g1 {(1,0),(0,0)}: dim0 ±.70701, dim1 constant -> ±.7070
    # g2 {(1,1),(0,0)}: both dims ±.70701 -> ±1.4140
    # batch std (ddof=1) of [.7070,-.7070,1.4140,-1.4140] = sqrt(5/3 * .49986) = 1.29082
    #   -> ±.5477 / ±1.0954
    rewards = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    groups = np.array([1, 1, 2, 2], jnp.int32)
    before = gdpo(rewards, groups, np.ones(2), eps=1e-4, batch_norm=False)
    np.testing.assert_allclose(before, [0.7070, -0.7070, 1.4140, -1.4140], atol=1e-4)
    after = gdpo(rewards, groups, np.ones(2), eps=1e-4)
    np.testing.assert_allclose(after, [0.5477, -0.5477, 1.0954, -1.0954], atol=1e-4)


def test_gdpo_weights_scale_normalised_dimensions():
    # pair groups: each non-constant dim is ±1/√2; weights (2, .5) -> rows (1,0),(0,1): ±1.5/√2
    rewards = np.array([[1.0, 0.0], [0.0, 1.0]])
    adv = gdpo(rewards, np.array([3, 3]), np.array([2.0, 0.5]), eps=0.0, batch_norm=False)
    np.testing.assert_allclose(adv, [1.5 * SQRT_HALF, -1.5 * SQRT_HALF], rtol=1e-6)


def test_gdpo_rejects_mismatched_weights():
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        gdpo(np.zeros((3, 2)), np.zeros(3, np.int32), np.ones(3), eps=1e-4)
    with pytest.raises(ValueError, match=r"f32\[N, D\]"):
        gdpo(np.zeros(3), np.zeros(3, np.int32), np.ones(1), eps=1e-4)


# ---------------------------------------------------------------- q(L) and filtering


def test_cot_length_penalty_ramp_and_thresholds():
    lengths = np.array([0.0, 100.0, 150.0, 171.2, 200.0, 290.6])
    # clip((L-100)/100, 0, 1)
    np.testing.assert_allclose(
        cot_length_penalty(lengths), [0.0, 0.0, 0.5, 0.712, 1.0, 1.0], atol=1e-6
    )
    np.testing.assert_allclose(cot_length_penalty(np.array([30.0]), low=20.0, high=60.0), [0.25])
    with pytest.raises(ValueError, match="high > low"):
        cot_length_penalty(lengths, low=200.0, high=100.0)


def test_zero_advantage_filter_on_final_advantage():
    adv = np.array([0.5, 0.0, -1e-9, -2.0, 3.0])
    np.testing.assert_array_equal(zero_advantage_filter(adv), [1, 0, 1, 1, 1])
    np.testing.assert_array_equal(zero_advantage_filter(adv, atol=1e-6), [1, 0, 0, 1, 1])
    valid = np.array([1, 1, 1, 1, 0])
    np.testing.assert_array_equal(zero_advantage_filter(adv, valid), [1, 0, 1, 1, 0])


# ---------------------------------------------------------------- HAT segment pools

# Two rollout groups (7 and 2) of two trajectories, each with one tool and one reply segment.
# Columns: tool_rationality, skill_selection, accuracy, effectiveness; NaN = column not in pool.
NAN = float("nan")
HAT_REWARDS = np.array(
    [
        [1, 1, NAN, NAN],  # g7 A tool, L=150 -> q=.5
        [NAN, NAN, 1, 0.5],  # g7 A reply, L=50 -> q=0
        [0, 1, NAN, NAN],  # g7 B tool, L=250 -> q=1
        [NAN, NAN, 1, 1],  # g7 B reply, L=120 -> q=.2
        [1, 0, NAN, NAN],  # g2 C tool, L=0
        [NAN, NAN, 0, 0],  # g2 C reply, L=300 -> q=1
        [1, 1, NAN, NAN],  # g2 D tool, L=0
        [NAN, NAN, 1, 0.5],  # g2 D reply, L=300 -> q=1
    ],
    np.float32,
)
HAT_KINDS = np.array([TOOL, REPLY] * 4, np.int32)
HAT_GROUPS = np.array([7, 7, 7, 7, 2, 2, 2, 2], np.int32)
HAT_LENGTHS = np.array([150, 50, 250, 120, 0, 300, 0, 300], np.float32)


def test_hat_pools_by_hand():
    # Every pool group is a pair, so each non-constant dimension is ±1/√2 (u := 1/√2):
    #   g7 tool : TR [1,0] -> ±u, SS const -> 0, -q [-.5,-1] -> ±u  => ±(1 + .1)u = ±1.1u
    #   g7 reply: Acc const, Eff [.5,1] -> ∓u, -q [0,-.2] -> ±u     => ∓(1 - .1)u = ∓0.9u
    #   g2 tool : TR const, SS [0,1] -> ∓u, q const                   => ∓u
    #   g2 reply: Acc [0,1] -> ∓u, Eff [0,.5] -> ∓u, q const          => ∓2u
    u = SQRT_HALF
    cfg = HatAdvantageConfig(eps=0.0, batch_norm=False)
    out = hat_advantages(HAT_REWARDS, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, cfg)
    expected = np.array([1.1, -0.9, -1.1, 0.9, -1.0, -2.0, 1.0, 2.0]) * u
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-6)
    np.testing.assert_allclose(out.length_penalty, [0.5, 0, 1, 0.2, 0, 1, 0, 1], atol=1e-6)
    # Batch norm per pool (ddof=1, mean 0):
    #   tool  std = u*sqrt((2*1.21 + 2*1)/3) = .858293 -> 1.1u/.858293 = .906238, u/.858293 = .823853
    #   reply std = u*sqrt((2*.81 + 2*4)/3) = 1.266227 -> .9u/1.266227 = .502592, 2u/1.266227 = 1.116871
    out = hat_advantages(
        HAT_REWARDS, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, HatAdvantageConfig(eps=0.0)
    )
    np.testing.assert_allclose(
        out.advantages,
        [0.906238, -0.502592, -0.906238, 0.502592, -0.823853, -1.116871, 0.823853, 1.116871],
        atol=1e-5,
    )
    np.testing.assert_array_equal(out.keep, np.ones(8))


def test_hat_length_weight_is_configurable_and_zero_disables_it():
    cfg = HatAdvantageConfig(eps=0.0, batch_norm=False, length_weight=0.0)
    out = hat_advantages(HAT_REWARDS, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, cfg)
    np.testing.assert_allclose(out.advantages[:4], np.array([1, -1, -1, 1]) * SQRT_HALF, rtol=1e-6)
    # thresholds 0/1000: q = L/1000 -> same ranking within the pairs, same ±u contributions
    cfg = HatAdvantageConfig(eps=0.0, batch_norm=False, length_low=0.0, length_high=1000.0)
    out = hat_advantages(HAT_REWARDS, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, cfg)
    np.testing.assert_allclose(out.length_penalty[:4], [0.15, 0.05, 0.25, 0.12], atol=1e-6)
    # g2 now has q tool [0,0] const, reply [.3,.3] const: unchanged
    np.testing.assert_allclose(out.advantages[4:], np.array([-1, -2, 1, 2]) * SQRT_HALF, rtol=1e-6)


def test_hat_pools_are_independent():
    # Changing every reply reward leaves the tool pool's advantages untouched and vice versa.
    base = hat_advantages(HAT_REWARDS, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, HatAdvantageConfig())
    changed = HAT_REWARDS.copy()
    changed[HAT_KINDS == REPLY, 2:] = [[0, 1], [1, 0], [1, 1], [0, 0]]
    other = hat_advantages(changed, HAT_KINDS, HAT_GROUPS, HAT_LENGTHS, HatAdvantageConfig())
    tool = HAT_KINDS == TOOL
    np.testing.assert_array_equal(base.advantages[tool], other.advantages[tool])
    assert not np.allclose(base.advantages[~tool], other.advantages[~tool])


def test_hat_zero_advantage_filter_uses_final_advantage_and_padding():
    # Group 5: two identical trajectories (same rewards and lengths) -> final advantage 0 -> dropped.
    # Row 4: kind -1 is padding (NaN everywhere) -> advantage 0, dropped, excluded from stats.
    rewards = np.array(
        [[1, 0, NAN, NAN], [1, 0, NAN, NAN], [NAN, NAN, 1, 1], [NAN, NAN, 1, 1], [NAN] * 4],
        np.float32,
    )
    kinds = np.array([TOOL, TOOL, REPLY, REPLY, -1], np.int32)
    groups = np.array([5, 5, 5, 5, 5], np.int32)
    lengths = np.array([120, 120, 10, 10, NAN], np.float32)
    out = hat_advantages(rewards, kinds, groups, lengths, HatAdvantageConfig())
    assert np.all(np.asarray(out.advantages) == 0.0)
    np.testing.assert_array_equal(out.keep, np.zeros(5))
    # Same task rewards, different CoT lengths: the length dimension alone keeps them.
    lengths = np.array([120, 180, 10, 10, 0], np.float32)
    out = hat_advantages(rewards, kinds, groups, lengths, HatAdvantageConfig(batch_norm=False))
    np.testing.assert_allclose(out.advantages[:2], [0.1 * SQRT_HALF, -0.1 * SQRT_HALF], rtol=1e-5)
    np.testing.assert_array_equal(out.keep, [1, 1, 0, 0, 0])


def test_hat_config_validation():
    with pytest.raises(ValueError, match="length_high > length_low"):
        HatAdvantageConfig(length_low=200.0, length_high=100.0)
    with pytest.raises(ValueError, match="tool_weights"):
        HatAdvantageConfig(tool_weights=(1.0,))
    with pytest.raises(ValueError, match="length_weight"):
        HatAdvantageConfig(length_weight=-0.1)
    with pytest.raises(ValueError, match=r"f32\[N, 4\]"):
        hat_advantages(
            np.zeros((3, 2)), np.zeros(3), np.zeros(3, np.int32), np.zeros(3), HatAdvantageConfig()
        )


# ---------------------------------------------------------------- jit over shapes, edge cases


def test_everything_jits_over_varying_batch_sizes():
    # The public functions are jitted themselves (one program per N); they also nest in jit.
    rng = np.random.default_rng(0)
    w = np.array([1.0, 0.5, 2.0, 1.0], np.float32)
    for n in (0, 8, 33):  # N = 8 shares its programs with the property tests below
        groups = rng.integers(-5, 5, size=n).astype(np.int32) * 1000
        rewards = rng.integers(0, 3, size=(n, 4)).astype(np.float32) / 2
        valid = (rng.random(n) < 0.8).astype(np.float32)
        np.testing.assert_allclose(
            grpo(rewards[:, 0], groups, eps=1e-6, valid=valid),
            np_group_norm(rewards[:, 0], groups, valid > 0, 1e-6),
            atol=1e-5,
        )
        np.testing.assert_allclose(
            gdpo(rewards, groups, w, eps=1e-4, valid=valid),
            np_gdpo(rewards, groups, w, valid > 0, 1e-4),
            atol=1e-4,
        )
        kinds = rng.integers(0, 2, size=n).astype(np.int32)
        lengths = rng.uniform(0, 300, n).astype(np.float32)
        out = hat_advantages(rewards, kinds, groups, lengths, HatAdvantageConfig(), valid=valid)
        assert out.advantages.shape == (n,) and np.all(np.isfinite(out.advantages))
    nested = jax.jit(hat_advantages, static_argnums=4)  # traced inputs skip the eager checks
    inner = nested(rewards, kinds, groups, lengths, HatAdvantageConfig(), valid=valid)
    np.testing.assert_allclose(inner.advantages, out.advantages, rtol=1e-6)


def test_degenerate_batches_are_finite():
    for valid in ([0.0, 0.0], [1.0, 0.0], [1.0, 1.0]):
        for eps in (0.0, 1e-6):
            a = gdpo(np.ones((2, 3)), np.array([0, 1]), np.ones(3), eps=eps, valid=np.array(valid))
            assert np.all(np.asarray(a) == 0.0)
            a = grpo(np.array([1e30, -1e30]), np.array([0, 0]), eps=eps, valid=np.array(valid))
            assert np.all(np.isfinite(a))


# ---------------------------------------------------------------- properties

N = 8
rewards_st = hnp.arrays(
    np.float32, (N,), elements=st.sampled_from([0.0, 0.5, 1.0, 0.25, -2.0, 3.0])
)
groups_st = hnp.arrays(np.int32, (N,), elements=st.integers(-3, 3))
valid_st = hnp.arrays(np.float32, (N,), elements=st.sampled_from([0.0, 1.0, 1.0]))
_grpo = functools.partial(grpo, eps=1e-6)
_gdpo = functools.partial(gdpo, eps=1e-6)
PROPS = settings(max_examples=25, deadline=None)


@PROPS
@given(rewards_st, groups_st, valid_st, hnp.arrays(np.float32, (7,), elements=st.integers(-50, 50)))
def test_grpo_matches_reference_and_is_shift_invariant_per_group(r, g, valid, shifts):
    expected = np_group_norm(r, g, valid > 0, 1e-6)
    np.testing.assert_allclose(_grpo(r, g, valid=valid), expected, atol=2e-5)
    shifted = r + shifts[g + 3]  # a different constant for every group
    np.testing.assert_allclose(_grpo(shifted, g, valid=valid), expected, atol=2e-4)


@PROPS
@given(
    hnp.arrays(np.float32, (N, 3), elements=st.sampled_from([0.0, 0.5, 1.0, 2.0])),
    groups_st,
    valid_st,
    st.randoms(use_true_random=False),
)
def test_gdpo_permutation_within_groups_permutes_output(r, g, valid, rnd):
    w = np.array([1.0, 0.3, 2.0])
    out = np.asarray(_gdpo(r, g, w, valid=valid))
    np.testing.assert_allclose(out, np_gdpo(r, g, [1.0, 0.3, 2.0], valid > 0, 1e-6), atol=1e-4)
    perm = np.arange(N)
    for group in np.unique(g):  # shuffle rows only among members of the same group
        idx = np.flatnonzero(g == group)
        perm[idx] = rnd.sample(list(idx), len(idx))
    permuted = np.asarray(_gdpo(r[perm], g[perm], w, valid=valid[perm]))
    np.testing.assert_allclose(permuted, out[perm], atol=1e-5)
    relabelled = np.asarray(_gdpo(r, g * 37 + 1000, w, valid=valid))  # ids are labels only
    np.testing.assert_allclose(relabelled, out, atol=1e-6)


@PROPS
@given(
    hnp.arrays(np.float32, (N, 4), elements=st.sampled_from([0.0, 0.5, 1.0])),
    hnp.arrays(np.int32, (N,), elements=st.integers(-1, 1)),
    groups_st,
    hnp.arrays(np.float32, (N,), elements=st.sampled_from([0.0, 90.0, 150.0, 500.0])),
)
def test_hat_is_finite_and_filter_matches_zero_rows(r, kinds, g, lengths):
    out = hat_advantages(r, kinds, g, lengths, HatAdvantageConfig())
    adv = np.asarray(out.advantages)
    assert np.all(np.isfinite(adv))
    np.testing.assert_array_equal(np.asarray(out.keep), (adv != 0).astype(np.float32))
    assert np.all(adv[kinds == -1] == 0.0)
