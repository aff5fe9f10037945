"""Per-device memory plan of a stage config's train step on a simulated cluster.

  python -m launch.plan --config=configs/sft_qwen3_6_35b_a3b.py
  python -m launch.plan --config=configs/sft_qwen3_6_35b_a3b.py --setups=8x96,16x80 \
      --layouts=fsdp,fsdp_bf16,expert8 --out=runs/plan.md
  python -m launch.plan --config=configs/opd_qwen3_6_35b_a3b.py     # + teacher + sampling
  python -m launch.plan --config=configs/rl_qwen3_6_35b_a3b.py      # + reference + rollouts

An SFT config plans the policy's train step. An OPD config plans the student's train step
with the frozen teacher on the same mesh (its weights in its own dtype, no gradients or
optimiser state), and the sampling phase between steps: the whole train state resident plus
the sampler's caches and temporaries for a step's prompts; the peak is the larger of the two.
The sampler splits its rows and caches over the mesh's data-like axes (`models.Sampler` on
sharded weights); the table gives the caches' bytes per device and the sampling phase's
headroom on the device (`--config.sampling.sample_chunk=0` / `--config.rollout.sample_chunk=0`
plans a step's whole batch in one call).
An RL config plans the policy's step (and the frozen reference when `kl_coef` > 0) and one
lockstep round of its rollouts: every episode of a rollout decoding at once, contexts of up to
`seq_len` tokens.

For each setup (`<devices>x<GiB per device>`) and layout, the train step is compiled for
that many simulated CPU devices with abstract arrays (nothing is allocated) and XLA's memory
analysis is read: per-device train state, temporaries and peak, and whether it fits with 10%
of the device kept free. Each device takes one `seq_len` row per micro-batch; the config's
batch is reached by gradient accumulation. The model's runtime fields come from the config
(production: expert-parallel MoE dispatch, flash attention, full remat, chunked loss); the
MoE dispatch is compiled as "sorted" (XLA's CPU lowering of `ragged_dot` materialises dense
per-expert buffers, which a GPU does not).

The figures are an upper bound for a GPU: XLA:CPU upcasts bfloat16 matmuls to float32 (the
activations, weights and gradients of the layer being computed appear at twice their size).
Left alone, XLA:CPU also hoists those float32 copies of whole stacked parameters out of the
layer and micro-batch loops (loop-invariant code motion), holding a float32 copy of every
bfloat16 weight for the whole step, which a GPU compile (bf16 matmuls, no copies) never
does; the plan therefore compiles with that pass off (`--cpu_hoisting` turns it back on to
see the raw CPU figure). The train state and its gradients are exact.
Layouts: fsdp (every device shards everything), expertN (experts over N devices, the rest
FSDP), fsdp_bf16 / expertN_bf16 (parameters and AdamW moments in bfloat16).

After the table, how to launch each setup on a cluster of `--devices_per_host` devices per
host: the process count, whether the config's data shards and batch allow it, and the
command every host runs (`docs/cluster.md` has the SLURM and Kubernetes JobSet files).
"""

import dataclasses
import os

from absl import app, flags
from ml_collections import config_flags

from launch import _logs

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sft_qwen3_6_35b_a3b.py")
_SETUPS = flags.DEFINE_list("setups", ["8x96", "16x80"], "<devices>x<GiB per device> each.")
_LAYOUTS = flags.DEFINE_list("layouts", ["fsdp", "fsdp_bf16"], "Mesh layouts to compile.")
_DISPATCH = flags.DEFINE_string("moe_dispatch", "sorted", "MoE dispatch to compile on CPU.")
_OUT = flags.DEFINE_string("out", None, "Also write the table (markdown) here.")
_PER_HOST = flags.DEFINE_integer("devices_per_host", 8, "Accelerators per host (one process each).")
_CPU_HOISTING = flags.DEFINE_bool(
    "cpu_hoisting",
    False,
    "Let XLA:CPU hoist its float32 copies of bfloat16 parameters out of the layer loops "
    "(a CPU-only artefact; off by default).",
)


