"""The pipeline inside the training core: the state the trainer saves with a checkpoint puts a
fresh pipeline exactly where training stopped (the trainer's own tests show that a resumed run
then repeats an uninterrupted one's losses)."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

import data
from hat_jax import sharding, train
from models import Qwen, QwenConfig


@pytest.mark.slow
def test_the_checkpointed_data_state_resumes_the_pipeline(tmp_path, chat_file, tokenizer):
    model_config = QwenConfig.preset("tiny").replace(vocab_size=len(tokenizer))
    pipeline = data.PipelineConfig(
        sources=(str(chat_file),), seq_len=256, global_batch_size=2, pack_bins=4, seed=4
    )
    trainer = train.TrainerConfig(
        total_steps=3,
        batch_size=2,
        seq_len=256,
        checkpoint_every=3,
        log_every=1,
        progress=False,
        plots=False,
        async_checkpoints=False,
    )
    result = train.run_sft(
        train.SFTConfig(trainer=trainer),
        model_fn=lambda: Qwen(model_config, rngs=nnx.Rngs(0)),
        data=data.sft_data(pipeline, tokenizer=tokenizer),
        run_dir=tmp_path,
        mesh=sharding.make_mesh(sharding.MeshConfig(), devices=jax.devices()[:1]),
    )
    assert result.step == 3 and np.isfinite(result.final_metrics["loss"])
    saved = json.loads((result.checkpoint_dir / "data" / "process_0-of-1.json").read_text())
    resumed = data.sft_data(pipeline, tokenizer=tokenizer)
    resumed.set_state(saved["state"])
    whole = data.sft_data(pipeline, tokenizer=tokenizer)
    expected = [next(whole) for _ in range(5)][3:]
    for a, b in zip(expected, [next(resumed), next(resumed)], strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in data.BATCH_KEYS)
