"""The live-room simulator of HSA-RL (paper §3.3): scenarios, sandboxed tools with fault
injection, the scripted teacher, and `LiveRoom`, which runs any `PolicyModel` through the
Harness's own agent loop under a fresh Harness state per episode.

    from rl import sim
    scenarios = sim.default_scenarios()                 # >= 2,000, train/dev/test
    room = sim.LiveRoom(sim.SimConfig(split="train"))
    episode = room.run(room.teacher(), seed=0)          # trajectory + reward vector

Scenarios state gold expectations on canonical names; the Harness state of each episode maps
them to what the policy sees. Scenario templates live in `data/livestream/scenarios/`.
"""

from rl.sim._compose import Clause, Results, clause, compose
from rl.sim._generate import (
    default_scenarios,
    generate_scenarios,
    phrasings_path,
    product_splits,
)
from rl.sim._intents import KINDS as INTENT_KINDS
from rl.sim._phrasings import load_phrasings, vocabulary_gaps
from rl.sim._room import Episode, HsaConfig, LiveRoom, PolicyFactory, SimConfig
from rl.sim._sandbox import FAULT_KINDS, MALFORMED_KINDS, FaultConfig, InjectedFault, Sandbox
from rl.sim._scenario import (
    FACT_KINDS,
    FAMILIES,
    SPLITS,
    Claim,
    Fact,
    Gold,
    GoldCall,
    Intent,
    Scenario,
    ScenarioSet,
    read_scenarios,
    write_scenarios,
)
from rl.sim._teacher import INJECTIONS, ScriptedTeacher, injection_needs, plan_calls

__all__ = [
    "FACT_KINDS",
    "FAMILIES",
    "FAULT_KINDS",
    "INJECTIONS",
    "INTENT_KINDS",
    "MALFORMED_KINDS",
    "SPLITS",
    "Claim",
    "Clause",
    "Episode",
    "Fact",
    "FaultConfig",
    "Gold",
    "GoldCall",
    "HsaConfig",
    "InjectedFault",
    "Intent",
    "LiveRoom",
    "PolicyFactory",
    "Results",
    "Sandbox",
    "Scenario",
    "ScenarioSet",
    "ScriptedTeacher",
    "SimConfig",
    "clause",
    "compose",
    "default_scenarios",
    "generate_scenarios",
    "injection_needs",
    "load_phrasings",
    "phrasings_path",
    "plan_calls",
    "product_splits",
    "read_scenarios",
    "vocabulary_gaps",
    "write_scenarios",
]