def _layout(name: str, devices: int):
    from hat_jax.sharding import MeshConfig

    base, _, dtype = name.partition("_")
    if base == "fsdp":
        mesh = MeshConfig(fsdp=devices)
    elif base.startswith("expert") and base[6:].isdigit() and devices % int(base[6:]) == 0:
        mesh = MeshConfig(fsdp=devices // int(base[6:]), expert=int(base[6:]))
    else:
        raise ValueError(f"unknown layout {name!r} for {devices} devices (fsdp, expertN, *_bf16)")
    if dtype not in ("", "bf16"):
        raise ValueError(f"layout {name!r}: the only dtype suffix is _bf16")
    return mesh, "bfloat16" if dtype else None


def _plan(c, devices: int, layout: str):
    import tempfile

    import jax
    from flax import nnx

    import models
    from data.tokenizer import load_tokenizer
    from hat_jax import train
    from hat_jax.sharding import make_mesh
    from launch import _common

    mesh_config, param_dtype = _layout(layout, devices)
    mesh = make_mesh(mesh_config, devices=jax.devices()[:devices])
    block = c.model.copy_and_resolve_references()
    block.update(dict(moe_dispatch=_DISPATCH.value, param_dtype=param_dtype or block.param_dtype))
    source = c.init if c.stage == "sft" else c.policy
    tokenizer = load_tokenizer(c.data.get("tokenizer_dir") or None)
    model = _common.model_config(block, (source.kind, source.path), tokenizer)
    micro = max(c.trainer.batch_size // devices, 1)
    trainer = train.TrainerConfig.from_dict(
        dict(c.trainer.to_dict(), batch_size=devices * micro, micro_batches=micro)
    )
    optimizer = train.OptimizerConfig.from_dict(c.optimizer.to_dict())
    scratch = tempfile.mkdtemp(prefix="plan-")
    if c.stage == "sft":
        config = train.SFTConfig(trainer=trainer, optimizer=optimizer, mesh=mesh_config,
                                 aux_loss_coef=max(c.aux_loss_coef, 0.0),
                                 logits_chunk=c.get("logits_chunk", 0))  # fmt: skip
        driver = train.sft_driver(config, model_fn=lambda: models.Qwen(model, rngs=nnx.Rngs(0)),
                                  run_dir=scratch, mesh=mesh)  # fmt: skip
        return train.plan_stage_step(driver), model
    import rl

    if c.stage == "rl":
        from launch import rl as rl_launch

        config = dataclasses.replace(rl_launch.build(c).rl, trainer=trainer,
                                     optimizer=optimizer, mesh=mesh_config)  # fmt: skip
        driver = rl.rl_driver(config, model_config=model, run_dir=scratch, mesh=mesh)
        r = config.rollout
        overrides = {"moe_dispatch": r.decode_moe_dispatch} if r.decode_moe_dispatch else None
        # One lockstep round: every episode of a rollout decodes its next call together. The
        # "slots" engine holds caches of the same shape (a row of seq_len positions per
        # episode) and prefills one call at a time, so this bounds it too.
        sampler = lambda module: models.Sampler(  # noqa: E731
            getattr(module, "policy", module),
            decode_overrides=overrides,
            max_length=config.trainer.seq_len,
        ).lower(r.sample_chunk or r.scenarios * r.group_size,
                config.trainer.seq_len - r.max_tokens, r.max_tokens)  # fmt: skip
        return train.plan_stage_step(driver, sampler=sampler), model
    if c.stage != "opd":
        raise ValueError(f"config.stage={c.stage!r}: plans cover 'sft', 'opd' and 'rl' configs")
    from launch import opd

    teacher_block = opd._teacher_block(c)
    teacher_block.moe_dispatch = _DISPATCH.value
    teacher = _common.model_config(teacher_block, (c.teacher.kind, c.teacher.path), tokenizer)
    built = opd.build(c)
    config = dataclasses.replace(built.opd, trainer=trainer, optimizer=optimizer, mesh=mesh_config)
    driver = rl.opd_driver(config, student_config=model, teacher_config=teacher,
                           run_dir=scratch, mesh=mesh)  # fmt: skip
    sampler = lambda module: models.Sampler(  # noqa: E731
        module.policy, decode_overrides=config.decode_overrides()
    ).lower(config.sample_chunk or c.trainer.batch_size, config.max_prompt_len,
            config.max_new_tokens)  # fmt: skip
    return train.plan_stage_step(driver, sampler=sampler), model


def launch_lines(c, config_file: str, setups, devices_per_host: int) -> list[str]:
    """How to launch config `c` (read from `config_file`) on each setup's hosts."""
    from data import resolve_shards

    if devices_per_host < 1:
        raise ValueError(f"--devices_per_host must be positive, got {devices_per_host}")
    lines = [f"launching (one process per host of {devices_per_host} devices; docs/cluster.md):"]
    shards = c.data.get("data_shards")  # None: the stage is not fed by the Grain pipelines
    for devices, _ in setups:
        devices = int(devices)
        if devices % devices_per_host:
            lines.append(f"  {devices} devices: not a whole number of hosts of {devices_per_host}")
            continue
        hosts = devices // devices_per_host
        try:
            if shards is None:
                data = f"batch {c.trainer.batch_size}"
                if c.trainer.batch_size % hosts:
                    raise ValueError(
                        f"batch_size {c.trainer.batch_size} does not divide by {hosts}"
                    )
            else:
                n = resolve_shards(shards, c.trainer.batch_size, hosts)
                data = f"{n} data shards, {c.trainer.batch_size // n} rows each per step"
        except ValueError as err:
            data = f"refused: {err}"
        lines.append(
            f"  {devices} devices = {hosts} host(s): {data}\n"
            f"    SLURM: srun --nodes={hosts} --ntasks-per-node=1 python -m launch.{c.stage} "
            f"--config={config_file}\n"
            f"    elsewhere, on host i: JAX_COORDINATOR_ADDRESS=<host 0>:<port> "
            f"JAX_NUM_PROCESSES={hosts} JAX_PROCESS_ID=<i> python -m launch.{c.stage} "
            f"--config={config_file}"
        )
    return lines


def main(argv):
    del argv
    _logs.quiet()
    setups = [tuple(float(x) for x in s.split("x")) for s in _SETUPS.value]
    most = max(int(d) for d, _ in setups)
    flags_ = [f"--xla_force_host_platform_device_count={most}"]
    if not _CPU_HOISTING.value:
        flags_.append("--xla_disable_hlo_passes=while-loop-invariant-code-motion")
    os.environ["XLA_FLAGS"] = " ".join([*flags_, os.environ.get("XLA_FLAGS", "")])
    os.environ["JAX_PLATFORMS"] = "cpu"
    from hat_jax.train import GIB

    c = _CONFIG.value
    rows = [
        "| devices x HBM | layout (data, fsdp, expert, tensor) | params | tokens/device/micro | "
        "micro | state GiB | arguments GiB | outputs GiB (aliased) | temporaries GiB | "
        "peak GiB | fits | largest buffer | compile s | sampling peak GiB | "
        "sampling cache GiB | sampling headroom |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for devices, hbm in setups:
        for layout in _LAYOUTS.value:
            plan, model = _plan(c, int(devices), layout)
            mesh = ", ".join(str(v) for v in plan.mesh.values())
            big = (
                f"{plan.largest[0][0]} ({plan.largest[0][1] / GIB:.1f} GiB)" if plan.largest else ""
            )
            rows.append(
                f"| {int(devices)} x {hbm:g} GB | {layout} ({mesh}) | {plan.params / 1e9:.2f}B "
                f"{model.param_dtype} | {plan.seq_len} | {plan.micro_batches} | "
                f"{plan.state_bytes / GIB:.1f} | {plan.arguments / GIB:.1f} | "
                f"{plan.outputs / GIB:.1f} ({plan.aliased / GIB:.1f}) | "
                f"{plan.temporaries / GIB:.1f} | {plan.peak / GIB:.1f} | "
                f"{'yes' if plan.fits(hbm * 1e9) else 'no'} | {big} | {plan.compile_seconds:.0f} | "
                f"{plan.sampling_peak / GIB:.1f} | {plan.sampling_cache / GIB:.2f} | "
                f"{1 - plan.sampling_peak / (hbm * 1e9):.0%} |"
            )
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    print(f"\nmemory plan for {c.model.preset}, seq_len {c.trainer.seq_len}:\n{table}")
    config_file = config_flags.get_config_filename(flags.FLAGS["config"])
    print("\n" + "\n".join(launch_lines(c, config_file, setups, _PER_HOST.value)))
    if _OUT.value:
        tmp = _OUT.value + ".tmp"
        with open(tmp, "w") as f:
            f.write(table + "\n")
        os.replace(tmp, _OUT.value)


if __name__ == "__main__":
    app.run(main)
