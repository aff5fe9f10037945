"""`LiveRoom`: the simulated live room HSA-RL rolls out in (paper §3.3).

Four parts, as in the paper: input sampling (scenarios drawn by family in proportions the
operator sets), configuration augmentation (a fresh Harness state per episode, or the original
for a configurable share), sandboxed tool execution (with fault injection) and scheduling,
which is the Harness's own agent loop (`run_agent`). The same `HarnessState` governs the policy
(it sees only surface names) and the environment (executors resolve through its `RenameMap`).

    room = LiveRoom(SimConfig(split="train", faults=FaultConfig(timeout=0.05)))
    ep = room.run(room.teacher(), seed=3)              # sample a scenario, augment, roll out
    ep.trajectory, ep.rewards, ep.segments()
    group = room.group(policy, scenario, seed=3, n=8)  # G rollouts of one prompt for GRPO

Every draw (scenario, Harness state, faults, sampling seed) derives from the episode `seed`,
so an episode is reproducible from (seed, scenario, config) alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from hat_jax import harness as hx
from hat_jax import hsa, livestream
from rl.sim._generate import default_scenarios
from rl.sim._sandbox import FaultConfig, InjectedFault, Sandbox
from rl.sim._scenario import FAMILIES, SPLITS, Scenario, ScenarioSet
from rl.sim._teacher import ScriptedTeacher, injection_needs

PolicyFactory = Callable[[Scenario, hx.HarnessState], hx.PolicyModel]


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HsaConfig:
    """How episodes vary the Harness.

    Attributes:
      dims: HSA dimensions to vary (see `hat_jax.hsa.Dim`).
      strength: probability of each individual change, in [0, 1].
      original_fraction: share of episodes run under the unmodified Harness.
    """

    dims: frozenset[hsa.Dim] = hsa.ALL
    strength: float = 0.5
    original_fraction: float = 0.25

    def __post_init__(self):
        object.__setattr__(self, "dims", hsa.parse_dims(self.dims))
        if not 0.0 <= self.original_fraction <= 1.0:
            raise ValueError(f"original_fraction must be in [0, 1], got {self.original_fraction}")
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"strength must be in [0, 1], got {self.strength}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Settings of the simulated room.

    Attributes:
      room: the bundled live room (`livestream.room`: "v0" or "micro"): its world, released
        Harness and scenarios are the defaults of `LiveRoom`.
      split: which scenarios episodes are drawn from (train, dev or test).
      proportions: family -> weight for sampling (missing families get 0); None samples every
        family of the split equally.
      hsa: Harness-state augmentation per episode.
      faults: fault injection of the sandboxed tools.
      limits: the agent loop's rounds, time budget and per-tool timeout.
    """

    room: str = "v0"
    split: str = "train"
    proportions: Mapping[str, float] | None = None
    hsa: HsaConfig = dataclasses.field(default_factory=HsaConfig)
    faults: FaultConfig = dataclasses.field(default_factory=FaultConfig)
    limits: hx.Limits = dataclasses.field(default_factory=hx.Limits)

    def __post_init__(self):
        livestream.room(self.room)  # an unknown room is refused here, by name
        if self.split not in SPLITS:
            raise ValueError(f"SimConfig.split must be one of {SPLITS}, got {self.split!r}")
        if self.proportions is not None:
            bad = sorted(set(self.proportions) - set(FAMILIES))
            if bad:
                raise ValueError(
                    f"SimConfig.proportions names unknown families {bad}; known: {FAMILIES}"
                )
            if (
                any(w < 0 for w in self.proportions.values())
                or not sum(self.proportions.values()) > 0
            ):
                raise ValueError("SimConfig.proportions must be >= 0 with a positive sum")
            object.__setattr__(self, "proportions", hx.freeze(dict(self.proportions)))


@dataclasses.dataclass
class Episode:
    """One rollout: the scenario, the Harness state, the trajectory and its rewards."""

    scenario: Scenario
    state: hx.HarnessState
    seed: int
    augmented: bool
    trajectory: hx.Trajectory
    rewards: Any
    faults: tuple[InjectedFault, ...] = ()

    def segments(self, **kwargs):
        """Per-segment arrays for `rl.advantages.hat_advantages` (see `rl.rewards.segments`)."""
        from rl.rewards import segments

        return segments(self.trajectory, self.rewards, **kwargs)


