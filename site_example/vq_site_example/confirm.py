"""``vq-site-example confirm``: the confirmation command vq-admin runs inside a batch job on a compute node
(its profile key ``confirm_command``; CONTRACT section 13).

It runs a small real computation through the generation's launcher (``--launcher``, the immutable
per-SHA launcher vq-admin read back), checks the answer, and prints two metrics for vq-admin to
compare with the previous generation's::

    VQ-DEPLOY-METRIC seconds_per_step=<seconds per step of the computation>
    VQ-DEPLOY-METRIC energy_digest=<first 16 hex digits of the SHA-256 of the answer>

Exit 0 when the launcher is the requested generation's and the computation gave the known answer;
else 1, saying why.  A site writes its own (a short run of its real program on a test input), in
the same shape: exit status for "it runs here", metric lines for "it computes what the last one did".
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess

from .errors import EXIT_FAILED, failed

#: The computation (run by the launcher's interpreter): a few steps of a small fixed-point iteration.
PROGRAM = """\
import time
steps, x, start = 200, 0.5, time.perf_counter()
for _ in range(steps):
    total = 0.0
    for k in range(2000):
        x = 3.7 * x * (1.0 - x)
        total += x
print(repr(round(total, 6)), (time.perf_counter() - start) / steps)
"""
#: The answer every correct generation gives.
EXPECTED = "1332.221259"
TIMEOUT = 300.0


def run(ns: argparse.Namespace) -> int:
    name = os.path.basename(ns.launcher)
    if name != f"{ns.program}-{ns.expected_sha}":
        raise failed(f"{ns.launcher} is not the launcher of {ns.program} {ns.expected_sha}")
    try:
        done = subprocess.run([ns.launcher, "-c", PROGRAM], capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise failed(f"the launcher {ns.launcher} could not run the computation: {exc}") from None
    if done.returncode != 0 or len(done.stdout.split()) != 2:
        raise failed(f"the computation through {ns.launcher} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    answer, per_step = done.stdout.split()
    print(f"computed {answer} through {ns.launcher} on {os.uname().nodename} (job {os.environ.get('SLURM_JOB_ID')})")
    print(f"VQ-DEPLOY-METRIC seconds_per_step={float(per_step):.6f}")
    print(f"VQ-DEPLOY-METRIC energy_digest={hashlib.sha256(answer.encode()).hexdigest()[:16]}", flush=True)
    if answer != EXPECTED:
        print(f"vq-site-example: error: the computation gave {answer}, not {EXPECTED}")
        return EXIT_FAILED
    return 0
