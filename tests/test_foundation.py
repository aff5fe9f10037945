"""The base every other test relies on: fake devices, importable packages, markers."""

import importlib
import pathlib
import subprocess
import sys
import tomllib

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ["hat_jax", "models", "rl", "data", "configs", "serve", "launch"]


def test_eight_fake_cpu_devices():
    if jax.default_backend() == "cpu":
        assert jax.device_count() == 8


@pytest.mark.parametrize("name", PACKAGES)
def test_package_imports_and_is_declared(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name}/__init__.py must say what the package owns"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = declared["tool"]["setuptools"]["packages"]["find"]["include"]
    assert f"{name}*" in include


def test_lock_pins_every_requirement():
    lines = [
        line
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines and all("==" in line for line in lines), "every lock line must be pinned"
    names = {line.split("==")[0].lower().replace("_", "-") for line in lines}
    for dep in ["jax", "flax", "optax", "orbax-checkpoint", "grain", "transformers", "mcp"]:
        assert dep in names, f"{dep} missing from requirements.lock"


def test_accelerator_marker_skips_with_reason_on_cpu(pytester):
    if jax.default_backend() != "cpu":
        pytest.skip("this check is about CPU-only machines")
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.accelerator
        def test_needs_gpu():
            raise AssertionError("must not run on CPU")

        def test_plain():
            pass
        """
    )
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a GPU or TPU*cpu*"])


def test_stage_launchers_do_not_import_mcp():
    # The stages start as processes (the pipeline, the tests' kill and resume runs): `mcp`
    # costs about a second of each start-up, and only an MCP connection or server needs it.
    code = (
        "import sys, launch.sft, launch.opd, launch.rl, launch.mtp, launch.eval, hat_jax.livestream;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
