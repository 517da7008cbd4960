"""The agent's part of an already-current run: ``vq-admin-agent session`` on a canned request.

An already-current ``update`` is one ssh session running ``vq-admin-agent
session`` on the login host; this bench measures the agent's own share of it,
without ssh and without the provider: the installed console script is started
with a request such as the driver sends (the login-shell probe's words on its
command line; the lease, the command-file check and a verify that only prints
a receipt naming a small launcher, on stdin), and timed

* from its start to its answer (``answer``: both lines), and
* from its start until it has exited after its stdin was closed (``exit``),

against ``python -c pass`` with the same interpreter, runs interleaved,
medians.  Both from a NON-editable install in a temporary venv (``pip
install ./hookspecs ./site_example .``, bench/common.py).

``--against REV`` also installs the tree of git revision REV the same way and
interleaves its agent with this tree's (an A/B in the same run).

Runnable alone (``python3 bench/bench_agent_session.py [--repeat N] [--against REV]``)
or from ``bench/run.py``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import ROOT, installed_venv, print_rows, row  # noqa: E402

PROBE = ["a", "b c"]


def venv_of_revision(rev: str) -> Path:
    """A temporary venv with a NON-editable install of git revision *rev* (removed at exit)."""
    base = Path(tempfile.mkdtemp(prefix="vq-bench-rev-"))
    atexit.register(shutil.rmtree, base, True)
    src = base / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(src / "hookspecs"), str(src / "site_example"), str(src)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install of {rev} failed: {done.stderr[-2000:]}")
    return venv


def canned(work: Path) -> bytes:
    """The request line, in a private directory *work*: lease, command-file check, verify."""
    work.mkdir(mode=0o700)
    (work / "scratch").mkdir(mode=0o700)
    launcher = work / "launcher"
    launcher.write_bytes(b"#!/bin/sh\nexit 0\n")
    launcher.chmod(0o755)
    receipt = work / "receipt.json"
    receipt.write_text(json.dumps({"active_path": str(launcher), "program": "vibeqc"}) + "\n")
    request = {
        "protocol": 1,
        "shell_probe": {"argv": True, "expected": "".join(w + "|" for w in PROBE)},
        "lease": {"root": str(work / "scratch"), "lane": "runtime", "host": "cluster", "program": "vibeqc",
                  "holder": {"driver_host": "bench", "user": "bench", "pid": os.getpid(),
                             "since": "2026-12-01T00:00:00Z", "run_id": "bench"}},
        "check_paths": ["/bin/cat", str(receipt)],
        "verify": {"argv": ["/bin/cat", str(receipt)], "env": {"VQ_BENCH": "1"}, "timeout": 600},
    }
    return json.dumps(request, sort_keys=True).encode() + b"\n"


def session_once(agent: str, request: bytes) -> tuple[float, float]:
    """(seconds to the answer line, seconds to the exit after stdin closed) of one session."""
    started = time.perf_counter()
    proc = subprocess.Popen([agent, "session", "--probe", *PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(request)
    proc.stdin.flush()
    line = proc.stdout.readline()  # protocol, shell and lease; the rest on a second line when the lease is held
    answer = json.loads(line) if line else {}
    if answer.get("lease", {}).get("held"):
        line = proc.stdout.readline()
        answer.update(json.loads(line) if line else {})
    answered = time.perf_counter() - started
    proc.stdin.close()
    code = proc.wait(timeout=60)
    ended = time.perf_counter() - started
    if code != 0 or not answer.get("lease", {}).get("held") or answer.get("verify", {}).get("readback_exit") != 0:
        raise RuntimeError(f"{agent} session: exit {code}, answer {line[:500]!r}, {proc.stderr.read()[-500:]!r}")
    proc.stdout.close()
    proc.stderr.close()
    return answered, ended


def pass_once(python: str) -> float:
    started = time.perf_counter()
    subprocess.run([python, "-c", "pass"], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (7)")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved rounds (default 21)")
    parser.add_argument("--against", metavar="REV", help="also the agent of git revision REV, interleaved")
    args, _ = parser.parse_known_args(argv)
    repeat = args.repeat or (7 if args.quick else 21)
    venvs = {"this tree": installed_venv()}
    if args.against:
        venvs[args.against] = venv_of_revision(args.against)
    work = Path(tempfile.mkdtemp(prefix="vq-bench-session-"))
    atexit.register(shutil.rmtree, work, True)
    requests = {name: canned(work / f"w{i}") for i, name in enumerate(venvs)}
    python = str(venvs["this tree"] / "bin" / "python")
    samples: dict[str, list[float]] = {"pass": []}
    for name in venvs:
        samples[f"{name} answer"], samples[f"{name} exit"] = [], []
    for name, venv in venvs.items():  # warm the page cache once
        session_once(str(venv / "bin" / "vq-admin-agent"), requests[name])
    for _ in range(repeat):
        samples["pass"].append(pass_once(python))
        for name, venv in venvs.items():
            answered, ended = session_once(str(venv / "bin" / "vq-admin-agent"), requests[name])
            samples[f"{name} answer"].append(answered)
            samples[f"{name} exit"].append(ended)
    medians = {key: statistics.median(values) for key, values in samples.items()}
    rows = []
    for name in venvs:
        for what in ("answer", "exit"):
            rows.append(row(f"agent session ({name}): start to {what}", medians[f"{name} {what}"] * 1000, "ms",
                            medians["pass"] * 1000, "python -c pass, same venv"))
    print(f"agent session: {repeat} interleaved rounds, medians", flush=True)
    print_rows(rows)
    return rows


if __name__ == "__main__":
    main()
