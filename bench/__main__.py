"""Runs every benchmark module `bench/bench_*.py` in its own process (`make bench`).

Each benchmark prints its own table of figures and ratios; this runner reports which ones
failed and exits non-zero if any did. `python -m bench NAME...` runs a subset.
"""

import pathlib
import subprocess
import sys


def main(argv: list[str]) -> int:
    here = pathlib.Path(__file__).parent
    names = argv or sorted(p.stem for p in here.glob("bench_*.py"))
    if not names:
        print("no benchmarks under bench/ yet")
        return 0
    failed = []
    for name in names:
        module = name if name.startswith("bench_") else f"bench_{name}"
        print(f"=== {module} ===", flush=True)
        if subprocess.call([sys.executable, "-m", f"bench.{module}"]) != 0:
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
