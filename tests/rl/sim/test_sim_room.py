"""LiveRoom: sampling by family proportions, Harness-state draws, determinism, groups, and the
per-segment arrays HAT's advantages consume."""

import numpy as np
import pytest

from hat_jax import harness as hx
from hat_jax import hsa
from rl import advantages, sim
from rl.rewards import approx_tokens, batch_segments


def test_same_seed_same_episode(room):
    a, b = room.run(room.teacher(), seed=41), room.run(room.teacher(), seed=41)
    assert a.scenario.id == b.scenario.id and a.state.harness.version == b.state.harness.version
    assert a.trajectory.messages == b.trajectory.messages
    assert a.rewards == b.rewards


def test_proportions_pick_families(world, base, scenarios):
    cfg = sim.SimConfig(proportions={"stock": 3.0, "casual_chat": 1.0})
    room = sim.LiveRoom(cfg, world=world, harness=base, scenarios=scenarios)
    families = [room.sample(k).family for k in range(400)]
    assert set(families) == {"stock", "casual_chat"}
    assert 0.65 < families.count("stock") / 400 < 0.85
    assert all(room.sample(k).split == "train" for k in range(50))


def test_bad_configs_fail_clearly(world, base, scenarios):
    with pytest.raises(ValueError, match=r"unknown families \['weather'\]"):
        sim.SimConfig(proportions={"weather": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        sim.SimConfig(proportions={"stock": 0.0})
    with pytest.raises(ValueError, match="split"):
        sim.SimConfig(split="holdout")
    only_price = sim.ScenarioSet(scenarios.family("price_promotion"))
    with pytest.raises(
        ValueError, match=r"families \['stock'\] have weight but no train scenarios"
    ):
        sim.LiveRoom(
            sim.SimConfig(proportions={"stock": 1.0}),
            world=world,
            harness=base,
            scenarios=only_price,
        )


@pytest.mark.parametrize(("fraction", "augmented"), [(1.0, False), (0.0, True)])
def test_original_fraction(world, base, scenarios, fraction, augmented):
    cfg = sim.SimConfig(hsa=sim.HsaConfig(original_fraction=fraction))
    room = sim.LiveRoom(cfg, world=world, harness=base, scenarios=scenarios)
    for k in range(5):
        ep = room.run(room.teacher(), seed=k)
        assert ep.augmented is augmented
        assert (ep.state.harness.version != base.version) is augmented


def test_mixed_original_and_augmented(room):
    flags = [room.state_for(room.sample(k), k)[1] for k in range(200)]
    assert 0.15 < flags.count(False) / 200 < 0.35  # original_fraction = 0.25


def test_dims_follow_the_config(world, base, scenarios):
    cfg = sim.SimConfig(hsa=sim.HsaConfig(dims="tool_def", original_fraction=0.0))
    room = sim.LiveRoom(cfg, world=world, harness=base, scenarios=scenarios)
    ep = room.run(room.teacher(), seed=2)
    changed = {d for d, what in hsa.changes(base, ep.state).items() if what}
    assert changed == {hsa.Dim.TOOL_DEF}


def test_group_shares_one_state_and_draws_faults_per_member(world, base, scenarios):
    cfg = sim.SimConfig(
        faults=sim.FaultConfig(timeout=0.3, malformed=0.2), hsa=sim.HsaConfig(original_fraction=0.0)
    )
    room = sim.LiveRoom(cfg, world=world, harness=base, scenarios=scenarios)
    s = room.sample(9)
    group = room.group(room.teacher(), s, seed=9, n=6)
    assert len(group) == 6 and len({ep.state.harness.version for ep in group}) == 1
    assert all(ep.augmented for ep in group)
    assert len({tuple((f.call, f.kind) for f in ep.faults) for ep in group}) > 1


def test_episodes_and_segments_feed_hat_advantages(room, base):
    """A group of teacher and deliberately worse rollouts gives finite, pool-separated
    advantages; teacher segments are tool rounds then one reply round."""
    s = next(ep.scenario for ep in room.episodes(room.teacher(), 1, seed=5))
    state = hsa.augment(base, seed=5, preserve=s.needs)
    good = room.run(room.teacher(), s, seed=1, state=state)
    seg = good.segments()
    assert (
        list(seg.kinds[:-1]) == [advantages.TOOL] * (len(seg) - 1)
        and seg.kinds[-1] == advantages.REPLY
    )
    reasoning = [c.output["reasoning"] for c in good.trajectory.model_calls]
    np.testing.assert_array_equal(seg.cot_lengths, [approx_tokens(r) for r in reasoning])
    np.testing.assert_array_equal(seg.rewards, np.tile(good.rewards.as_array(), (len(seg), 1)))

    lazy = hx.ScriptedPolicy(
        [
            hx.AssistantTurn(
                reasoning="no tools needed " * 60,
                tool_calls=(hx.call(state.surface_tool("reply_public"), text="Great question!"),),
            )
        ],
        repeat_last=True,
    )
    bad = room.run(lazy, s, seed=2, state=state)
    rewards, kinds, groups, cot = batch_segments(
        [good.segments(), bad.segments(), good.segments()], [7, 7, 7]
    )
    assert rewards.shape == (len(kinds), 4) and set(groups) == {7}
    out = advantages.hat_advantages(rewards, kinds, groups, cot, advantages.HatAdvantageConfig())
    a = np.asarray(out.advantages)
    assert np.isfinite(a).all() and (np.asarray(out.keep) > 0).any()


def test_batch_segments_checks_lengths():
    with pytest.raises(ValueError, match="2 episodes but 1 group ids"):
        batch_segments([None, None], [0])
    r, k, g, c = batch_segments([], [])
    assert r.shape == (0, 4) and k.shape == g.shape == c.shape == (0,)


@pytest.mark.slow
def test_episodes_and_scenarios_do_not_depend_on_the_process(room):
    """String hashing differs between processes; scenarios and episodes must not."""
    import hashlib
    import json
    import os
    import subprocess
    import sys

    def digest(r):
        eps = [r.run(r.teacher(), seed=k) for k in (3, 4)]
        blob = json.dumps(
            [[e.scenario.id, e.trajectory.messages, e.rewards.to_dict()] for e in eps],
            sort_keys=True,
        )
        ids = ",".join(s.id for s in sim.default_scenarios()[::50])
        return hashlib.sha256((blob + ids).encode()).hexdigest()

    code = (
        "import hashlib, json\n"
        "from rl import sim\n"
        "r = sim.LiveRoom()\n"
        "eps = [r.run(r.teacher(), seed=k) for k in (3, 4)]\n"
        "blob = json.dumps([[e.scenario.id, e.trajectory.messages, e.rewards.to_dict()] for e in eps], sort_keys=True)\n"
        "ids = ','.join(s.id for s in sim.default_scenarios()[::50])\n"
        "print(hashlib.sha256((blob + ids).encode()).hexdigest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "7", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-1000:]
    assert proc.stdout.strip() == digest(room)
