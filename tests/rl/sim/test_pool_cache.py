"""The on-disk scenario pool cache (`rl.sim._pool_cache`): a read-back pool equals a generated
one, any change to the room's files misses, a damaged file is regenerated, `off` writes
nothing, and a cache that cannot be written costs a warning, not the pool."""

import pickle

import pytest

from hat_jax import harness as hx
from hat_jax import livestream
from rl import sim
from rl.sim import _pool_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(_pool_cache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _counting(value):
    calls = []

    def build():
        calls.append(1)
        return value

    return build, calls


def test_the_cached_pool_equals_a_generated_one(cache):
    spec = livestream.room("v0")
    generated = sim.generate_scenarios(livestream.load_world(spec.world_dir),
                                       phrasings=spec.phrasings,
                                       harness=hx.load(spec.harness_dir))  # fmt: skip
    written = sim.default_scenarios.__wrapped__("v0")  # generated, then written
    (path,) = cache.glob("room-v0-*.pickle")
    read = sim.default_scenarios.__wrapped__("v0")  # read back
    assert list(read) == list(written) == list(generated) and len(read) > 2000
    assert read.counts() == generated.counts()
    assert read.get(generated[7].id) == generated[7]
    assert list(cache.iterdir()) == [path]  # no temporary file left


def test_a_second_call_reads_what_the_first_wrote(cache, tmp_path):
    data = tmp_path / "room"
    data.mkdir()
    (data / "catalog.json").write_text('{"a": 1}')
    build, calls = _counting({"pool": [1, 2, 3]})
    assert _pool_cache.cached("r", [data], build) == {"pool": [1, 2, 3]}
    assert _pool_cache.cached("r", [data], build) == {"pool": [1, 2, 3]}
    assert len(calls) == 1
    # Any change to the room's files, or another name, is another key.
    (data / "catalog.json").write_text('{"a": 2}')
    _pool_cache.cached("r", [data], build)
    _pool_cache.cached("q", [data], build)
    assert len(calls) == 3 and len(list(cache.glob("*.pickle"))) == 3
    key = _pool_cache.pool_key("r", [data])
    (data / "sub").mkdir()
    (data / "sub" / "new.yaml").write_text("x: 1")
    assert _pool_cache.pool_key("r", [data]) != key
    assert _pool_cache.pool_key("r", [data]) == _pool_cache.pool_key("r", [data])


def test_a_damaged_file_is_regenerated_and_replaced(cache, tmp_path):
    build, calls = _counting([1, 2])
    data = [tmp_path / "phrasings.yaml"]  # one file (the cache is not under it)
    data[0].write_text("families: {}")
    _pool_cache.cached("r", data, build)
    (path,) = cache.glob("r-*.pickle")
    path.write_bytes(pickle.dumps([1, 2])[:-3])  # truncated
    with pytest.warns(UserWarning, match="is unreadable .* regenerating"):
        assert _pool_cache.cached("r", data, build) == [1, 2]
    assert len(calls) == 2 and pickle.loads(path.read_bytes()) == [1, 2]


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(_pool_cache.ENV, "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    build, calls = _counting(5)
    assert _pool_cache.cached("r", [tmp_path], build) == 5
    assert _pool_cache.cached("r", [tmp_path], build) == 5
    assert len(calls) == 2 and _pool_cache.cache_dir() is None
    monkeypatch.delenv(_pool_cache.ENV)  # unset: the user's cache directory
    assert _pool_cache.cache_dir() == tmp_path / ".cache" / "hat_jax" / "scenarios"


def test_an_unwritable_cache_warns_and_returns_the_pool(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(_pool_cache.ENV, str(blocker / "cache"))  # under a file: cannot exist
    build, calls = _counting("pool")
    with pytest.warns(UserWarning, match="not written"):
        assert _pool_cache.cached("r", [tmp_path], build) == "pool"
