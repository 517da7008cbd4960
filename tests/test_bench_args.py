"""``python3 bench/run.py --quick`` passes ``--quick`` to every bench module: each one accepts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("module", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_every_bench_module_accepts_quick(module):
    done = subprocess.run([sys.executable, str(BENCH / module), "--quick", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "--quick" in done.stdout, done.stdout + done.stderr


def test_the_readme_names_the_bench_command():
    readme = (BENCH.parent / "README.md").read_text()
    assert "## Benchmarks" in readme and "python3 bench/run.py --quick" in readme
