"""Serving an HF export with SGLang (accelerator machines; `pip install -e ".[serve]"`).

    python -m serve.sglang --model_path runs/demo/export/hf --dry_run     # print the command
    python -m serve.sglang --model_path runs/demo/export/hf --port 30000  # run it, wait, report

The command follows SGLang 0.5.23's own flags (`sglang/srt/arg_groups/fields/*.py` of that
wheel): `--reasoning-parser qwen3`, `--tool-call-parser qwen3_coder`; with the export's
MTP head (`mtp.*` tensors) NextN speculative decoding, `--speculative-algorithm NEXTN
--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4` (the
draft reads `mtp.*` from the same checkpoint); `--language-model-only` when the export has
the vision-language layout (`Qwen3_5MoeForConditionalGeneration`: the vision tower is never
built, its memory goes to the KV cache); `--mem-fraction-static`, `--tp-size`,
`--context-length` and `--served-model-name` as given.

`SGLangServer` starts the process (its output to a log file), waits until `/health` answers
200 (SGLang answers 503 while it starts), fails with the log's tail when the process exits
first or the wait times out (the process is then stopped), and reads `/server_info`: the
speculative acceptance length is `internal_states[i].avg_spec_accept_length`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

_VL_ARCHITECTURES = ("Qwen3_5MoeForConditionalGeneration",)


@dataclasses.dataclass(frozen=True)
class SGLangConfig:
    """How to serve an export with SGLang.

    Attributes:
        model_path: the HF directory (`serve.convert to-hf`).
        host, port: where the server listens.
        served_model_name: the model id clients send (default: SGLang's, the path).
        speculative: NextN MTP speculative decoding with the export's `mtp.*` head; None
            uses it when the export has one, True requires it.
        speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens: NextN's
            draft steps, tree width and verified tokens (REFERENCE: 3, 1, 4).
        mem_fraction_static: the share of GPU memory for weights and the KV cache.
        tp_size: tensor-parallel GPUs.
        context_length: the served context (default: the config's).
        language_model_only: skip the vision tower; None decides from the export's layout.
        extra_args: further SGLang flags, appended as given.
        python: the interpreter that runs `sglang.launch_server`.
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str | None = None
    speculative: bool | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    mem_fraction_static: float = 0.8
    tp_size: int = 1
    context_length: int | None = None
    language_model_only: bool | None = None
    extra_args: tuple[str, ...] = ()
    python: str = sys.executable


def _export_facts(model_path: str) -> tuple[bool, bool]:
    """(vision-language layout, has an MTP head) of an HF export; errors name the problem."""
    from serve import convert

    path = pathlib.Path(model_path)
    if not convert.is_hf_dir(path):
        raise FileNotFoundError(
            f"{model_path} is not an HF model directory (config.json and *.safetensors); "
            "export one with `python -m serve.convert to-hf`"
        )
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise ValueError(f"{path / 'config.json'} is not valid JSON ({err})") from None
    vl = any(a in _VL_ARCHITECTURES for a in config.get("architectures") or ())
    return vl, convert.has_mtp(path)


def sglang_command(config: SGLangConfig) -> list[str]:
    """The `python -m sglang.launch_server ...` argument list for `config`.

    Raises:
        FileNotFoundError: the model path is not an HF directory.
        ValueError: speculative decoding was required but the export has no `mtp.*` head,
            or a setting is out of range.
    """
    vl, has_head = _export_facts(config.model_path)
    if config.speculative and not has_head:
        raise ValueError(
            f"{config.model_path} has no mtp.* tensors: NextN speculative decoding needs the "
            "MTP head in the export (`serve.convert to-hf --mtp HEAD`)"
        )
    if not 0 < config.mem_fraction_static < 1 or config.tp_size < 1:
        raise ValueError(
            f"mem_fraction_static={config.mem_fraction_static} must be in (0, 1) and "
            f"tp_size={config.tp_size} >= 1"
        )
    cmd = [
        config.python, "-m", "sglang.launch_server",
        "--model-path", str(config.model_path),
        "--host", config.host,
        "--port", str(config.port),
        "--reasoning-parser", "qwen3",
        "--tool-call-parser", "qwen3_coder",
        "--mem-fraction-static", f"{config.mem_fraction_static:g}",
        "--tp-size", str(config.tp_size),
    ]  # fmt: skip
    if config.speculative is not False and has_head:
        steps, topk, drafts = (
            config.speculative_num_steps,
            config.speculative_eagle_topk,
            config.speculative_num_draft_tokens,
        )
        if min(steps, topk, drafts) < 1:
            raise ValueError(f"speculative settings must be >= 1, got {steps}, {topk}, {drafts}")
        cmd += [
            "--speculative-algorithm", "NEXTN",
            "--speculative-num-steps", str(steps),
            "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(drafts),
        ]  # fmt: skip
    if config.language_model_only if config.language_model_only is not None else vl:
        cmd.append("--language-model-only")
    if config.served_model_name:
        cmd += ["--served-model-name", config.served_model_name]
    if config.context_length:
        cmd += ["--context-length", str(config.context_length)]
    return cmd + list(config.extra_args)


class ServerStartError(RuntimeError):
    """The server process exited, or did not become ready in time (the log's tail attached)."""


class SGLangServer:
    """A server process that answers `/health` when ready (SGLang, or any stand-in).

    Args:
        command: the argument list to run.
        url: the server's base URL (`http://host:port`).
        log_path: where the process's stdout and stderr go.
        env: extra environment variables.
    """

    def __init__(
        self,
        command: Sequence[str],
        url: str,
        log_path: str | os.PathLike,
        *,
        env: dict[str, str] | None = None,
    ):
        self.command, self.url = list(command), url.rstrip("/")
        self.log_path = pathlib.Path(log_path)
        self.env = env
        self.process: subprocess.Popen | None = None

    @classmethod
    def for_config(cls, config: SGLangConfig, log_path: str | os.PathLike) -> SGLangServer:
        return cls(sglang_command(config), f"http://{config.host}:{config.port}", log_path)

    def start(self, timeout_s: float = 900.0, poll_s: float = 1.0) -> SGLangServer:
        """Starts the process and waits until `/health` answers 200.

        Raises:
            ServerStartError: the process exited first, or `timeout_s` passed (it is stopped).
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it while it runs
        try:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, **(self.env or {})},
            )  # fmt: skip
        finally:
            log.close()
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=min(poll_s * 5, 30)) as client:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"the server exited with code {code} before it was ready "
                        f"({' '.join(self.command[:4])} ...); log {self.log_path}:\n{self._tail()}"
                    )
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(
                        f"the server was not ready within {timeout_s:g} s (stopped); log "
                        f"{self.log_path}:\n{self._tail()}"
                    )
                time.sleep(poll_s)

    def server_info(self) -> dict[str, Any]:
        """`/server_info` (older SGLang: `/get_server_info`) with `spec_accept_length`, the
        mean of `internal_states[i].avg_spec_accept_length` (None without speculation)."""
        with httpx.Client(timeout=30) as client:
            reply = client.get(f"{self.url}/server_info")
            if reply.status_code == 404:
                reply = client.get(f"{self.url}/get_server_info")
            reply.raise_for_status()
            info = reply.json()
        lengths = [
            s["avg_spec_accept_length"]
            for s in info.get("internal_states") or ()
            if isinstance(s, dict) and s.get("avg_spec_accept_length") is not None
        ]
        info["spec_accept_length"] = sum(lengths) / len(lengths) if lengths else None
        return info

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Terminates the process (then kills it after `timeout_s`); its exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def __enter__(self) -> SGLangServer:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str]) -> None:
    del argv
    from absl import flags

    f = flags.FLAGS
    config = SGLangConfig(
        model_path=f.model_path, host=f.host, port=f.port,
        served_model_name=f.served_model_name,
        speculative={"auto": None, "on": True, "off": False}[f.speculative],
        mem_fraction_static=f.mem_fraction_static, tp_size=f.tp_size,
        context_length=f.context_length or None, extra_args=tuple(f.extra_args),
    )  # fmt: skip
    command = sglang_command(config)
    print(" ".join(command))
    if f.dry_run:
        return
    server = SGLangServer(command, f"http://{config.host}:{config.port}", f.log)
    server.start(timeout_s=f.timeout_s)
    print(f"ready at {server.url}/v1; server info: {json.dumps(server.server_info())[:2000]}")
    try:
        server.process.wait()
    except KeyboardInterrupt:
        server.stop()


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("model_path", None, "The HF export to serve.")
    flags.mark_flag_as_required("model_path")
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
    flags.DEFINE_integer("port", 30000, "Port to listen on.")
    flags.DEFINE_string("served_model_name", None, "The model id clients send.")
    flags.DEFINE_enum("speculative", "auto", ["auto", "on", "off"],
                      "NextN MTP speculative decoding (auto: when the export has mtp.*).")  # fmt: skip
    flags.DEFINE_float("mem_fraction_static", 0.8, "GPU memory share for weights + KV cache.")
    flags.DEFINE_integer("tp_size", 1, "Tensor-parallel GPUs.")
    flags.DEFINE_integer("context_length", 0, "Served context (0: the config's).")
    flags.DEFINE_list("extra_args", [], "Further SGLang flags, comma-separated.")
    flags.DEFINE_string("log", "runs/sglang/server.log", "The server's log file.")
    flags.DEFINE_float("timeout_s", 1800.0, "How long to wait for readiness.")
    flags.DEFINE_bool("dry_run", False, "Print the command and exit.")


if __name__ == "__main__":
    from absl import app

    _define_flags()
    app.run(main)
