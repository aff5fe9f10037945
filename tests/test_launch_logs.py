"""Launch scripts keep library logs at WARNING unless `--verbosity` asks for more."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = """
from absl import app, logging
from launch import _logs

def main(argv):
    _logs.quiet()
    logging.info("library detail")
    logging.warning("something to see")

app.run(main)
"""


@pytest.mark.parametrize("args, shown", [([], False), (["--verbosity=0"], True)])
def test_library_info_lines_are_hidden_unless_asked_for(args, shown):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "something to see" in proc.stderr
    assert ("library detail" in proc.stderr) is shown
