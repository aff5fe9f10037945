"""The MTP draft head in HF form: the 19 `mtp.*` tensors of REFERENCE.md (names and shapes),
exact round trips in every layout, exports transformers still loads with unchanged logits,
grafting onto a policy with errors that name tensors, and the CLI carrying the head."""

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers
from flax import nnx

import models
from serve import HFCheckpointError, has_mtp, load_hf, load_mtp, restore_mtp, save_hf
from serve.convert import main as convert_main
from tests.models.qwen_fixtures import (
    build,
    qwen3_5_config,
    qwen3_moe_config,
    read_exported,
    save,
)


def reference_names(h: int, heads: int, kv: int, d: int, experts: int, f: int, shared: int):
    """REFERENCE.md §1, written out by hand: the 19 tensors (fused experts) and shapes."""
    layer = "mtp.layers.0."
    return {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
        layer + "input_layernorm.weight": (h,),
        layer + "post_attention_layernorm.weight": (h,),
        layer + "self_attn.q_proj.weight": (2 * heads * d, h),  # query and output gate
        layer + "self_attn.k_proj.weight": (kv * d, h),
        layer + "self_attn.v_proj.weight": (kv * d, h),
        layer + "self_attn.o_proj.weight": (h, heads * d),
        layer + "self_attn.q_norm.weight": (d,),
        layer + "self_attn.k_norm.weight": (d,),
        layer + "mlp.gate.weight": (experts, h),
        layer + "mlp.experts.gate_up_proj": (experts, 2 * f, h),
        layer + "mlp.experts.down_proj": (experts, h, f),
        layer + "mlp.shared_expert.gate_proj.weight": (shared, h),
        layer + "mlp.shared_expert.up_proj.weight": (shared, h),
        layer + "mlp.shared_expert.down_proj.weight": (h, shared),
        layer + "mlp.shared_expert_gate.weight": (1, h),
    }


def _random_head(config, seed: int) -> models.MTPHead:
    """A head whose every parameter (norms included) is random, so no mapping hides."""
    head = models.MTPHead(config, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(head)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
    state = jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape, x.dtype) * 0.1, state)
    return nnx.merge(graphdef, state)


