"""Exact execution bindings: registry lookup at 100,000 entries vs 10, and
``vq admin launcher`` cold start vs ``python -c pass``, measured in the same run.

* lookup: ``vq_admin.bindings.resolve_launcher(..., expected_sha=SHA)`` for
  SHAs spread over the registry, in interleaved rounds (10 entries, then
  100,000 entries), median per call; target ratio <= 1.5 (no growth with N).
* cold start: the console script ``vq admin launcher PROGRAM HOST
  --expected-sha SHA`` (what the queue driver runs per job) against the
  100,000-entry registry vs ``python -c pass`` with the same interpreter,
  both from a NON-editable install in a temporary venv (``pip install
  ./hookspecs ./site_example .``, bench/common.py), runs interleaved,
  medians; target ratio <= 1.5.

Runnable alone (``python3 bench/bench_bindings.py [--check]``) or from
``bench/run.py``.  The big registry is written directly in the registry's
layout (entry files without fsync, so building it takes seconds), then read
through the real lookup path.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import exit_if_missed, installed_venv, print_rows, row  # noqa: E402

HOST, PROGRAM = "cluster", "vibeqc"
LOOKUP_TARGET, START_TARGET = 1.5, 1.5


def build(root: Path, count: int) -> list[str]:
    """A registry of *count* entries for (HOST, PROGRAM); returns their SHAs."""
    from vq_admin.launcher import registry
    from vq_admin.state.records import Verified

    shas = [f"{i:040x}" for i in range(1, count + 1)]
    directory = Path(registry.lane_dir(root, HOST, PROGRAM))
    directory.mkdir(parents=True)
    for i, sha in enumerate(shas):
        entry = registry.make_entry(HOST, PROGRAM, Verified(**{
            "sha": sha, "tag": None, "launcher": f"/apps/{PROGRAM}/releases/{sha}/source/.venv/bin/python",
            "launcher_sha256": "e" * 64, "receipt": f"bench-{i}", "at": "2026-11-30T00:00:00Z"}))
        with open(directory / f"{sha}.json", "xb") as fh:
            fh.write(registry.encode(entry.to_value()))
    pointer = {"schema": registry.POINTER_SCHEMA, "sha": shas[-1], "receipt": "bench",
               "verified_at": "2026-11-30T00:00:00Z"}
    (directory / "latest.json").write_bytes(registry.encode(pointer))
    return shas


def per_call(root: Path, shas: list[str], calls: int) -> float:
    """Seconds per ``resolve_launcher`` call over *calls* SHAs drawn from *shas*."""
    from vq_admin.bindings import resolve_launcher

    picks = [random.choice(shas) for _ in range(calls)]
    started = time.perf_counter()
    for sha in picks:
        resolve_launcher(PROGRAM, HOST, expected_sha=sha, state_dir=root)
    return (time.perf_counter() - started) / calls


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved lookup rounds")
    parser.add_argument("--runs", type=int, default=21, help="cold starts of each command")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and runs (same registry sizes)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed (standalone only)")
    args, _ = parser.parse_known_args(argv)
    rounds, runs = (5, 9) if args.quick else (args.rounds, args.runs)
    with tempfile.TemporaryDirectory(prefix="vq-bench-bindings-") as tmp:
        small, big = Path(tmp) / "small", Path(tmp) / "big"
        small_shas = build(small, 10)
        started = time.perf_counter()
        big_shas = build(big, args.entries)
        print(f"built a registry of {args.entries} entries in {time.perf_counter() - started:.1f} s", flush=True)
        per_small, per_big = [], []
        for _ in range(rounds):
            per_small.append(per_call(small, small_shas, 500))
            per_big.append(per_call(big, big_shas, 500))
        env = dict(os.environ, VQ_ADMIN_STATE_DIR=str(big), VQ_ADMIN_CONFIG=str(Path(tmp) / "absent.toml"))
        venv = installed_venv()  # as operators install it; pip compiled its .pyc files, nothing here does
        launcher = [str(venv / "bin" / "vq"), "admin", "launcher", PROGRAM, HOST, "--expected-sha",
                    big_shas[len(big_shas) // 2]]
        baseline = [str(venv / "bin" / "python"), "-c", "pass"]
        first_line = (venv / "bin" / "vq").read_text().splitlines()[0]
        print(f"vq as installed: {first_line} (the project's script, bin/vq; no console-script wrapper)", flush=True)
        timed(launcher, env), timed(baseline, env)  # warm the page cache for both
        starts, passes = [], []
        load_before = os.getloadavg()
        for _ in range(runs):
            passes.append(timed(baseline, env))
            starts.append(timed(launcher, env))
        print(f"cold starts: {runs} of each, interleaved; load average {load_before[0]:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after (1 min)", flush=True)
    rows = [
        row(f"resolve_launcher, {args.entries} entries (median)", statistics.median(per_big) * 1e6, "us",
            statistics.median(per_small) * 1e6, "same call, 10 entries", f"<= {LOOKUP_TARGET}"),
        row("vq admin launcher cold start (median)", statistics.median(starts) * 1e3, "ms",
            statistics.median(passes) * 1e3, "python -c pass, same venv", f"<= {START_TARGET}"),
    ]
    print_rows(rows)
    return rows


def missed(rows: list[dict]) -> list[str]:
    limits = [LOOKUP_TARGET, START_TARGET]
    return [r["name"] for r, limit in zip(rows, limits, strict=True) if r["ratio"] > limit]


if __name__ == "__main__":
    exit_if_missed(missed(main()))
