"""Fixtures for the data tests: the bundled world, real agent trajectories and record files.

Trajectories come from the Harness's own loop (`run_agent`) with the rule-based policy or a
scripted one, so the conversion and re-render tests read exactly what production records hold.
"""

from __future__ import annotations

import json
import pathlib

import pytest

import data
from data.tokenizer import load_tokenizer
from hat_jax import harness as hx
from hat_jax import livestream
from tests.data._helpers import COMMENTS, record_of, run


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def live_world():
    return livestream.load_world(livestream.default_world_dir())


@pytest.fixture(scope="session")
def base_state():
    return hx.HarnessState(harness=hx.load(livestream.default_world_dir()))


@pytest.fixture(scope="session")
def toolbox(live_world):
    return livestream.builtin_toolbox(live_world)


@pytest.fixture(scope="session")
def rule_records(base_state, live_world, toolbox):
    """Corpus records of rule-based-policy runs over varied comments (agent rows ~4.5K tokens)."""
    out = []
    for i, text in enumerate(COMMENTS):
        policy = livestream.RuleBasedPolicy(base_state, live_world)
        traj = run(base_state, live_world, toolbox, policy, text, f"v{1000 + i}", f"r{i}")
        try:
            out.append(record_of(traj, base_state, f"rule-{i}"))
        except data.ConversionError:
            continue
    assert len(out) >= 8
    return out


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory, rule_records) -> pathlib.Path:
    path = tmp_path_factory.mktemp("corpus") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rule_records), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def chat_file(tmp_path_factory) -> pathlib.Path:
    """Short chat records (the bundled instructions with references): several fit in a row."""
    records = [i.to_record() for i in data.load_instructions() if i.reference is not None]
    path = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path
