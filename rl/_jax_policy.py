"""`JaxPolicy`: the Harness `PolicyModel` on a local JAX policy (RL rollouts, OPD, evaluation).

    policy = JaxPolicy(model, tokenizer)                  # a models.Qwen and its tokenizer
    traj = hx.run_agent(state, request, policy, tools, sampling=hx.SamplingParams(...))
    episode = LiveRoom().run(policy, seed=0)

One call renders the conversation with `hat_jax.chat_format.render` (tool schemas, generation
prompt, thinking mode from `SamplingParams.enable_thinking`), tokenizes it, samples with
`models.Sampler` (temperature, top-p and `max_tokens` from the harness settings, a fixed top-k
from the policy, stopping at `<|im_end|>`), and parses the completion with
`chat_format.parse` into reasoning, content and tool calls. The turn carries the sampled
`token_ids` (the stop token included) and, as `logprobs`, their log-probabilities under the
unmodified policy (temperature 1, no filter): what the trainer's forward pass recomputes, the
old log-probs of GRPO/GSPO. `last_output` keeps the whole `models.SampleOutput` of the latest
call (prompt ids, sampling-distribution log-probs, whether the row stopped).

`generate_batch` samples several conversations in one compiled call (group rollouts).
Sampling is deterministic in `SamplingParams.seed` and the prompt (its token count is folded
into the key, so successive rounds of one episode draw differently).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax

import models
from hat_jax import chat_format
from hat_jax import harness as hx

IM_END = "<|im_end|>"


def _stop_ids(tokenizer) -> list[int]:
    """`<|im_end|>` and the tokenizer's end-of-sequence token (when it has another one)."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    if im_end is None or im_end == tokenizer.unk_token_id:
        raise ValueError(f"JaxPolicy: the tokenizer has no single {IM_END} token")
    stops = {int(im_end)}
    if tokenizer.eos_token_id is not None:
        stops.add(int(tokenizer.eos_token_id))
    return sorted(stops)