def _head_leaves(head) -> dict[str, np.ndarray]:
    return {
        "/".join(map(str, p)): np.asarray(v.get_value())
        for p, v in nnx.to_flat_state(nnx.state(head, nnx.Param))
    }


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(transformers model, its directory, our config, our model, a random head)."""
    hf_model = build(qwen3_5_config(), seed=3)
    src = save(hf_model, tmp_path_factory.mktemp("src"), fused=True)
    config, model = load_hf(src, dtype="float32")
    return hf_model, src, config, model, _random_head(config, seed=4)


def test_export_writes_exactly_the_reference_mtp_tensors(policy, tmp_path):
    _, _, config, model, head = policy
    out = save_hf(model, config, tmp_path, dtype="float32", mtp=head)
    mtp = {n: t.shape for n, t in read_exported(out).items() if n.startswith("mtp.")}
    c = config
    want = reference_names(
        c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.num_experts,
        c.moe_intermediate_size, c.shared_expert_intermediate_size,
    )  # fmt: skip
    assert len(want) == 19 and mtp == want
    # fc is [H, 2H] read as concat([embedding, hidden]): its first H input columns are ours'
    # embedding rows (ours is stored input-first).
    fc = read_exported(out)["mtp.fc.weight"]
    np.testing.assert_array_equal(
        fc[:, : c.hidden_size], np.asarray(head.fc[...])[: c.hidden_size].T
    )
    assert has_mtp(out) and not has_mtp(policy[1])


@pytest.mark.parametrize(
    ("layout", "experts"), [("vl", "fused"), ("text", "fused"), ("text", "per_expert")]
)
def test_exported_head_round_trips_exactly(policy, tmp_path, layout, experts):
    _, _, config, model, head = policy
    out = save_hf(model, config, tmp_path, dtype="float32", layout=layout, expert_layout=experts,
                  mtp=head, max_shard_bytes=200_000)  # fmt: skip
    names = set(read_exported(out))
    assert ("mtp.layers.0.mlp.experts.7.down_proj.weight" in names) == (experts == "per_expert")
    again = load_mtp(out)
    want, got = _head_leaves(head), _head_leaves(again)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and np.array_equal(got[name], value), name


def test_export_with_head_loads_in_transformers_with_unchanged_logits(policy, tmp_path):
    hf_model, _, config, model, head = policy
    out = save_hf(model, config, tmp_path, dtype="float32", mtp=head)  # vl layout, fused
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", experts_implementation="eager"
    )
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, config.vocab_size, (2, 80)))
    with torch.no_grad():
        got = loaded(input_ids=ids, use_cache=False).logits.numpy()
        want = hf_model(input_ids=ids, use_cache=False).logits.numpy()
    np.testing.assert_array_equal(got, want)


def _edit(src, dst, edit):
    tensors = read_exported(src)
    edit(tensors)
    dst.mkdir()
    safetensors.numpy.save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_bad_mtp_tensors_are_named(policy, tmp_path):
    _, _, config, model, head = policy
    src = save_hf(model, config, tmp_path / "src", dtype="float32", mtp=head)
    gate = "mtp.layers.0.mlp.gate.weight"
    missing = _edit(src, tmp_path / "missing", lambda t: t.pop(gate))
    with pytest.raises(HFCheckpointError, match=rf"1 missing: {gate}"):
        load_mtp(missing)
    extra = _edit(src, tmp_path / "extra", lambda t: t.update({"mtp.layers.1.x": np.ones(1)}))
    with pytest.raises(HFCheckpointError, match=r"1 unexpected: mtp\.layers\.1\.x"):
        load_mtp(extra)
    bad = np.ones((8, 63), np.float32)
    shape = _edit(src, tmp_path / "shape", lambda t: t.update({gate: bad}))
    with pytest.raises(HFCheckpointError, match=rf"{gate}: file \(8, 63\) vs expected \(8, 64\)"):
        load_mtp(shape)
    with pytest.raises(HFCheckpointError, match="no mtp.* tensors"):
        load_mtp(policy[1])
    load_hf(extra)  # the policy itself still loads: mtp.* is load_mtp's business


def test_graft_checks_the_head_against_the_policy(policy, tmp_path):
    _, _, config, model, head = policy
    base = save_hf(model, config, tmp_path / "base", dtype="float32", mtp=head)
    grafted = load_mtp(base, config=config.replace(param_dtype="float32"))
    np.testing.assert_array_equal(np.asarray(grafted.fc[...]), np.asarray(head.fc[...]))
    wider = config.replace(moe_intermediate_size=48)
    with pytest.raises(HFCheckpointError) as err:
        load_mtp(base, config=wider)
    message = str(err.value)
    assert "mtp.layers.0.mlp.experts.gate_up_proj: file (8, 64, 64) vs expected (8, 96, 64)" in (
        message
    )
    assert "mtp.fc.weight" not in message  # only the tensors that differ
    plain = models.QwenConfig.from_hf(qwen3_moe_config(num_layers=2).to_dict())
    with pytest.raises(HFCheckpointError, match="has no MTP head"):
        load_mtp(base, config=plain)


def test_cli_carries_the_head_through_orbax(policy, tmp_path):
    _, _, config, model, head = policy
    src = save_hf(model, config, tmp_path / "src", dtype="float32", mtp=head)
    checkpoint, out = tmp_path / "orbax", tmp_path / "hf"
    convert_main(["from-hf", "--hf_dir", str(src), "--out", str(checkpoint)])
    assert (checkpoint / "mtp" / "model_config.json").is_file()
    np.testing.assert_array_equal(
        np.asarray(restore_mtp(checkpoint / "mtp", config).fc[...]), np.asarray(head.fc[...])
    )
    convert_main(["to-hf", "--checkpoint", str(checkpoint), "--out", str(out),
                  "--dtype", "float32"])  # fmt: skip
    original, exported = read_exported(src), read_exported(out)
    assert sorted(exported) == sorted(original)
    assert all(np.array_equal(exported[k], v) for k, v in original.items())
    convert_main(["to-hf", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "plain"),
                  "--dtype", "float32", "--no_mtp"])  # fmt: skip
    assert not has_mtp(tmp_path / "plain")


def test_cli_grafts_a_base_head_onto_a_policy_checkpoint(policy, tmp_path):
    _, _, config, model, head = policy
    base = save_hf(model, config, tmp_path / "base", dtype="float32", mtp=head)
    policy_dir, out = tmp_path / "policy", tmp_path / "hf"
    convert_main(["from-hf", "--hf_dir", str(policy[1]), "--out", str(policy_dir)])
    assert not (policy_dir / "mtp").exists()  # the policy's own directory has no head
    with pytest.raises(SystemExit, match="exactly one of"):
        convert_main(["graft", "--checkpoint", str(policy_dir)])
    convert_main(["graft", "--checkpoint", str(policy_dir), "--hf_dir", str(base)])
    convert_main(["to-hf", "--checkpoint", str(policy_dir), "--out", str(out),
                  "--dtype", "float32"])  # fmt: skip
    exported, want = read_exported(out), read_exported(base)
    assert sorted(exported) == sorted(want)
    assert all(np.array_equal(exported[k], v) for k, v in want.items())
    wide = tmp_path / "wide"  # a base of another size is refused, the tensor named
    _edit(base, wide, lambda t: t.update({"mtp.norm.weight": np.ones(65, np.float32)}))
    with pytest.raises(HFCheckpointError, match=r"mtp\.norm\.weight: file \(65,\)"):
        convert_main(["graft", "--checkpoint", str(policy_dir), "--hf_dir", str(wide),
                      "--overwrite"])  # fmt: skip
    convert_main(["graft", "--checkpoint", str(policy_dir), "--random", "--seed", "3",
                  "--out", str(tmp_path / "random_head")])  # fmt: skip
    fresh = restore_mtp(tmp_path / "random_head", config)
    assert not np.array_equal(np.asarray(fresh.fc[...]), np.asarray(head.fc[...]))
