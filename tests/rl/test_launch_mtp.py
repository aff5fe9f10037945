"""`launch.mtp` end to end: a policy and a draft head grafted from a base HF checkpoint, the
adaptation stage on instruction prompts with the demo tokenizer, and the HF export with the
`mtp.*` tensors (which transformers still loads)."""

import pathlib

import jax
import numpy as np
import pytest
import transformers
from flax import nnx

import data
import models
from configs import mtp_demo
from data.tokenizer import load_tokenizer
from hat_jax import sharding
from launch import mtp
from serve import save_hf
from tests.models.qwen_fixtures import read_exported

ONE_DEVICE = dict(devices=jax.devices()[:1])  # see tests/train/test_launch_sft.py


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base HF checkpoint of the demo's tiny size with an `mtp.*` head."""
    vocab = -(-len(load_tokenizer()) // 128) * 128
    config = models.QwenConfig.preset("tiny", vocab_size=vocab)
    policy = models.Qwen(config, rngs=nnx.Rngs(5))
    head = models.MTPHead(config, rngs=nnx.Rngs(6))
    out = tmp_path_factory.mktemp("base")
    tokenizer = pathlib.Path(data.__file__).parent / "tokenizer"
    return save_hf(policy, config, out, dtype="float32", mtp=head, tokenizer_dir=tokenizer)


@pytest.mark.slow
def test_graft_adapt_and_export_through_the_launch_script(base, tmp_path):
    c = mtp_demo.get_config("random")
    c.policy.update(dict(kind="hf", path=str(base)))
    c.head.update(dict(kind="hf", path=str(base)))
    c.data.update(dict(heldout_instructions=4, max_prompt_len=96))
    c.rollout.update(dict(batch_size=2, batches=1, eval_batches=1, max_new_tokens=8))
    # One step at learning rate 0 (the first warmup step): the head stays the grafted one.
    c.trainer.update(dict(total_steps=1, batch_size=2, seq_len=104, log_every=1, eval_every=0,
                          checkpoint_every=1, progress=False, plots=False))  # fmt: skip
    c.optimizer.update(dict(warmup_steps=2, decay_steps=3))
    c.measure_speculative = False
    c.export.hf_dir = str(tmp_path / "hf")
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    result = mtp.run(c, run_dir=str(tmp_path / "run"), mesh=mesh)
    assert result.step == 1 and result.rollouts["rollouts"] == 2
    assert result.after["tokens"] > 0
    np.testing.assert_allclose(result.after["loss"], result.before["loss"], rtol=1e-6)
    assert any("acceptance length" in line for line in mtp.summary(result))
    # The export is the base checkpoint again: the frozen policy and the grafted head, with
    # every one of the 19 mtp.* tensors in place.
    original, exported = read_exported(base), read_exported(tmp_path / "hf")
    assert sorted(exported) == sorted(original)
    assert sum(n.startswith("mtp.") for n in exported) == 19
    for name, value in original.items():
        assert np.array_equal(exported[name], value), name
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


def test_a_missing_policy_checkpoint_is_named(tmp_path):
    c = mtp_demo.get_config("sft")
    c.policy.path = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.policy.path=.*nowhere"):
        mtp.run(c, run_dir=str(tmp_path / "run"))
    c.head.kind = "base"
    with pytest.raises(ValueError, match="config.head.kind='base'"):
        mtp.build(c)
