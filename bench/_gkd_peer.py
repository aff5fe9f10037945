"""The TRL peer of `bench/bench_opd.py`: one on-policy distillation step with TRL's GKD trainer.

`gkd_step_times` builds TRL's `GKDTrainer` (trl 1.16.0, `trl.experimental.gkd`) for fully
on-policy, exact full-vocabulary reverse KL ``KL(student || teacher)`` on the student's own
sampled tokens, runs a few real training steps through `Trainer.train`, and times each step split
into sampling (the student's `generate` inside the trainer) and learning (everything else: the
student forward with grad, the teacher forward, the loss, backward, grad clipping, AdamW).
Nothing the trainer computes is changed; the timers are a `TrainerCallback` (step begin/end) and
a pass-through wrapper around the student's `generate`.

What trl 1.16.0's GKD does (read from `trl/experimental/gkd/gkd_trainer.py` and
`gkd_config.py` of the 1.16.0 wheel, not from the docs):

- ``lmbda``: in `training_step`, ``if random.random() <= self.lmbda:`` the batch is replaced by
  student generations (`generate_on_policy_outputs` on the unwrapped student, under
  `unwrap_model_for_generation`). ``random.random()`` is in [0, 1), so ``lmbda=1.0`` means every
  step is on-policy and the dataset's own completions are never trained on.
- ``seq_kd``: only reached when the on-policy branch is not taken (``elif self.seq_kd``): the
  teacher generates instead (sequence-level KD). Irrelevant at ``lmbda=1.0``; left False.
- ``temperature`` and ``max_new_tokens``: only the sampling `GenerationConfig`
  (``do_sample=True, top_k=0, top_p=1.0``, ``use_cache = not gradient_checkpointing``, the
  tokenizer's pad id, the student's generation-config EOS ids). `compute_loss` calls
  `generalized_jsd_loss` WITHOUT a temperature, so the KL is always taken at temperature 1.0
  whatever ``args.temperature`` is (identical to the sampling distribution only at 1.0).
- ``beta``: `generalized_jsd_loss` in 1.16.0 reads::

      student_log_probs = F.log_softmax(student_logits, dim=-1)
      teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)

      if beta == 0:
          jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
      elif beta == 1:
          jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
      else:
          ...  # mixture m = (1 - beta) * p_S + beta * p_T (in log space)
          jsd = beta * kl_teacher + (1 - beta) * kl_student

  ``F.kl_div(input, target, log_target=True) = exp(target) * (target - input)``, so the
  ``beta == 1`` branch is ``p_S * (log p_S - log p_T)`` summed over the vocabulary, i.e. the
  exact reverse KL ``KL(student || teacher)``; ``beta == 0`` is the forward KL
  ``KL(teacher || student)``. So ``beta=1.0`` here (the config help agrees: "When beta is `1.0`,
  the loss is the Inverse KL Divergence"). The definition differed in older TRL releases, hence
  `_check_beta_is_reverse_kl`, which re-derives it numerically from the installed code.
- Masking: `generate_on_policy_outputs` builds labels = the generated sequences with the prompt
  columns and everything after the first EOS set to -100; `compute_loss` shifts
  (``logits[:, :-1]``, ``labels[:, 1:]``) and `generalized_jsd_loss` keeps ``jsd[labels != -100]``.
  So only completion (student-sampled) positions count - but the KL is computed over the full
  ``[B, prompt + completion - 1, V]`` tensor first and masked afterwards, so TRL also spends the
  softmax/KL work on the prompt positions.
- Reduction: the model accepts loss kwargs, so `Trainer` passes ``num_items_in_batch`` and the
  loss is ``sum(jsd[mask]) / num_items_in_batch``. `Trainer` counts ``num_items_in_batch`` on the
  *dataset* batch's labels (``labels[..., 1:] != -100``), before GKD swaps in the generations.
  With prompt-only rows that count is 0 (loss inf/NaN). This peer therefore gives each row a
  placeholder completion of exactly ``max_new_tokens`` tokens, so the normaliser is ``B * N`` =
  the number of student-sampled tokens (generation is forced to exactly N tokens, see below):
  the loss is the token-mean reverse KL, as `rl.distill.reverse_kl(..., "token-mean")`.
  The placeholder tokens are never trained on (lmbda=1 replaces them).
- Student logits: `compute_loss` runs a separate full student forward (with grad) on prompt +
  completion; nothing is reused from `generate` (which runs under ``torch.no_grad``, with KV
  cache). The teacher forward is under ``torch.no_grad()`` and ``teacher_model.eval()``; only
  student parameters get gradients. `compute_loss` ends with ``torch.cuda.empty_cache()``
  (a no-op on CPU).

How this peer feeds the prompts: TRL's own `DataCollatorForChatML` (GKD's default collator), on
its pre-tokenized branch: each row is ``{"prompt": "", "input_ids": prompt + placeholder,
"completion_mask": [0] * len(prompt) + [1] * N}``. The collator takes the prompt as
``input_ids[:completion_mask.index(1)]`` (no text, no re-tokenization; the ``"prompt"`` string
is only looked up, never tokenized on this branch) and left-pads the batch. The generate wrapper
checks that the prompt rows it receives are exactly the given id lists.

Exactly N new tokens: after the trainer is built, ``trainer.generation_config.min_new_tokens =
max_new_tokens`` (the EOS logits are set to -inf until N tokens; ``max_new_tokens`` stops at N),
so every row decodes N tokens, none is EOS, and the completion mask is all ones. The EOS ids
and TRL's EOS masking code stay as they are. The generate wrapper asserts it.

Other settings (all through `GKDConfig`): fp32 (``bf16=False``: TRL's configs default to bf16),
``gradient_checkpointing=False`` (TRL defaults it to True, which would also turn the KV cache off
during generation), ``router_aux_loss_coef=0.0`` (GKD's loss ignores the MoE aux loss anyway; at
the model's default coefficient SFTTrainer would switch ``output_router_logits`` on and the
student would compute an unused aux loss in every forward, decode steps included),
``lr_scheduler_type="constant"``, default optimizer (``adamw_torch_fused``, weight decay 0,
grad-norm clipping at 1.0), no eval, no saving, no logging, ``report_to=[]``, ``use_cpu=True``.

Needs the `bench` extra (trl==1.16.0); run through `python -m bench opd`.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

TRL_VERSION = "1.16.0"
REVERSE_KL_BETA = 1.0


def _check_beta_is_reverse_kl(beta: float) -> None:
    """Asserts that the installed `GKDTrainer.generalized_jsd_loss` at `beta` is the exact
    token-mean reverse KL KL(student || teacher) (and not the forward KL)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    import torch.nn.functional as F
    from trl.experimental.gkd import GKDTrainer

    gen = torch.Generator().manual_seed(0)
    s = 3.0 * torch.randn(2, 5, 11, generator=gen, dtype=torch.float64)
    t = 3.0 * torch.randn(2, 5, 11, generator=gen, dtype=torch.float64)
    labels = torch.ones(2, 5, dtype=torch.long)
    labels[0, :2] = -100
    got = GKDTrainer.generalized_jsd_loss(s, t, labels=labels, beta=beta)
    ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
    reverse = (ls.exp() * (ls - lt)).sum(-1)[labels != -100].mean()
    forward = (lt.exp() * (lt - ls)).sum(-1)[labels != -100].mean()
    if not torch.allclose(got, reverse, rtol=1e-10, atol=1e-12):
        raise AssertionError(
            f"GKD beta={beta} is not KL(student||teacher) in this TRL: loss {float(got):.6f}, "
            f"reverse KL {float(reverse):.6f}, forward KL {float(forward):.6f}"
        )


