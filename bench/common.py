"""Shared pieces of the benchmarks: rows, medians, printing.

Every benchmark prints, per measurement, the figure, a baseline measured in
the same run, and the ratio figure / baseline.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Callable, Sequence


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


def run_quiet(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True, **kwargs)


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        target = f"  (target {r['target']})" if r["target"] else ""
        print(f"{r['name']:<48} {r['figure']:>12.4g} {r['unit']:<4} baseline {r['baseline']:>10.4g} "
              f"({r['baseline_name']})  ratio {r['ratio']:.3g}{target}", flush=True)
