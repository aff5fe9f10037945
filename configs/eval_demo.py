"""Evaluation of the demo's policies on the paper's sets (small sizes for two CPU cores).

  python -m launch.eval --config=configs/eval_demo.py            # runs/demo/sft/checkpoints
  python -m launch.eval --config=configs/eval_demo.py:hf         # the demo's HF export
  python -m launch.eval --config=configs/eval_demo.py:teacher    # the scripted teacher (ceiling)
  python -m launch.eval --config=configs/eval_demo.py:rules      # the offline rule policy
  python -m launch.eval --config=configs/eval_demo.py:openai     # an OpenAI-compatible endpoint
  python -m launch.eval --config=configs/eval_demo.py:teacher --config.room=micro \
      --config.sets_dir=runs/eval/sets-micro --config.run_dir=runs/eval/teacher-micro

Every variant evaluates the same set versions (`sets_dir`, `seed`, `sizes`), so their runs
compare item by item (`baseline`: another run's directory, for paired bootstrap intervals in
the report). Decoding is greedy; the loop's wall-clock budget is set out of the way (the tiny
model on a CPU is not the latency under test: that is the replay benchmark's job).
"""

import ml_collections

ARGS = ("sft", "hf", "teacher", "rules", "openai")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = arg or "sft"
    if variant not in ARGS:
        raise ValueError(f"eval_demo: unknown variant {variant!r}; choose one of {ARGS}")
    c = ml_collections.ConfigDict()
    c.stage = "eval"
    c.run_dir = f"runs/eval/{variant}"
    # The live room (`hat_jax.livestream.ROOMS`): its released Harness and its scenarios. A
    # sets_dir holds one room's sets (e.g. runs/eval/sets-micro for room="micro").
    c.room = "v0"
    c.sets_dir = "runs/eval/sets"
    c.sets = "t1,t2,t3_tool,t3_prompt,general"
    c.split = "test"  # "dev" builds the sets Harness evolution tunes on
    c.seed = 0
    # Items per set (0: the set's default size).
    c.sizes = ml_collections.ConfigDict(dict(t1=26, t2=26, t3_tool=26, t3_prompt=26, general=40))
    # Pin set versions (e.g. t1="t1-0123456789ab") to refuse anything else.
    c.versions = ml_collections.ConfigDict(dict(t1="", t2="", t3_tool="", t3_prompt="", general=""))
    kind = {"sft": "jax", "hf": "jax"}.get(variant, variant)
    checkpoint = {"sft": "runs/demo/sft/checkpoints", "hf": "runs/demo/export/hf"}.get(variant, "")
    c.policy = ml_collections.ConfigDict(
        dict(
            kind=kind,
            checkpoint=checkpoint,
            tokenizer_dir="",  # "": the HF directory's own, else the demo tokenizer
            dtype="float32",
            max_length=8192,  # the sampler's cap on prompt + generated tokens per call
            # a JAX policy's decoding: "lockstep" (a round's calls in one batch) or "slots"
            # (continuous batching over batch_size slots; greedy, the same tokens)
            engine="lockstep",
            base_url="http://localhost:30000/v1",
            model="default",
            api_key_env="OPENAI_API_KEY",
            server_extensions=False,
        )
    )
    # Thinking on: the demo's policies were trained on the teacher's reasoning (an empty think
    # block is a prompt they never saw); 192 tokens hold a reasoning line and the reply's call.
    c.sampling = ml_collections.ConfigDict(
        dict(temperature=0.0, top_p=1.0, max_tokens=192, enable_thinking=True)
    )
    c.batch_size = 16  # items decoded together by a local JAX policy
    c.concurrency = 4  # items in flight against an endpoint
    c.keep_trajectories = True
    c.limits = ml_collections.ConfigDict(
        dict(max_rounds=4, budget_s=1e6, tool_timeout_s=5.0, max_calls_per_round=8)
    )
    c.baseline = ""  # another run's directory: paired comparisons in the report
    # An edit file (prompt and Skill revisions, `hat_jax.harness.load_edit`) applied to the
    # released Harness for this run: the same items under the edited Harness.
    c.harness_edit = ""
    # The Final Evaluation Judge of T1/T2 (rule scorers when `endpoints` is empty): an odd
    # number of "base_url|model" entries, apart from the RL reward judge.
    c.judge = ml_collections.ConfigDict(
        dict(endpoints="", api_key_env="", prompts="", cache_dir="", on_failure="fail")
    )
    # Human labels (item_id, dimension, label) of one set's items: calibration.md in the run.
    c.calibration = ml_collections.ConfigDict(dict(labels="", set="t1"))
    return c
