"""`serve.sglang`: the SGLang command for an export (flags of SGLang 0.5.23) and the
readiness / timeout / server-info logic, against a stand-in server process (SGLang itself
runs on accelerator machines)."""

import sys
import textwrap

import pytest
from flax import nnx

import models
from serve import convert
from serve.sglang import ServerStartError, SGLangConfig, SGLangServer, sglang_command


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{"vl_mtp": a vision-language export with the MTP head, "text": a text-only one}."""
    config = models.QwenConfig.preset("tiny")
    model = models.Qwen(config, rngs=nnx.Rngs(0))
    head = models.MTPHead(config, rngs=nnx.Rngs(1))
    root = tmp_path_factory.mktemp("exports")
    out = {
        "vl_mtp": convert.save_hf(model, config, root / "vl", dtype="float32", mtp=head,
                                  progress=False),
        "text": convert.save_hf(model, config, root / "text", dtype="float32", layout="text",
                                progress=False),
    }  # fmt: skip
    return {k: str(v) for k, v in out.items()}


def test_command_of_a_vision_language_export_with_its_mtp_head(exports):
    cmd = sglang_command(SGLangConfig(exports["vl_mtp"], port=31000, served_model_name="hat"))
    assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
    flags = " ".join(cmd[3:])
    assert flags == (
        f"--model-path {exports['vl_mtp']} --host 127.0.0.1 --port 31000 "
        "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --mem-fraction-static 0.8 "
        "--tp-size 1 --speculative-algorithm NEXTN --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4 --language-model-only "
        "--served-model-name hat"
    )
    off = sglang_command(SGLangConfig(exports["vl_mtp"], speculative=False))
    assert "--speculative-algorithm" not in off and "--language-model-only" in off


def test_command_of_a_text_export_without_a_head(exports):
    cmd = sglang_command(SGLangConfig(exports["text"], context_length=8192,
                                      extra_args=("--enable-metrics",)))  # fmt: skip
    assert "--speculative-algorithm" not in cmd and "--language-model-only" not in cmd
    assert cmd[-3:] == ["--context-length", "8192", "--enable-metrics"]
    with pytest.raises(ValueError, match="no mtp.* tensors"):
        sglang_command(SGLangConfig(exports["text"], speculative=True))


def test_bad_exports_and_settings_are_named(exports, tmp_path):
    with pytest.raises(FileNotFoundError, match="not an HF model directory"):
        sglang_command(SGLangConfig(str(tmp_path)))
    with pytest.raises(ValueError, match="mem_fraction_static"):
        sglang_command(SGLangConfig(exports["text"], mem_fraction_static=1.5))
    with pytest.raises(ValueError, match="speculative settings"):
        sglang_command(SGLangConfig(exports["vl_mtp"], speculative_num_steps=0))


STAND_IN = textwrap.dedent('''
    """Answers /health with 503 for `delay` seconds, then 200 (SGLang's start-up), and
    /server_info with two data-parallel ranks' states; exits with `exit_code` if given."""
    import http.server, json, sys, time
    port, delay, exit_code = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    print("stand-in starting", flush=True)
    if exit_code != "none":
        print("fatal: no GPU found", flush=True)
        sys.exit(int(exit_code))
    start = time.monotonic()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                code, body = (200 if time.monotonic() - start > delay else 503), {}
            elif self.path == "/server_info":
                code, body = 200, {"internal_states": [{"avg_spec_accept_length": 2.5},
                                                       {"avg_spec_accept_length": 3.5}]}
            else:
                code, body = 404, {}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in(tmp_path, delay, exit_code="none"):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = _free_port()
    command = [sys.executable, str(script), str(port), str(delay), exit_code]
    return SGLangServer(command, f"http://127.0.0.1:{port}", tmp_path / "logs" / "server.log")


def test_waits_for_readiness_and_reads_the_acceptance_length(tmp_path):
    server = _stand_in(tmp_path, delay=1.0)
    with server.start(timeout_s=60, poll_s=0.2):
        assert server.process.poll() is None
        assert server.server_info()["spec_accept_length"] == pytest.approx(3.0)
    assert server.process.poll() is not None  # stopped on exit


def test_a_process_that_exits_first_fails_with_its_log(tmp_path):
    server = _stand_in(tmp_path, delay=0, exit_code="3")
    with pytest.raises(ServerStartError, match=r"exited with code 3(.|\n)*no GPU found"):
        server.start(timeout_s=60, poll_s=0.2)


def test_a_server_that_never_gets_ready_is_stopped_after_the_timeout(tmp_path):
    server = _stand_in(tmp_path, delay=1e6)
    with pytest.raises(ServerStartError, match=r"not ready within 2 s(.|\n)*stand-in starting"):
        server.start(timeout_s=2, poll_s=0.2)
    assert server.process.poll() is not None
