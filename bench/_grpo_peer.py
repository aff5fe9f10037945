"""The TRL peer of `bench/bench_rl.py`: one GSPO training step with TRL's GRPO trainer.

`grpo_step_times` builds TRL's `GRPOTrainer` (trl 1.16.0, `trl.GRPOTrainer` / `trl.GRPOConfig`)
for GSPO: B prompts x G sampled completions of exactly N tokens in ONE generation batch, a
python reward on the completion ids, group-normalised advantages, the sequence-level importance
ratio with GSPO's clip range, no KL and no reference model, and ONE AdamW update per step. It
runs a few real training steps through `Trainer.train` and times each step split into sampling
(the policy's `generate` inside the trainer) and learning (everything else: decoding the
completions, the reward, the advantages, the policy forward with grad, the loss, backward, grad
clipping, AdamW). Nothing the trainer computes is changed; the timers are a `TrainerCallback`
(step begin/end) and a pass-through wrapper around the policy's `generate`.

What trl 1.16.0's GRPO does (read from `trl/trainer/grpo_trainer.py` and `grpo_config.py` of
the 1.16.0 wheel, not from the docs):

- Batch sizes. In GRPO ``per_device_train_batch_size`` counts *completions*, not prompts.
  `GRPOConfig.__post_init__`::

      elif self.generation_batch_size is None and self.steps_per_generation is not None:
          self.generation_batch_size = (
              self.per_device_train_batch_size * num_processes * self.steps_per_generation
          )  # (one line in the source)

  and the sampler hands out ``generation_batch_size // num_generations`` prompts, each repeated
  ``num_generations`` times in a row (`RepeatSampler(...,
  mini_repeat_count=self.num_generations, batch_size=self.args.generation_batch_size //
  self.num_generations, repeat_count=self.num_iterations * self.args.steps_per_generation,
  ...)`); the dataloader batch is ``self._train_batch_size * self.args.steps_per_generation``
  rows. `_prepare_inputs` generates once per
  ``generate_every = self.args.steps_per_generation * self.num_iterations`` micro-steps and
  splits the result into ``steps_per_generation`` micro-batches. So this peer sets
  ``per_device_train_batch_size = B * G``, ``num_generations = G``, ``steps_per_generation = 1``
  (hence ``generation_batch_size = B * G``), ``gradient_accumulation_steps = 1``,
  ``num_iterations = 1``: one dataloader batch = the B prompts x G, one `generate` call on B * G
  rows, one micro-batch, one optimizer step. (``generation_batch_size`` and
  ``steps_per_generation`` cannot both be given: "'generation_batch_size' and
  'steps_per_generation' can not be both configured at the same time".) The loss forward uses
  ``batch_size = self.args.per_device_train_batch_size``, so all B * G rows go in one forward.
- Old log-probs at ``num_iterations=1``: NO extra forward. `_generate_and_score_completions`::

      generate_every = self.args.steps_per_generation * self.num_iterations  # generation frequency
      if self.args.gradient_accumulation_steps % generate_every != 0 or (
          self.use_vllm and self.vllm_importance_sampling_correction
      ):
          old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(...)
      else:
          old_per_token_logps = None

  (``1 % 1 == 0`` and no vLLM), and `_compute_loss`::

      old_per_token_logps = inputs.get("old_per_token_logps")
      old_per_token_logps = (
          per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
      )  # (one line in the source)

  so the "old" policy is the detached current one: the ratio's value is exactly 1, its gradient
  is the gradient of the mean token log-prob. The only model forwards per step are the decode
  steps inside `generate` and one forward with grad in `_compute_loss` (this peer counts
  `_get_per_token_logps_and_entropies` calls and asserts exactly one per step, with grad on).
- ``importance_sampling_level="sequence"``, in `_compute_loss`::

      log_ratio = per_token_logps - old_per_token_logps
      ...
      elif self.importance_sampling_level == "sequence":
          log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
          log_importance_weights = log_importance_weights.unsqueeze(-1)
      coef_1 = torch.exp(log_importance_weights)

  i.e. GSPO's ``s_i = exp(mean over the completion's tokens of (log pi - log pi_old))``.
- Clip: ``self.epsilon_low = args.epsilon`` and ``self.epsilon_high = args.epsilon_high if
  args.epsilon_high is not None else args.epsilon``; for ``loss_type`` "grpo"::

      coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
      per_token_loss1 = coef_1 * advantages
      per_token_loss2 = coef_2 * advantages
      per_token_loss = -torch.min(per_token_loss1, per_token_loss2)

  (``delta=None``: no two-sided clip). Here ``epsilon=3e-4``, ``epsilon_high=4e-4`` (GSPO's).
- ``loss_type="grpo"``::

      loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()

  then divided by ``current_gradient_accumulation_steps`` (1). With the sequence-level ratio,
  ``per_token_loss`` is ``(B*G, 1)``, so this is the mean over sequences of GSPO's per-sequence
  term, exactly GSPO's objective; TRL itself warns that "bnpo", "dr_grpo", "dapo" and "cispo"
  weight sequences by length with sequence-level ratios ("To reproduce the GSPO paper's setup,
  set `loss_type='grpo'`"). (With every completion exactly N tokens, grpo / bnpo / dapo give the
  same number anyway.) At ratio 1 the loss VALUE is ``-mean(advantages)``, which is ~0 because
  the advantages are centred per group; the gradient is not zero. The peer asserts the value.
- ``beta=0.0``: ``if self.beta == 0.0: self.ref_model = None`` ("If beta is 0.0, the reference
  model is not needed"), no reference forward (``if self.beta != 0.0:`` guards it) and no KL term.
- ``scale_rewards="group"``: ``advantages = rewards - mean_grouped_rewards`` then
  ``advantages = advantages / (std_rewards + 1e-4)``, with ``std_rewards`` from `nanstd` over each
  group of G (Bessel-corrected: ``correction = count / (count - 1)``), groups being G consecutive
  rows (``rewards.view(-1, num_generations)``).
- Masking. The completion mask is built from the EOS-trimmed id lists
  (``completion_mask = (sequence_indices <= eos_idx.unsqueeze(1)).int()``, then right-padding
  masked by `pad`), prompts are left-padded with ``prompt_mask`` 0 on pads; the loss forward
  scores only completion positions: ``labels[:, :-logits_to_keep] = -100`` and
  ``logits_to_keep = completion_ids.size(1)``, padded positions get ``-100`` too, and the loss
  multiplies by ``mask`` (completion mask). Here every completion is exactly N tokens, so there
  is no completion padding. On CPU TRL's fused LM head (`add_fused_lm_head`) is not "compact"
  (``compact = _use_triton(hidden_states.device)``, CUDA/XPU only): it projects every position
  of prompt + completion through the LM head in chunks and zeroes the prompt positions
  afterwards, so the prompt positions cost LM-head work too. The (B*G, V) logits are never
  materialised at once (chunks of 32768 rows).
- ``mask_truncated_completions=False`` (default; must stay False: a forced-length completion
  with no EOS counts as "truncated" and would be masked out), ``top_entropy_quantile=1.0``,
  ``entropy_coef=0.0``, ``off_policy_mask_threshold=None``, ``use_vllm=False``,
  ``use_transformers_continuous_batching=False``: all off.

How this peer feeds the prompts: as text. trl 1.16.0 has no pre-tokenized prompt path:
`_tokenize_prompts` either applies the chat template to conversational prompts or, for plain
strings, does ``prompt_ids = self.processing_class(text=prompts)["input_ids"]`` (the only other
route, ``rollout_func``, would replace the trainer's own generation). So each id list is decoded
(``skip_special_tokens=False, clean_up_tokenization_spaces=False``) and the peer first asserts
that ``tokenizer(text=...)`` (what TRL calls, special tokens included; the demo tokenizer adds
no BOS) gives back exactly the given ids; the generate wrapper then asserts that the rows it
receives are exactly the given ids, each repeated G times consecutively, in order
(``shuffle_dataset=False``).

Exactly N new tokens: ``generation_kwargs={"min_new_tokens": N}`` in `GRPOConfig` (TRL merges it
into its sampling `GenerationConfig`: ``generation_kwargs.update(args.generation_kwargs)``) with
``max_completion_length=N`` (``"max_new_tokens": self.max_completion_length``). The EOS ids TRL
uses to trim completions (``self.eos_token_ids``: the model's generation-config EOS ids plus the
tokenizer's) are the ones the sampling config carries, so `min_new_tokens` masks exactly those
until N tokens. Sampling: ``do_sample=True``, ``temperature``, ``top_p=1.0``, ``top_k=0``,
``min_p=None``, ``repetition_penalty=1.0``, KV cache (``gradient_checkpointing=False``). The
generate wrapper asserts ``(B*G, N)`` new tokens and no EOS among them; the loss wrapper asserts
B*G*N loss positions.

The reward: TRL calls a plain callable as ``reward_func(prompts=prompts, completions=completions,
completion_ids=completion_ids_list, **reward_kwargs)`` and wants one float per completion;
``completion_ids_list`` are the generated ids (after EOS trimming, here all N), so the wrapper
uses them directly (no re-tokenization) and asserts their length.

Other settings (all through `GRPOConfig`): fp32 (``bf16=False``: TRL's configs default to bf16),
``gradient_checkpointing=False`` (TRL defaults it to True), ``router_aux_loss_coef=0.0`` (else
the MoE load-balancing loss is added: ``self.aux_loss_enabled = hasattr(text_config,
"output_router_logits") and self.router_aux_loss_coef != 0.0``), ``disable_dropout=True``,
``lr_scheduler_type="constant"``, default optimizer (``adamw_torch_fused``), ``weight_decay=0``,
``max_grad_norm=1.0``, ``log_completions=False``, no eval, no saving, no logging,
``report_to=[]``, ``use_cpu=True``.

Needs the `bench` extra (trl==1.16.0); run through `python -m bench rl`.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

TRL_VERSION = "1.16.0"
EPSILON_LOW, EPSILON_HIGH = 3e-4, 4e-4  # GSPO paper's clip range


def grpo_step_times(
    policy_dir: str,
    prompts: list[list[int]],
    *,
    group_size: int,
    max_new_tokens: int,
    steps: int,
    reward_fn: Callable[[list[int]], float],
    learning_rate: float = 1e-5,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict:
    """Times `steps` GSPO training steps of TRL's GRPOTrainer on one batch of prompts.

    Args:
      policy_dir: a Hugging Face model directory (config, safetensors, tokenizer files).
      prompts: tokenized prompts; all of them (B) form the batch of every step.
      group_size: completions sampled per prompt (G); B * G completions per step.
      max_new_tokens: tokens sampled per completion (exactly, see the module docstring).
      steps: training steps to run; the first is a warm-up, excluded from the medians.
      reward_fn: the reward of one completion, from its token ids.
      learning_rate: AdamW learning rate (constant schedule).
      temperature: sampling temperature (TRL also divides the loss's logits by it).
      seed: the trainer's seed (sampling).

    Returns:
      {"step_s", "sampling_s", "learning_s"} medians over the timed steps, "steps_timed",
      "trl_version", "notes", plus "per_step" (every step's figures, loss, mean reward and
      pre-clip grad norm, warm-up first), "torch_threads" and "implementations".
    """
    import datasets
    import torch
    import transformers
    import trl
    from trl import GRPOConfig, GRPOTrainer

    if steps < 2:
        raise ValueError(f"steps must be >= 2 (the first is a warm-up), got {steps}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and no empty prompt")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 (GRPO's group baseline), got {group_size}")
    if trl.__version__ != TRL_VERSION:
        raise RuntimeError(
            f"this peer was written against trl=={TRL_VERSION} (its GRPO batch sizing, old "
            f"log-prob shortcut and GSPO loss), found trl=={trl.__version__}"
        )
    threads = torch.get_num_threads()
    print(f"[grpo peer] torch {torch.__version__}, intra-op threads {threads} (default, untouched)")

    batch, group, n_new = len(prompts), group_size, max_new_tokens
    rows_per_step = batch * group
    prompts = [[int(t) for t in p] for p in prompts]
    tokenizer = transformers.AutoTokenizer.from_pretrained(policy_dir, local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer in {policy_dir!r} has no pad token")

    # TRL tokenizes text prompts itself; feed text that its call gives back as the exact ids.
    texts = [
        tokenizer.decode(p, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for p in prompts
    ]
    for i, (text, ids) in enumerate(zip(texts, prompts)):
        again = tokenizer(text=[text])["input_ids"][0]
        if list(again) != ids:
            raise AssertionError(
                f"prompt {i}: the tokenizer does not reproduce the given ids from their text "
                f"({len(again)} vs {len(ids)} tokens); TRL 1.16.0 only takes text prompts"
            )

    policy = transformers.AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    impl = {
        "attention": policy.config._attn_implementation,
        "experts": getattr(policy.config, "_experts_implementation", None),
    }
    dataset = datasets.Dataset.from_list([{"prompt": t} for t in texts])
    wanted_rows = [tuple(p) for p in prompts for _ in range(group)]

    timing: dict[str, Any] = {
        "gen": [], "step": [], "loss": [], "reward": [], "grad_norm": [], "forwards": [],
        "generates": [], "adv_mean": [],
    }  # fmt: skip

    class _StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timing["t0"] = time.perf_counter()
            timing["gen_step"] = 0.0
            timing["forwards_step"] = 0
            timing["generates_step"] = 0

        def on_step_end(self, args, state, control, **kwargs):
            timing["step"].append(time.perf_counter() - timing["t0"])
            timing["gen"].append(timing["gen_step"])
            timing["forwards"].append(timing["forwards_step"])
            timing["generates"].append(timing["generates_step"])

    def reward_from_ids(prompts, completions, completion_ids, **kwargs):
        if len(completion_ids) != rows_per_step:
            raise AssertionError(
                f"{len(completion_ids)} completions scored, wanted {rows_per_step}"
            )
        if any(len(c) != n_new for c in completion_ids):
            raise AssertionError("a completion handed to the reward is not exactly N tokens")
        rewards = [float(reward_fn([int(t) for t in c])) for c in completion_ids]
        timing["reward"].append(statistics.fmean(rewards))
        return rewards

    with tempfile.TemporaryDirectory(prefix="grpo_peer_") as out:
        config = GRPOConfig(
            output_dir=out,
            # one generation batch of B prompts x G = one micro-batch = one optimizer step
            per_device_train_batch_size=rows_per_step,
            num_generations=group,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            num_iterations=1,
            shuffle_dataset=False,
            # sampling: exactly N tokens, plain temperature sampling
            max_completion_length=n_new,
            generation_kwargs={"min_new_tokens": n_new},
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            min_p=None,
            repetition_penalty=1.0,
            use_vllm=False,
            use_transformers_continuous_batching=False,
            # GSPO
            importance_sampling_level="sequence",
            loss_type="grpo",
            epsilon=EPSILON_LOW,
            epsilon_high=EPSILON_HIGH,
            delta=None,
            beta=0.0,
            scale_rewards="group",
            mask_truncated_completions=False,
            top_entropy_quantile=1.0,
            entropy_coef=0.0,
            off_policy_mask_threshold=None,
            router_aux_loss_coef=0.0,
            disable_dropout=True,
            # optimizer
            max_steps=steps,
            learning_rate=learning_rate,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            seed=seed,
            data_seed=seed,
            # fp32 CPU, nothing written or reported
            bf16=False,
            fp16=False,
            use_cpu=True,
            gradient_checkpointing=False,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            log_completions=False,
            report_to=[],
            disable_tqdm=True,
            push_to_hub=False,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
        )
        if (config.generation_batch_size, config.steps_per_generation) != (rows_per_step, 1):
            raise AssertionError(
                f"generation_batch_size {config.generation_batch_size}, steps_per_generation "
                f"{config.steps_per_generation}; wanted {rows_per_step}, 1"
            )
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=reward_from_ids,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[_StepTimer()],
        )
        if trainer.ref_model is not None or trainer.aux_loss_enabled:
            raise AssertionError("a reference model or the MoE aux loss is on")
        gen_config = trainer.generation_config
        if gen_config.min_new_tokens != n_new or gen_config.max_new_tokens != n_new:
            raise AssertionError(
                f"sampling config min/max new tokens {gen_config.min_new_tokens}/"
                f"{gen_config.max_new_tokens}, wanted {n_new}"
            )
        eos_ids = list(trainer.eos_token_ids)
        sampling_eos = gen_config.eos_token_id
        sampling_eos = [sampling_eos] if isinstance(sampling_eos, int) else list(sampling_eos or [])
        if sorted(sampling_eos) != sorted(eos_ids):
            raise AssertionError(f"min_new_tokens masks {sampling_eos}, TRL trims at {eos_ids}")

        model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
        if model is not policy:
            raise RuntimeError("the trainer wrapped the policy; the generate timer would miss it")
        original_generate = model.generate

        def timed_generate(*args, **kwargs):
            ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
            got = [tuple(r[m.bool()].tolist()) for r, m in zip(ids, mask)]
            if got != wanted_rows:
                raise AssertionError(
                    "the trainer's prompt rows differ from the given prompts, each x G in order"
                )
            start = time.perf_counter()
            out_ = original_generate(*args, **kwargs)
            timing["gen_step"] += time.perf_counter() - start
            timing["generates_step"] += 1
            seqs = out_ if isinstance(out_, torch.Tensor) else out_.sequences
            new = seqs[:, ids.shape[1] :]
            if new.shape != (rows_per_step, n_new):
                raise AssertionError(
                    f"generated {tuple(new.shape)}, wanted {(rows_per_step, n_new)}"
                )
            if eos_ids and bool(torch.isin(new, torch.tensor(eos_ids)).any()):
                raise AssertionError("EOS sampled despite min_new_tokens")
            return out_

        model.generate = timed_generate

        original_logps = trainer._get_per_token_logps_and_entropies

        def counted_logps(*args, **kwargs):
            if not torch.is_grad_enabled():
                raise AssertionError("a no-grad policy/reference forward (old or ref log-probs)")
            timing["forwards_step"] += 1
            return original_logps(*args, **kwargs)

        trainer._get_per_token_logps_and_entropies = counted_logps

        original_compute_loss = trainer.compute_loss

        def recorded_compute_loss(model_, inputs, *args, **kwargs):
            for key in ("old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio"):
                if key in inputs:
                    raise AssertionError(f"{key} in the loss inputs (an extra forward was run)")
            c_ids, c_mask = inputs["completion_ids"], inputs["completion_mask"]
            if (
                tuple(c_ids.shape) != (rows_per_step, n_new)
                or int(c_mask.sum()) != rows_per_step * n_new
            ):
                raise AssertionError(
                    f"loss on completions {tuple(c_ids.shape)} with {int(c_mask.sum())} positions, "
                    f"wanted {(rows_per_step, n_new)} with {rows_per_step * n_new}"
                )
            loss = original_compute_loss(model_, inputs, *args, **kwargs)
            value = float((loss[0] if isinstance(loss, tuple) else loss).detach())
            adv_mean = float(inputs["advantages"].float().mean())
            # ratio exactly 1 at num_iterations=1, so the loss value is -mean(advantages)
            if not math.isclose(value, -adv_mean, rel_tol=1e-4, abs_tol=1e-5):
                raise AssertionError(f"loss {value} != -mean(advantages) {-adv_mean} at ratio 1")
            timing["loss"].append(value)
            timing["adv_mean"].append(adv_mean)
            return loss

        trainer.compute_loss = recorded_compute_loss

        original_clip = trainer._clip_grad_norm

        def recorded_clip(model_):
            norm = original_clip(model_)
            timing["grad_norm"].append(float(norm))
            return norm

        trainer._clip_grad_norm = recorded_clip

        load_before = os.getloadavg()[0]
        trainer.train()
        load_after = os.getloadavg()[0]

        optim = str(getattr(trainer.args.optim, "value", trainer.args.optim))
        max_grad_norm = trainer.args.max_grad_norm
        del trainer

    if len(timing["step"]) != steps:
        raise RuntimeError(f"timed {len(timing['step'])} steps, expected {steps}")
    if any(n != 1 for n in timing["generates"]) or any(n != 1 for n in timing["forwards"]):
        raise AssertionError(
            f"generate calls per step {timing['generates']}, log-prob forwards per step "
            f"{timing['forwards']}; wanted 1 and 1"
        )
    for key in ("loss", "reward", "grad_norm"):
        if len(timing[key]) != steps or not all(math.isfinite(v) for v in timing[key]):
            raise AssertionError(f"per-step {key} {timing[key]}: not one finite value per step")
    per_step = [
        {"step_s": s, "sampling_s": g, "learning_s": s - g, "loss": loss, "reward_mean": r,
         "grad_norm": gn}
        for s, g, loss, r, gn in zip(timing["step"], timing["gen"], timing["loss"],
                                     timing["reward"], timing["grad_norm"])
    ]  # fmt: skip
    timed = per_step[1:]
    med = {
        k: statistics.median(r[k] for r in timed) for k in ("step_s", "sampling_s", "learning_s")
    }
    notes = (
        f"trl {trl.__version__} GRPOTrainer as GSPO: B={batch} prompts x G={group} = "
        f"{rows_per_step} completions in one generate call and one optimizer step "
        "(per_device_train_batch_size=B*G, steps_per_generation=1, gradient_accumulation_steps=1, "
        "num_iterations=1); importance_sampling_level='sequence' (ratio = exp(token-mean "
        "log-ratio)), loss_type='grpo' (mean over sequences), clip eps "
        f"{EPSILON_LOW}/{EPSILON_HIGH}, beta=0 (no reference model, no KL), "
        "scale_rewards='group' ((r - mean_g) / (Bessel std_g + 1e-4)); old log-probs = the "
        "detached current ones (no extra forward; ratio value 1, loss value = -mean(adv) ~ 0); "
        f"sampling at temperature {temperature}, top_k=0, top_p=1, "
        f"min_new_tokens=max_completion_length={n_new} (EOS ids {eos_ids} masked until then); "
        "prompts fed as text that re-tokenizes to the given ids (checked); KV-cached generate; "
        "one policy forward with grad over prompt + completion (the CPU fused LM head scores "
        "prompt positions too, then masks them); "
        f"{optim}, clip {max_grad_norm}, weight decay 0, constant lr {learning_rate}; fp32 CPU, "
        f"torch threads {threads}, attention={impl['attention']}, experts={impl['experts']}; "
        "MoE aux loss off (router_aux_loss_coef=0); step = TrainerCallback step begin->end "
        "(excludes data loading), sampling = policy.generate wall time, learning = the rest "
        "(decode to text, reward, advantages, forward+backward, clip, AdamW); medians taken per "
        f"column; 1-min load average {load_before:.2f} before / {load_after:.2f} after "
        f"training on {os.cpu_count()} cores."
    )
    return {
        **med,
        "steps_timed": len(timed),
        "trl_version": trl.__version__,
        "notes": notes,
        "per_step": per_step,
        "torch_threads": threads,
        "implementations": impl,
    }
