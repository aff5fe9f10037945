"""Atomic writes: a failed write leaves the old file and no temporary behind."""

import json
import stat

import pytest

from hat_jax import files


def test_write_json_replaces_and_is_readable_by_others(tmp_path):
    path = tmp_path / "sub" / "report.json"
    files.write_json(path, {"a": 1})
    files.write_json(path, {"a": "价格"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "价格"}
    assert "价格" in path.read_text(encoding="utf-8")  # non-ASCII kept, not escaped
    assert stat.S_IMODE(path.stat().st_mode) == files.FILE_MODE
    assert [p.name for p in path.parent.iterdir()] == ["report.json"]


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "t.jsonl"
    files.write_jsonl(path, ['{"n": 1}'])

    def lines():
        yield '{"n": 2}'
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="mid-write"):
        files.write_jsonl(path, lines())
    assert path.read_text() == '{"n": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


def test_append_keeps_existing_lines_and_escapes_lone_surrogates(tmp_path):
    path = tmp_path / "t.jsonl"
    files.write_jsonl(path, ['{"n": 1}'])
    files.write_jsonl(path, [json.dumps({"text": "x\ud800y"}, ensure_ascii=False)], append=True)
    records = files.read_jsonl(path)
    assert records[0] == {"n": 1} and records[1]["text"].startswith("x")


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"n": 1}\n\nnot json\n')
    with pytest.raises(ValueError, match=r"t.jsonl:3: not a widget"):
        files.read_jsonl(path, what="widget")
    with pytest.raises(ValueError, match=r":1: not a widget"):
        files.read_jsonl(path, lambda d: d["missing"], what="widget")


def test_read_jsonl_with_problems_reads_the_rest_of_a_damaged_file(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"n": 1}\nnot json\n{"m": 2}\n{"n": 3, "bad": "\xff"}\n')
    problems: list[str] = []
    records = files.read_jsonl(path, lambda d: d["n"], what="item", problems=problems)
    assert records == [1, 3]
    assert [p.split(" (")[0] for p in problems] == [
        f"{path}:2: not an item",
        f"{path}:3: not an item",
    ]
    assert all(p.endswith("; line skipped") for p in problems)


def test_binary_mode_and_bad_mode(tmp_path):
    with files.atomic_open(tmp_path / "x.bin", "wb") as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "x.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="mode"), files.atomic_open(tmp_path / "y", "a"):
        pass


def test_atomic_path_moves_a_complete_file_into_place(tmp_path):
    path = tmp_path / "sub" / "shard.safetensors"
    with files.atomic_path(path) as tmp:
        assert tmp.parent == path.parent and tmp.name.endswith(".tmp") and not path.exists()
        tmp.write_bytes(b"complete")
    assert path.read_bytes() == b"complete"
    assert stat.S_IMODE(path.stat().st_mode) == files.FILE_MODE
    assert [p.name for p in path.parent.iterdir()] == ["shard.safetensors"]


def test_atomic_path_failure_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "shard.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="mid-write"), files.atomic_path(path) as tmp:
        tmp.write_bytes(b"trunc")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["shard.safetensors"]


def test_copy_file(tmp_path):
    (tmp_path / "a.json").write_bytes(b'{"x": "\xc3\xa9"}')
    files.copy_file(tmp_path / "a.json", tmp_path / "out" / "a.json")
    assert (tmp_path / "out" / "a.json").read_bytes() == b'{"x": "\xc3\xa9"}'
