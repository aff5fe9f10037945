"""The bundled live rooms: which Harness and which comment phrasings run on the bundled world.

A room is a name every stage takes (`room="v0"` or `"micro"` in their configs): the world
folder the tools answer from, the released Harness the policy is trained and served with, and
the phrasing file the simulator builds its scenarios (and so the corpus and the evaluation
sets) from.

- `v0`: Harness v0 (`data/livestream/harness/`) and its phrasings, which hold out whole
  sentences: the production room.
- `micro`: the compact Harness derived from v0 (`data/livestream/harness_micro/`: five Skills,
  eleven tools, a short prompt; a conversation in 1.4K-2.3K tokens of the demo tokenizer,
  median 1.7K) and composed phrasings whose held-out sentences are new combinations of
  training words (`data/livestream/scenarios/phrasings_micro.yaml`): built for a tiny model
  trained from random weights on one CPU, which can generalise in that language (README's
  Status has what it learns, and what the Harness prompt in front of the comment costs it).
"""

from __future__ import annotations

import dataclasses
import pathlib

ROOMS = ("v0", "micro")
_DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "livestream"
# name -> (Harness folder, phrasing file, token budget of one rendered conversation)
_FILES = {
    "v0": ("harness", "phrasings.yaml", 6144),
    "micro": ("harness_micro", "phrasings_micro.yaml", 2304),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Room:
    """The files of one bundled room.

    Attributes:
      name: one of `ROOMS`.
      world_dir: the world folder (catalog, live room, orders, viewers, marketing).
      harness_dir: the released Harness folder.
      phrasings: the simulator's phrasing file.
      token_budget: the most tokens (demo tokenizer) one of its rendered teacher
        conversations takes, under any HSA state: the row length its training configs use
        (tested over every family and dimension, `tests/rl/sim/test_micro_room.py`).
    """

    name: str
    world_dir: pathlib.Path
    harness_dir: pathlib.Path
    phrasings: pathlib.Path
    token_budget: int


def room(name: str = "v0") -> Room:
    """The bundled room called `name` (an unknown name is refused, naming the known ones)."""
    if name not in _FILES:
        raise ValueError(f"unknown live room {name!r}; the bundled rooms are {list(ROOMS)}")
    harness, phrasings, budget = _FILES[name]
    return Room(
        name=name,
        world_dir=_DATA,
        harness_dir=_DATA / harness,
        phrasings=_DATA / "scenarios" / phrasings,
        token_budget=budget,
    )
