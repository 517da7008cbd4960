"""The use record: ``vq admin launcher --job REF`` cold start, and ``vq admin jobs`` over 1,000,000 uses.

* cold start: the console script ``vq admin launcher PROGRAM HOST --expected-sha SHA --job REF`` (what
  the queue driver runs per job, now recording its use) against ``python -c pass`` and the same
  lookup without ``--job`` (which records a use without a reference), from a NON-editable install
  (bench/common.py), runs interleaved, medians; targets: <= 1.5x ``python -c pass`` and <= 5 ms
  over the lookup without ``--job``.
* jobs: the ``vq admin jobs`` document (``vq_admin.launcher.recall.report``: every segment read,
  every reference listed, the document built and encoded) over 1,000,000 recorded uses of four
  generations (segments written directly in the record's layout; the census is another call,
  measured by bench_census.py), median of 3; target < 2 s of CPU (the wall time is printed too:
  on a shared, loaded machine it is the CPU time times the load).

Runnable alone (``python3 bench/bench_uses.py [--check]``) or from ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import exit_if_missed, installed_venv, print_rows, row  # noqa: E402
from bench_bindings import build, timed  # noqa: E402

HOST, PROGRAM = "cluster", "vibeqc"
START_TARGET, OVER_TARGET_MS, JOBS_TARGET_S = 1.5, 5.0, 2.0


def write_uses(root: Path, shas: list[str], total: int) -> None:
    """*total* uses spread over *shas*, in 4 MiB segments (the newest 8 per SHA; the rest folded)."""
    from vq_admin.launcher import uses

    per = total // len(shas)
    for sha in shas:
        directory = root / "uses" / HOST / PROGRAM / sha
        directory.mkdir(parents=True, mode=0o700)
        launcher = f"/apps/{PROGRAM}/releases/{sha}/source/.venv/bin/python"
        lines = [f"{uses.stamp(1764600000 + i * 0.5)}\tqueue\t{i // 2}\t{launcher}\n".encode() for i in range(per)]
        segments: list[bytes] = []
        current: list[bytes] = []
        size = 0
        for line in lines:
            current.append(line)
            size += len(line)
            if size > uses.SEGMENT_BYTES:
                segments.append(b"".join(current))
                current, size = [], 0
        for i, data in enumerate(segments):
            (directory / f"{i:020d}-1.log").write_bytes(data)
        (directory / uses.CURRENT).write_bytes(b"".join(current))
        for path in directory.iterdir():
            path.chmod(0o600)


def jobs_seconds(root: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``jobs`` document over the record at *root*."""
    from vq_admin.launcher.recall import report
    from vq_admin.launcher.references import CensusCost, CensusScan

    cost = CensusCost(jobs_listed=0, scripts_read=0, scripts_cached=0, cache_rejected=0, cache_problem=None,
                      scheduler_calls=1, seconds=0.0)
    scan = CensusScan(complete=True, jobs_scanned=0, groups=(), error=None, cost=cost)
    started, cpu = time.perf_counter(), time.process_time()
    doc = report(root, HOST, PROGRAM, None, None, scan)
    doc.to_json()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert sum(g.uses.count for g in doc.generations) == 1_000_000, [g.uses.count for g in doc.generations]
    return elapsed, cpu


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="cold starts of each command")
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed (standalone only)")
    args, _ = parser.parse_known_args(argv)
    runs = 9 if args.quick else args.runs
    with tempfile.TemporaryDirectory(prefix="vq-bench-uses-") as tmp:
        big = Path(tmp) / "big"
        shas = build(big, 4)
        started = time.perf_counter()
        write_uses(big, shas, 1_000_000)
        print(f"wrote 1,000,000 uses of 4 generations in {time.perf_counter() - started:.1f} s", flush=True)
        timings = [jobs_seconds(big) for _ in range(3)]
        jobs, jobs_cpu = statistics.median(t[0] for t in timings), statistics.median(t[1] for t in timings)
        small = Path(tmp) / "small"
        build(small, 10)
        env = dict(os.environ, VQ_ADMIN_STATE_DIR=str(small), VQ_ADMIN_CONFIG=str(Path(tmp) / "absent.toml"))
        venv = installed_venv()
        lookup = [str(venv / "bin" / "vq"), "admin", "launcher", PROGRAM, HOST]
        baseline = [str(venv / "bin" / "python"), "-c", "pass"]
        with_job = [*lookup, "--job", "4711"]
        for argv in (lookup, with_job, baseline):
            timed(argv, env)  # warm the page cache
        starts, plain, passes = [], [], []
        for _ in range(runs):
            passes.append(timed(baseline, env))
            plain.append(timed(lookup, env))
            starts.append(timed(with_job, env))
        print(f"cold starts: {runs} of each, interleaved; load average {os.getloadavg()[0]:.2f} (1 min)", flush=True)
    job_ms, plain_ms, pass_ms = (statistics.median(x) * 1e3 for x in (starts, plain, passes))
    rows = [
        row("vq admin launcher --job cold start (median)", job_ms, "ms", pass_ms, "python -c pass, same venv",
            f"<= {START_TARGET}"),
        row("vq admin launcher --job over the lookup without --job", job_ms - plain_ms, "ms", OVER_TARGET_MS,
            "the 5 ms budget", "<= 1"),
        row("vq admin jobs over 1,000,000 uses, CPU (median of 3)", jobs_cpu, "s", JOBS_TARGET_S, "the 2 s budget",
            "< 1"),
        row("vq admin jobs over 1,000,000 uses, wall (median of 3)", jobs, "s", JOBS_TARGET_S, "the 2 s budget",
            "(load-bound on a shared machine)"),
    ]
    print_rows(rows)
    return rows


def missed(rows: list[dict]) -> list[str]:
    return [r["name"] for r, limit in zip(rows, [START_TARGET, 1.0, 1.0, float("inf")], strict=True)
            if r["ratio"] > limit]


if __name__ == "__main__":
    exit_if_missed(missed(main()))