class LiveRoom:
    """The simulator: draws scenarios and Harness states, runs a policy, scores the episode.

    Args:
      config: room, split, family proportions, HSA, faults, loop limits.
      world: the world tools answer from (default: the room's).
      harness: the released Harness to vary (default: the room's).
      scenarios: the scenario pool (default: the room's, `default_scenarios(config.room)`).
      rewarder: scores episodes (default: `rl.rewards.Rewarder`).
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        world: livestream.World | None = None,
        harness: hx.Harness | None = None,
        scenarios: ScenarioSet | None = None,
        rewarder=None,
    ):
        from rl.rewards import Rewarder

        self.config = config or SimConfig()
        room = livestream.room(self.config.room)
        self.world = world or livestream.load_world(room.world_dir)
        self.harness = harness or hx.load(room.harness_dir)
        pool = scenarios if scenarios is not None else default_scenarios(self.config.room)
        self.scenarios = pool.split(self.config.split)
        self.rewarder = rewarder or Rewarder(self.harness)
        self._requests: dict[str, hx.Request] = {}
        self._families, self._weights = self._sampling_table()

    def _sampling_table(self) -> tuple[list[ScenarioSet], list[float]]:
        present = {f: self.scenarios.family(f) for f in FAMILIES}
        weights = self.config.proportions or {f: 1.0 for f, s in present.items() if len(s)}
        empty = sorted(f for f, w in weights.items() if w > 0 and not len(present[f]))
        if empty:
            raise ValueError(f"families {empty} have weight but no {self.config.split} scenarios")
        families = [f for f in FAMILIES if weights.get(f, 0) > 0]
        return [present[f] for f in families], [weights[f] for f in families]

    # ------------------------------------------------------------------ draws
    def sample(self, seed: int) -> Scenario:
        """A scenario drawn by family weight, then uniformly within the family."""
        rng = random.Random(_seed("scenario", seed))
        family = rng.choices(self._families, weights=self._weights)[0]
        return family[rng.randrange(len(family))]

    def state_for(
        self, scenario: Scenario, seed: int, *, preserve: hsa.Preserve | None = None
    ) -> tuple[hx.HarnessState, bool]:
        """The Harness state of an episode, and whether it is augmented."""
        cfg = self.config.hsa
        rng = random.Random(_seed("hsa", seed, scenario.id))
        if not cfg.dims or rng.random() < cfg.original_fraction:
            return hx.HarnessState(harness=self.harness), False
        needs = preserve or self._needs(scenario)
        state = hsa.augment(
            self.harness,
            seed=_seed("augment", seed, scenario.id),
            dims=cfg.dims,
            strength=cfg.strength,
            preserve=needs,
        )
        return state, True

    def _needs(self, scenario: Scenario, inject: str | None = None) -> hsa.Preserve:
        needs = injection_needs(scenario, inject)
        if self.config.faults.active:  # room for one retry round
            limit = next(c.max for c in self.harness.prompt.constraints if c.name == "max_rounds")
            needs = needs.merged(hsa.Preserve(min_rounds=min(limit, needs.min_rounds + 1)))
        return needs

    def request(self, scenario: Scenario) -> hx.Request:
        """The request of a scenario (cached: requests are immutable)."""
        request = self._requests.get(scenario.id)
        if request is None:
            request = self._requests[scenario.id] = scenario.request(self.world)
        return request

    # ------------------------------------------------------------------ policies
    def teacher(self, inject: str | None = None) -> PolicyFactory:
        """A factory of `ScriptedTeacher`s for `run` (`inject`: a deliberate mistake)."""

        def make(scenario: Scenario, state: hx.HarnessState) -> hx.PolicyModel:
            return ScriptedTeacher(scenario, state, self.world, inject=inject)

        make.inject = inject  # type: ignore[attr-defined]
        return make

    # ------------------------------------------------------------------ episodes
    def run(
        self,
        policy: hx.PolicyModel | PolicyFactory,
        scenario: Scenario | None = None,
        *,
        seed: int,
        state: hx.HarnessState | None = None,
        faults: FaultConfig | None = None,
        sampling: hx.SamplingParams | None = None,
    ) -> Episode:
        """Runs one episode and scores it.

        Args:
          policy: a `PolicyModel`, or a factory `(scenario, state) -> PolicyModel` (e.g.
            `teacher()`).
          scenario: the scenario (default: `sample(seed)`).
          seed: derives the scenario, the Harness state, faults and the sampling seed.
          state: run under this Harness state instead of drawing one.
          faults: override the configured fault injection.
          sampling: decoding settings (its seed defaults to one derived from `seed`).
        """
        scenario = scenario or self.sample(seed)
        inject = getattr(policy, "inject", None)
        augmented = state is not None and state.harness.version != self.harness.version
        if state is None:
            state, augmented = self.state_for(
                scenario, seed, preserve=self._needs(scenario, inject)
            )
        sandbox = Sandbox(
            self.world, faults=faults or self.config.faults, seed=_seed("faults", seed, scenario.id)
        )
        model = policy if isinstance(policy, hx.PolicyModel) else policy(scenario, state)
        sampling = sampling or hx.SamplingParams(seed=_seed("sampling", seed) % 2**31)
        traj = hx.run_agent(
            state,
            self.request(scenario),
            model,
            sandbox.tools,
            limits=self.config.limits,
            sampling=sampling,
        )
        rewards = self.rewarder.score(scenario, traj, state)
        return Episode(scenario, state, seed, augmented, traj, rewards, tuple(sandbox.injected))

    def group(
        self,
        policy: hx.PolicyModel | PolicyFactory,
        scenario: Scenario,
        *,
        seed: int,
        n: int,
        same_state: bool = True,
    ) -> list[Episode]:
        """`n` rollouts of one scenario (a GRPO group): one shared Harness state by default,
        different fault draws and sampling seeds."""
        state = None
        if same_state:
            state, _ = self.state_for(
                scenario, seed, preserve=self._needs(scenario, getattr(policy, "inject", None))
            )
        return [
            self.run(policy, scenario, seed=_seed("member", seed, k), state=state) for k in range(n)
        ]

    def episodes(self, policy, n: int, *, seed: int) -> Iterator[Episode]:
        """`n` independent episodes on sampled scenarios."""
        for k in range(n):
            yield self.run(policy, seed=_seed("episode", seed, k))

    def families(self) -> Sequence[str]:
        return [s[0].family for s in self._families]
