"""Shared pieces of the benchmarks: rows, medians, printing.

Every benchmark prints, per measurement, the figure, a baseline measured in
the same run, and the ratio figure / baseline.
"""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
_INSTALLED: dict[str, Path] = {}


def row(name: str, figure: float, unit: str, baseline: float, baseline_name: str, target: str = "") -> dict:
    return {
        "name": name,
        "figure": figure,
        "unit": unit,
        "baseline": baseline,
        "baseline_name": baseline_name,
        "ratio": figure / baseline if baseline else float("inf"),
        "target": target,
    }


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def exit_if_missed(missed: Sequence[str]) -> None:
    """With ``--check`` on the command line, exit 1 naming each missed target (the rows' names)."""
    if "--check" in sys.argv[1:] and missed:
        print(f"target missed: {', '.join(missed)}", file=sys.stderr)
        sys.exit(1)


def run_quiet(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, **kwargs)


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        target = f"  (target {r['target']})" if r["target"] else ""
        print(f"{r['name']:<48} {r['figure']:>12.4g} {r['unit']:<4} baseline {r['baseline']:>10.4g} "
              f"({r['baseline_name']})  ratio {r['ratio']:.3g}{target}", flush=True)


def installed_venv() -> Path:
    """A temporary venv holding a NON-editable install, as operators install it:
    ``pip install ./hookspecs ./site_example .`` (pip compiles the .pyc files at
    install time, as it does for an operator; the benches never compile anything
    themselves).  Built once per process from a copy of the tracked tree (so no
    build/ directory lands in the checkout) and removed at exit.

    An editable install would add import hooks that slow every interpreter
    start, the ``python -c pass`` baseline included, and hide the ratios.
    """
    if "venv" in _INSTALLED:
        return _INSTALLED["venv"]
    base = Path(tempfile.mkdtemp(prefix="vq-bench-venv-"))
    atexit.register(shutil.rmtree, base, True)
    src = base / "src"
    src.mkdir()
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    venv = base / "venv"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run(pip + [str(src / "hookspecs"), str(src / "site_example"), str(src)], capture_output=True,
                          text=True, env=dict(os.environ, PIP_NO_INPUT="1"))
    if done.returncode != 0:
        raise RuntimeError(f"pip install into {venv} failed: {done.stderr[-2000:]}")
    print(f"non-editable install in {venv} ({time.perf_counter() - started:.0f} s; "
          "pip install ./hookspecs ./site_example .)", flush=True)
    _INSTALLED["venv"] = venv
    return venv


def interleaved_medians(commands: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median seconds of each callable, run in interleaved rounds (so load changes hit all alike)."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, fn in commands.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}