def gkd_step_times(
    student_dir: str,
    teacher_dir: str,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    steps: int,
    learning_rate: float = 1e-5,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict:
    """Times `steps` GKD training steps (fully on-policy reverse KL) on one batch of prompts.

    Args:
      student_dir, teacher_dir: Hugging Face model directories (config, safetensors, tokenizer
        files); the tokenizer is read from `student_dir`.
      prompts: tokenized prompts; all of them form the batch of every step.
      max_new_tokens: tokens sampled per prompt (exactly, see the module docstring).
      steps: training steps to run; the first is a warm-up, excluded from the medians.
      learning_rate: AdamW learning rate (constant schedule).
      temperature: sampling temperature (the loss is at temperature 1.0 in this TRL).
      seed: the trainer's seed (sampling, data order).

    Returns:
      {"step_s", "sampling_s", "learning_s"} medians over the timed steps, "steps_timed",
      "trl_version", "beta", "notes", plus "per_step" (every step's figures and loss, warm-up
      first), "torch_threads" and "implementations".
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GKD lives in trl.experimental
    import datasets
    import torch
    import transformers
    import trl
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the first is a warm-up), got {steps}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and no empty prompt")
    if trl.__version__ != TRL_VERSION:
        raise RuntimeError(
            f"this peer was written against trl=={TRL_VERSION} (its GKD beta convention and "
            f"loss normalisation), found trl=={trl.__version__}"
        )
    _check_beta_is_reverse_kl(REVERSE_KL_BETA)
    threads = torch.get_num_threads()
    print(f"[gkd peer] torch {torch.__version__}, intra-op threads {threads} (default, untouched)")

    batch, n_new = len(prompts), max_new_tokens
    tokenizer = transformers.AutoTokenizer.from_pretrained(student_dir, local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ValueError(
            f"the tokenizer in {student_dir!r} has no pad token (GKD's collator needs one)"
        )
    student = transformers.AutoModelForCausalLM.from_pretrained(student_dir, dtype=torch.float32)
    teacher = transformers.AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    impl = {
        "attention": student.config._attn_implementation,
        "experts": getattr(student.config, "_experts_implementation", None),
    }

    placeholder = tokenizer.pad_token_id  # never trained on: lmbda=1 replaces every completion
    rows = [
        {
            "prompt": "",
            "input_ids": list(p) + [placeholder] * n_new,
            "completion_mask": [0] * len(p) + [1] * n_new,
        }
        for p in prompts
    ]
    dataset = datasets.Dataset.from_list(rows)
    wanted = sorted(tuple(int(t) for t in p) for p in prompts)

    timing: dict[str, Any] = {"gen": [], "step": [], "loss": [], "items": [], "masked": []}

    class _StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timing["t0"] = time.perf_counter()
            timing["gen_step"] = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            timing["step"].append(time.perf_counter() - timing["t0"])
            timing["gen"].append(timing["gen_step"])

    with tempfile.TemporaryDirectory(prefix="gkd_peer_") as out:
        config = GKDConfig(
            output_dir=out,
            lmbda=1.0,
            beta=REVERSE_KL_BETA,
            seq_kd=False,
            temperature=temperature,
            max_new_tokens=n_new,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=1,
            max_steps=steps,
            learning_rate=learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            seed=seed,
            data_seed=seed,
            bf16=False,
            fp16=False,
            use_cpu=True,
            gradient_checkpointing=False,
            router_aux_loss_coef=0.0,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            disable_tqdm=True,
            push_to_hub=False,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
        )
        trainer = GKDTrainer(
            model=student,
            teacher_model=teacher,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[_StepTimer()],
        )
        # Exactly n_new sampled tokens per row (EOS masked until then); see the module docstring.
        trainer.generation_config.min_new_tokens = n_new
        trainer.generation_kwargs["min_new_tokens"] = n_new
        eos = trainer.generation_config.eos_token_id
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

        model = trainer.accelerator.unwrap_model(trainer.model)
        if model is not student:
            raise RuntimeError("the trainer wrapped the student; the generate timer would miss it")
        original_generate = model.generate

        def timed_generate(*args, **kwargs):
            ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
            got = sorted(tuple(r[m.bool()].tolist()) for r, m in zip(ids, mask))
            if got != wanted:
                raise AssertionError("the trainer's prompt batch differs from the given prompts")
            start = time.perf_counter()
            out_ = original_generate(*args, **kwargs)
            timing["gen_step"] += time.perf_counter() - start
            new = out_.sequences[:, ids.shape[1] :]
            if new.shape != (batch, n_new):
                raise AssertionError(f"generated {tuple(new.shape)}, wanted {(batch, n_new)}")
            if eos_ids and bool(torch.isin(new, torch.tensor(eos_ids)).any()):
                raise AssertionError("EOS sampled despite min_new_tokens")
            return out_

        model.generate = timed_generate

        original_compute_loss = trainer.compute_loss

        def recorded_compute_loss(model_, inputs, *args, **kwargs):
            loss = original_compute_loss(model_, inputs, *args, **kwargs)
            value = loss[0] if isinstance(loss, tuple) else loss
            timing["loss"].append(float(value.detach()))
            n_items = kwargs.get("num_items_in_batch")
            timing["items"].append(None if n_items is None else int(n_items))
            timing["masked"].append(int((inputs["labels"][:, 1:] != -100).sum()))
            return loss

        trainer.compute_loss = recorded_compute_loss
        load_before = os.getloadavg()[0]
        trainer.train()
        load_after = os.getloadavg()[0]

        optim = str(trainer.args.optim)
        max_grad_norm = trainer.args.max_grad_norm
        del trainer

    if len(timing["step"]) != steps:
        raise RuntimeError(f"timed {len(timing['step'])} steps, expected {steps}")
    if any(m != batch * n_new for m in timing["masked"]):
        raise AssertionError(f"loss positions per step {timing['masked']}, wanted {batch * n_new}")
    per_step = [
        {"step_s": s, "sampling_s": g, "learning_s": s - g, "loss": loss}
        for s, g, loss in zip(timing["step"], timing["gen"], timing["loss"])
    ]
    timed = per_step[1:]
    med = {
        k: statistics.median(r[k] for r in timed) for k in ("step_s", "sampling_s", "learning_s")
    }
    notes = (
        f"trl {trl.__version__} GKDTrainer, lmbda=1.0 (always on-policy), beta={REVERSE_KL_BETA} "
        "(= exact full-vocab KL(student||teacher), checked numerically), loss at temperature 1 "
        f"(sampling at {temperature}, top_k=0, top_p=1), masked to the {batch}x{n_new} sampled "
        f"tokens, normalised by num_items_in_batch={timing['items'][0]} (token mean); "
        f"min_new_tokens=max_new_tokens={n_new} (EOS ids {eos_ids} masked until then); "
        "KV-cached generate; "
        "separate student forward with grad + teacher forward under no_grad; "
        f"{optim}, clip {max_grad_norm}, constant lr {learning_rate}; fp32 CPU, torch threads "
        f"{threads}, attention={impl['attention']}, experts={impl['experts']}; MoE aux loss off "
        "(router_aux_loss_coef=0, GKD ignores it); step = TrainerCallback step begin->end "
        "(excludes data loading), sampling = student.generate wall time; medians taken per "
        f"column; 1-min load average {load_before:.2f} before / {load_after:.2f} after "
        f"training on {os.cpu_count()} cores."
    )
    return {
        **med,
        "steps_timed": len(timed),
        "trl_version": trl.__version__,
        "beta": REVERSE_KL_BETA,
        "notes": notes,
        "per_step": per_step,
        "torch_threads": threads,
        "implementations": impl,
    }
