"""`launch.opd` as a user runs it: the demo config end to end (a few steps, prompts too long
for the cap dropped and counted), and each bad input refused with an error that names it."""

import json
import pathlib
import shutil

import jax
import pytest

import data
import models
from configs import opd_demo
from data.tokenizer import load_tokenizer
from hat_jax import sharding
from hat_jax.checkpoint import restore_params
from hat_jax.metrics import read_metrics
from launch import opd

ONE_DEVICE = dict(devices=jax.devices()[:1])  # see tests/train/test_launch_sft.py
TOKENIZER = pathlib.Path(data.__file__).parent / "tokenizer"


def _config(**trainer):
    c = opd_demo.get_config("random")
    c.data.update(dict(heldout_instructions=4, max_prompt_len=44))
    c.sampling.max_new_tokens = 8
    c.eval.update(dict(samples=1))
    c.trainer.update(dict(total_steps=2, batch_size=4, seq_len=52, log_every=1, eval_every=0,
                          checkpoint_every=2, progress=False, plots=False) | trainer)  # fmt: skip
    return c


@pytest.mark.slow
def test_opd_through_the_launch_script_drops_and_counts_long_prompts(tmp_path):
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    result = opd.run(_config(), run_dir=str(tmp_path / "run"), mesh=mesh)
    assert result.step == 2 and any("held-out KL" in line for line in opd.summary(result))
    steps = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # Most bundled prompts are longer than 44 tokens: dropped and counted, never cut.
    assert steps[-1]["dropped_prompts"] > 0 and steps[-1]["prompt_length"] <= 44
    assert result.before and result.after  # step 0 and the last step are evaluated
    params, config = restore_params(tmp_path / "run" / "checkpoints")
    assert "embed" in params and "teacher" not in params
    assert models.QwenConfig.from_dict(config).vocab_size % 128 == 0


def test_a_missing_teacher_is_named(tmp_path):
    c = _config()
    c.teacher.update(dict(kind="hf", path=str(tmp_path / "nowhere")))
    with pytest.raises(FileNotFoundError, match="config.teacher.path=.*nowhere"):
        opd.run(c, run_dir=str(tmp_path / "run"))


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(TOKENIZER, teacher)
    spec = json.loads((teacher / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = [k for k in vocab if k.isalpha() and len(k) > 3][:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens with each other's ids
    (teacher / "tokenizer.json").write_text(json.dumps(spec))
    size = -(-len(load_tokenizer()) // 128) * 128
    config = models.QwenConfig.preset("tiny", vocab_size=size)
    (teacher / "config.json").write_text(json.dumps(config.to_hf_dict()))
    c = _config()
    c.teacher.update(dict(kind="hf", path=str(teacher)))
    with pytest.raises(ValueError, match=f"teacher's tokenizer \\({teacher}\\).*bundled demo"):
        opd.run(c, run_dir=str(tmp_path / "run"))


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    c = _config()
    c.teacher.update(dict(kind="orbax", path=str(tmp_path / "base")))
    import numpy as np
    from flax import nnx

    from hat_jax.checkpoint import save_params

    small = models.QwenConfig.preset("tiny", vocab_size=4096, num_layers=1,
                                     layer_types=("full_attention",))  # fmt: skip
    abstract = nnx.eval_shape(lambda: models.Qwen(small, rngs=nnx.Rngs(0)))
    state = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), nnx.state(abstract, nnx.Param))
    save_params(tmp_path / "base", state, model_config=small.to_dict())
    with pytest.raises(
        ValueError, match="student's vocabulary \\(3968\\) and the teacher's \\(4096\\)"
    ):
        opd.run(c, run_dir=str(tmp_path / "run"))


def test_an_empty_prompt_file_is_an_error(tmp_path):
    empty = tmp_path / "prompts.jsonl"
    empty.write_text("\n")
    c = _config()
    c.data.instructions = str(empty)
    with pytest.raises(ValueError, match="no usable instruction"):
        opd.run(c, run_dir=str(tmp_path / "run"))
    c.data.instructions = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        opd.run(c, run_dir=str(tmp_path / "run"))


def test_ifeval_and_held_out_prompts_never_enter_training(tmp_path):
    instructions = data.load_instructions()
    ifeval = tmp_path / "ifeval.jsonl"
    ifeval.write_text(json.dumps({"key": 1, "prompt": instructions[3].messages[-1]["content"],
                                  "instruction_id_list": [], "kwargs": []}) + "\n")  # fmt: skip
    c = _config()
    c.data.ifeval = str(ifeval)
    with pytest.raises(ValueError, match="1 training prompt\\(s\\) are also IFEval prompts"):
        opd.run(c, run_dir=str(tmp_path / "run"))
    # The official IFEval prompts are refused without a local file: one of them among the
    # training prompts (a Tulu3-format record of its text) names the clash.
    from hat_jax import eval as hev

    official = hev.ifeval_prompts()[7]
    mixed = tmp_path / "mixed.jsonl"
    records = [i.to_record() for i in instructions[:10]] + [
        {"id": "tulu-x", "messages": [{"role": "user", "content": official.prompt}]}
    ] + [instructions[10].to_record()]  # fmt: skip
    mixed.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    c = _config()
    c.data.instructions = str(mixed)
    c.data.heldout_instructions = 1
    with pytest.raises(ValueError, match=r"1 training prompt\(s\) are also official IFEval"
                                         r" prompts \(e.g. \['tulu-x'\]\)"):  # fmt: skip
        opd.run(c, run_dir=str(tmp_path / "run"))
    # The same instruction twice: once in training, once held out.
    twice = tmp_path / "twice.jsonl"
    records = [i.to_record() for i in instructions[:10]] + [instructions[2].to_record()]
    twice.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    c = _config()
    c.data.instructions = str(twice)
    c.data.heldout_instructions = 1
    with pytest.raises(ValueError, match="also held-out prompts"):
        opd.run(c, run_dir=str(tmp_path / "run"))


def test_prompts_too_long_for_any_row_are_an_error_not_a_silent_cut(tmp_path):
    c = _config()
    c.data.max_prompt_len = 4
    c.trainer.seq_len = 16
    mesh = sharding.make_mesh(sharding.MeshConfig(), **ONE_DEVICE)
    with pytest.raises(ValueError, match="held-out prompts fits max_prompt_len=4"):
        opd.run(c, run_dir=str(tmp_path / "run"), mesh=mesh)


def test_speculative_sampling_needs_a_draft_head(tmp_path):
    c = _config()
    c.sampling.num_draft_tokens = 3
    with pytest.raises(ValueError, match="set config.sampling.draft_head"):
        opd.run(c, run_dir=str(tmp_path / "run"))
    c.sampling.draft_head = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.sampling.draft_head: .*nowhere"):
        opd.run(c, run_dir=str(tmp_path / "run"))
    c.sampling.num_draft_tokens = -1
    with pytest.raises(ValueError, match="num_draft_tokens=-1 must be >= 0"):
        opd.build(c)
