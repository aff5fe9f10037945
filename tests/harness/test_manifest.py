"""Reconciling a Harness against a release manifest before promotion."""

import dataclasses
import json

import pytest

from hat_jax import harness as hx


def test_bundled_release_manifest_matches_harness_v0(harness, world_dir):
    """Editing Harness v0 without bumping versions and the manifest fails here on purpose."""
    manifest = world_dir / "harness" / "manifest.json"
    assert hx.reconcile(harness, manifest) == []
    assert hx.promote(harness, manifest) is harness
    assert json.loads(manifest.read_text())["version"] == harness.version


def test_write_read_roundtrip(harness, tmp_path):
    path = hx.write_manifest(harness, tmp_path / "release" / "manifest.json")
    assert hx.read_manifest(path) == harness.manifest()
    assert not [p for p in path.parent.iterdir() if p.name != "manifest.json"]  # no temp files left


def test_every_mismatch_is_reported_and_promotion_refused(harness, tmp_path):
    path = hx.write_manifest(harness, tmp_path / "manifest.json")
    skills = {s.name: s for s in harness.skills}
    reworded = dataclasses.replace(skills["chit-chat"], intro="Keep it light.")  # same version
    bumped = dataclasses.replace(skills["after-sales"], version="1.1.0")
    kept = [reworded, bumped] + [
        s for n, s in skills.items() if n not in ("chit-chat", "after-sales", "multi-intent")
    ]
    extra_tool = dataclasses.replace(harness.tool("search_faq"), name="search_faq_v2")
    variant = dataclasses.replace(harness, skills=tuple(kept), tools=(*harness.tools, extra_tool))
    found = {(m.kind, m.name, m.problem) for m in hx.reconcile(variant, path)}
    assert found == {
        ("skill", "chit-chat", "hash"),
        ("skill", "after-sales", "version"),
        ("skill", "multi-intent", "missing"),
        ("tool", "search_faq_v2", "unexpected"),
    }
    with pytest.raises(hx.PromotionRefused) as err:
        hx.promote(variant, path)
    assert len(err.value.mismatches) == 4
    assert "content changed without a version bump" in str(err.value)


def test_renamed_variant_is_not_promotable(state, tmp_path):
    path = hx.write_manifest(state.harness, tmp_path / "manifest.json")
    variant = state.rename_tool("check_inventory", "stock_lookup")
    problems = {(m.name, m.problem) for m in hx.reconcile(variant.harness, path)}
    assert ("check_inventory", "missing") in problems and ("stock_lookup", "unexpected") in problems


def test_malformed_manifest(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"format": 1, "modules": [{"kind": "skill", "name": "x"}]}))
    with pytest.raises(ValueError, match=r"modules\[0\] needs kind, name, version and hash"):
        hx.read_manifest(path)
    path.write_text(json.dumps({"format": 7, "modules": []}))
    with pytest.raises(ValueError, match="format 7"):
        hx.read_manifest(path)
