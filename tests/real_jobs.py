"""Slurm jobs on the real test cluster, for the tests that bind a job to a verified launcher
(``test_bindings_real.py``, ``test_prune.py``): remote commands over the loopback sshd, a held
job that runs a generation's selftest, its release and a bounded wait for its end."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from realhosts.procs import wait_until

#: The ``vq_selftest.py`` of a test commit: prints its label and the interpreter's prefix.
SELFTEST = 'import sys\nprint("selftest of {label}", sys.prefix)\n'
#: Slurm's terminal job states.
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def ssh(cluster, *words: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """One remote command on the login host; each word quoted for the remote shell."""
    return subprocess.run(cluster.ssh_argv("cluster", *(shlex.quote(w) for w in words)), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def job_state(cluster, job: str) -> str | None:
    """The job's state from slurmctld, else from the jobcomp log once its record is gone."""
    shown = ssh(cluster, "scontrol", "show", "job", "-o", job)
    found = re.search(r"\bJobState=(\S+)", shown.stdout)
    if found:
        return found.group(1)
    log = Path(cluster.slurm.jobcomp_log)
    text = log.read_text() if log.exists() else ""
    found = re.search(rf"^JobId={job} .*?\bJobState=(\S+)", text, re.MULTILINE)
    return found.group(1) if found else None


def submit_held_selftest(cluster, launcher: str, tmp: Path) -> tuple[str, Path]:
    """Submit, held, a batch job that runs *launcher*'s source's ``vq_selftest.py`` with *launcher*
    (site_example's ``ROOT/releases/<sha>/bin/<program>-<sha>``); ``(job id, its output file)``.
    The submission must succeed."""
    source = launcher.rsplit("/bin/", 1)[0] + "/source"
    script = tmp / "job.sh"
    script.write_text(f"#!/bin/sh\nset -e\n{shlex.quote(launcher)} {shlex.quote(source + '/vq_selftest.py')}\n")
    output = tmp / "job.out"
    submitted = ssh(cluster, "sbatch", "--hold", "--parsable", f"--output={output}", str(script))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0], output


def release_and_wait(cluster, job: str, timeout: float = 60) -> str | None:
    """Release the held *job* (which must succeed) and wait, at most *timeout* s, for a terminal
    state; that state (``COMPLETED``, ...), or None when none came in time."""
    released = ssh(cluster, "scontrol", "release", job)
    assert released.returncode == 0, released.stderr
    return wait_until(lambda: (job_state(cluster, job) or "").split("+")[0] in TERMINAL and job_state(cluster, job),
                      timeout=timeout, interval=0.5)
