"""`launch.sft` end to end on a small demo corpus: corpus -> Grain pipeline -> tiny Qwen ->
checkpoint -> Hugging Face export, and the harness-mode check against the corpus."""

import subprocess
import sys

import jax
import pytest

from configs import sft_demo
from hat_jax import sharding
from launch import sft

# One device: the full model on several simulated CPU devices needs XLA's classic runtime
# (see qwen_mesh_check.py); sharding is covered there.
ONE_DEVICE = dict(devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    cmd = [sys.executable, "-m", "launch.make_corpus", "--out", str(out), "--num_scenarios", "4",
           "--states_per_scenario", "2", "--splits", "train,dev"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    return out


def _records(path):
    import json

    return [json.loads(line) for line in open(path) if line.strip()]


def _config(corpus, **trainer):
    c = sft_demo.get_config()
    c.data.corpus = str(corpus)
    c.data.eval_split = ""
    c.trainer.update(dict(total_steps=2, batch_size=1, seq_len=5120, log_every=1,
                          checkpoint_every=2, progress=False, plots=False) | trainer)  # fmt: skip
    return c


@pytest.mark.slow
def test_sft_on_the_demo_corpus_then_export_to_hf(corpus, tmp_path):
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    with pytest.raises(ValueError, match="not divisible by the data-parallel size 8"):
        sft.run(_config(corpus), run_dir=str(tmp_path / "bad"))
    c = _config(corpus)
    c.data.update(dict(eval_split="dev", tool_choice_records=2, copy_probe_samples=2))
    result = sft.run(c, run_dir=str(tmp_path / "run"), mesh=mesh)
    assert result.step == 2 and result.checkpoint_dir.name == "2"
    assert result.final_metrics["weight"] > 0 and result.final_metrics["loss"] > 0
    # the eval loss and the teacher-forced tool choice of 2 dev records, at the last step
    last = [r for r in _records(result.metrics_path) if "eval/tool_choice" in r][-1]
    assert last["step"] == 2 and "eval/loss" in last
    assert 0.0 <= last["eval/tool_choice"] <= 1.0
    assert 0.0 <= last["eval/skill_decision"] <= 1.0  # every dev record loads a Skill
    assert 0.0 <= last["eval/copy"] <= 1.0  # the copying probe, with them
    lines = sft.summary(result)
    assert any("checkpoint:" in line for line in lines)
    assert any(line.startswith("eval at step 2: dev loss") and "tool choice" in line
               and "Skill named" in line and "in-context copying" in line
               for line in lines)  # fmt: skip
    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "serve.convert", "to-hf", "--checkpoint",
           str(result.checkpoint_dir), "--out", str(out), "--dtype", "float32"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    assert (out / "config.json").is_file()


def test_the_fixed_harness_ablation_refuses_an_augmented_corpus(corpus, tmp_path):
    c = sft_demo.get_config("fixed")
    c.data.corpus = str(corpus)
    with pytest.raises(ValueError, match="generated with states='original\\+augmented'"):
        sft.run(c, run_dir=str(tmp_path))
    c.data.corpus = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="launch.make_corpus"):
        sft.run(c, run_dir=str(tmp_path))


def test_the_general_mode_trains_only_on_a_general_corpus(corpus, tmp_path):
    import data
    from configs import base_demo

    c = base_demo.get_config()
    c.data.corpus = str(corpus)  # an agent corpus
    with pytest.raises(ValueError, match="harness_mode='general' but .* states='original"):
        sft.run(c, run_dir=str(tmp_path))
    general = tmp_path / "general"
    data.write_general_corpus(general, train=8)
    c.data.corpus = str(general)
    c.data.online_hsa_probability = 0.5
    with pytest.raises(ValueError, match="no Harness: data.online_hsa_probability=0"):
        sft.run(c, run_dir=str(tmp_path))
    c = sft_demo.get_config()  # HSA-SFT refuses the general corpus
    c.data.corpus = str(general)
    with pytest.raises(ValueError, match="generated with states='general'"):
        sft.run(c, run_dir=str(tmp_path))
    c = base_demo.get_config()
    c.data.update(dict(corpus=str(general), tool_choice_records=4))
    with pytest.raises(ValueError, match="tool_choice_records > 0 scores tool calls"):
        sft.run(c, run_dir=str(tmp_path))
    c.data.update(dict(tool_choice_records=0, copy_probe_samples=-1))
    with pytest.raises(ValueError, match="copy_probe_samples=-1: must be >= 0"):
        sft.run(c, run_dir=str(tmp_path))
    c.data.update(dict(copy_probe_samples=0, lookup_eval_records=-1))
    with pytest.raises(ValueError, match="lookup_eval_records=-1: must be >= 0"):
        sft.run(c, run_dir=str(tmp_path))
    plain = tmp_path / "plain"  # a dev split without lookup items
    data.write_general_corpus(plain, train=8, dev=4)
    c.data.update(dict(corpus=str(plain), lookup_eval_records=4))
    with pytest.raises(ValueError, match="lookup_eval_records > 0 but .*dev.jsonl holds no lookup"):
        sft._evaluations(c, sft.build(c))
    c.data.update(dict(corpus=str(tmp_path / "missing"), copy_probe_samples=8))
    with pytest.raises(FileNotFoundError, match="launch.make_general"):
        sft.run(c, run_dir=str(tmp_path))
    c = sft_demo.get_config()
    c.data.lookup_eval_records = 4
    with pytest.raises(ValueError, match="lookup_eval_records > 0 scores the base corpus"):
        sft.build(c)


@pytest.mark.slow
def test_the_base_logs_its_lookup_answers(tmp_path):
    import data
    from configs import base_demo

    general = tmp_path / "general"
    data.write_general_corpus(general, train=16, dev=8, lookup_share=0.5)
    c = base_demo.get_config()
    c.data.update(dict(corpus=str(general), copy_probe_samples=0, lookup_eval_records=3))
    c.trainer.update(dict(total_steps=1, batch_size=1, seq_len=512, log_every=1, eval_every=1,
                          checkpoint_every=1, progress=False, plots=False))  # fmt: skip
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    result = sft.run(c, run_dir=str(tmp_path / "run"), mesh=mesh)
    (last,) = [r for r in _records(result.metrics_path) if "eval/lookup" in r]
    assert last["eval/lookup"] == 0.0 and 0.0 <= last["eval/lookup_tokens"] < 1.0
    assert any("lookup answers (teacher-forced) 0.0% exact" in line for line in sft.summary(result))


def test_bare_renders_are_a_training_curriculum_only(tmp_path):
    c = _config(tmp_path / "corpus")
    c.data.eval_split = "dev"
    c.data.bare_probability = 0.5
    built = sft.build(c, run_dir=str(tmp_path / "run"))
    assert built.data.bare_probability == 0.5
    assert built.eval_data.bare_probability == 0.0  # the dev loss is the whole conversation's
    c.data.bare_probability = 1.5
    with pytest.raises(ValueError, match="bare_probability must be in"):
        sft.build(c, run_dir=str(tmp_path / "run"))