class JaxPolicy:
    """A `hat_jax.harness.PolicyModel` sampling from a `models.Qwen` (see the module docstring).

    Args:
        model: the policy (weights can be swapped later with `update`).
        tokenizer: a transformers tokenizer with the Qwen chat-format tokens (e.g.
            `data.tokenizer.load_tokenizer()`); its vocabulary must fit the model's.
        top_k: top-k filter applied on top of the harness settings (0: none).
        sampler: a prebuilt `models.Sampler` for `model` (e.g. speculative, with an MTP head);
            default `Sampler(model, pad_id=tokenizer's pad id)`.
        seed: the seed used when `SamplingParams.seed` is None.
        preserve_thinking: render earlier turns' reasoning too (Qwen3.6 option).
        share_prefix: in `generate_batch`, the leading tokens all conversations share (the
            system prompt, tool schemas ...) are prefilled once, rounded down to a multiple of
            this many tokens (0: every conversation prefilled whole).
    """

    inline = True  # pure in-process computation: the agent loop calls it on its own thread

    def __init__(
        self,
        model: models.Qwen,
        tokenizer,
        *,
        top_k: int = 0,
        sampler: models.Sampler | None = None,
        seed: int = 0,
        preserve_thinking: bool = False,
        share_prefix: int = 512,
    ):
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(
                f"JaxPolicy: tokenizer has {len(tokenizer)} tokens > the model's vocab_size "
                f"{model.config.vocab_size}"
            )
        if top_k < 0:
            raise ValueError(f"JaxPolicy: top_k={top_k} must be >= 0")
        self.model = model  # the weights it samples from (`update` replaces them)
        self.tokenizer, self.top_k, self.seed = tokenizer, top_k, seed
        self.preserve_thinking = preserve_thinking
        if share_prefix < 0:
            raise ValueError(f"JaxPolicy: share_prefix={share_prefix} must be >= 0")
        self.share_prefix = share_prefix
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.sampler = sampler or models.Sampler(model, pad_id=pad)
        self.stop_tokens = _stop_ids(tokenizer)
        self.last_output: models.SampleOutput | None = None

    def update(self, model: models.Qwen, mtp: models.MTPHead | None = None) -> None:
        """Samples from new weights of the same structure (no recompilation); `mtp`, new
        weights of a speculative sampler's draft head."""
        self.sampler.update(model, mtp)
        self.model = model

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        enable_thinking: bool = True,
    ) -> list[int]:
        """The token ids the policy continues: the rendered conversation + generation prompt."""
        text = chat_format.render(
            messages,
            list(tools) or None,
            add_generation_prompt=True,
            enable_thinking=enable_thinking,
            preserve_thinking=self.preserve_thinking,
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _settings(self, sampling: hx.SamplingParams) -> models.Sampling:
        return models.Sampling(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=self.top_k
        )

    def _budget(self, prompt: list[int], max_tokens: int) -> int:
        if max_tokens < 1:
            raise hx.PolicyError(f"JaxPolicy: max_tokens={max_tokens} must be >= 1")
        room = self.sampler.max_length - len(prompt)
        if room < 1:
            raise hx.PolicyError(
                f"JaxPolicy: the prompt has {len(prompt)} tokens, the sampler's max_length is "
                f"{self.sampler.max_length}: no room to generate"
            )
        return min(max_tokens, room)

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        sampling: hx.SamplingParams | None = None,
    ) -> hx.AssistantTurn:
        """One assistant turn for the conversation (the `PolicyModel` interface)."""
        return self.generate_batch([(messages, tools)], sampling)[0]

    def generate_batch(
        self,
        conversations: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]],
        sampling: hx.SamplingParams | None = None,
    ) -> list[hx.AssistantTurn]:
        """One turn per `(messages, tools)`, all sampled in one compiled call."""
        sampling = sampling or hx.SamplingParams()
        prompts = [
            self.prompt_ids(m, t, enable_thinking=sampling.enable_thinking)
            for m, t in conversations
        ]
        budgets = [self._budget(p, sampling.max_tokens) for p in prompts]
        seed = self.seed if sampling.seed is None else sampling.seed
        key = jax.random.fold_in(jax.random.key(seed), len(prompts[0]))
        shared = 0
        if self.share_prefix:
            shared = models.shared_prefix_length(prompts, multiple=self.share_prefix)
        out = self.sampler(
            prompts,
            max_new_tokens=budgets,
            sampling=self._settings(sampling),
            stop_tokens=self.stop_tokens,
            seed=key,
            shared_prefix=shared,
        )
        self.last_output = out
        return [
            self._turn(out, i, messages, tools, sampling.enable_thinking)
            for i, (messages, tools) in enumerate(conversations)
        ]

    def _turn(self, out, i: int, messages, tools, enable_thinking: bool) -> hx.AssistantTurn:
        ids = out.completion(i)
        return self.turn(ids, out.policy_logprobs[i, : len(ids)], messages, tools,
                         enable_thinking=enable_thinking)  # fmt: skip

    def turn(
        self,
        ids: Sequence[int],
        logprobs: Sequence[float],
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        enable_thinking: bool = True,
    ) -> hx.AssistantTurn:
        """The assistant turn of sampled `ids` (the stop token included) and their log-probs
        under the unmodified policy, continuing `messages` (whichever decoder sampled them)."""
        ids = [int(t) for t in ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        parsed = chat_format.parse(text, list(tools) or None, enable_thinking=enable_thinking)
        turn_index = sum(1 for m in messages if m.get("role") == "assistant")
        calls = [
            hx.ToolCall(id=f"call_{turn_index}_{j}", name=c.name, arguments=dict(c.arguments))
            for j, c in enumerate(parsed.tool_calls)
        ]
        return hx.AssistantTurn(
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(calls),
            raw_text=text,
            token_ids=tuple(ids),
            logprobs=tuple(float(x) for x in logprobs),
            parse_errors=tuple(parsed.errors),
        )
