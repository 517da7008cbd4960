"""The references census: why each verified generation and launcher must be kept.

For one program on one host, every generation the driver knows of (the
registry of verified launchers, plus LAST OK and LAST GOOD) is listed with
the reasons it must stay:

* ``last-ok``: it is LAST OK, the identity the latest verified success proved
  active (what the stable ``current`` link pointed at then; ``vq admin prune``,
  which verifies it again, keeps it as ``active, last-ok``);
* ``last-good``: it is LAST GOOD, the generation to fall back to;
* ``job <id> (<state>)``: a queued or running Slurm job on the host names it.

Jobs are read from the scheduler on the login host: ``squeue`` lists every
job in every state (``-t all``, all partitions), a job counts unless its state
is terminal, and for each one ``scontrol show job -o`` (its command, work dir,
output paths) and, for batch jobs, ``scontrol write batch_script ID -`` (the
script) are searched.  A generation is referenced when its full SHA appears
there: every immutable launcher path, and so its release directory, carries
the full SHA.  Over-keeping is harmless; under-keeping breaks a job, so any
scheduler error fails the whole census (exit 1) rather than report less.
A job that names the stable ``current`` link of a releases root is reported
as a warning: it runs whatever ``current`` is at dispatch.

This module runs commands over the host's transport; it is not on the per-job
path (that is :mod:`vq_admin.bindings`).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from vq_admin_hookspecs import Slot

from . import registry
from ..core.identifiers import SHA_IN_TEXT_RE, SHA_RE
from ..report.outcome import VqAdminError
from ..plan import fill
from ..state.records import StateDir, utc_now
from ..ssh.transport import RunResult, Transport

SCHEMA = "vq-admin/references/1"
#: Slurm job states after which a job never runs (again) as it stands.
TERMINAL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                             "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED"})
SQUEUE = ["squeue", "-h", "--all", "-t", "all", "-o", "%A|%i|%T"]
#: The job a per-job read is about (a slot: the census fills it from squeue's answer).
JOB = Slot("job_id", label="job id")
SHOW_JOB = ["scontrol", "show", "job", "-o", JOB]
BATCH_SCRIPT = ["scontrol", "write", "batch_script", JOB, "-"]
#: The census's commands by what they read: the whole queue, then each job and its batch script.
READS = {"squeue": SQUEUE, "show-job": SHOW_JOB, "batch-script": BATCH_SCRIPT}
TIMEOUT = 120.0

#: Runs one of :data:`READS` (its name, then the job id for a per-job read) and returns its result.
Reader = Callable[[str, "str | None"], RunResult]
_GONE = re.compile(r"invalid job id", re.IGNORECASE)


class CensusError(VqAdminError):
    """The scheduler could not be read completely; nothing may be pruned on this basis."""


def generations(state: StateDir, host: str, program: str) -> list[dict[str, Any]]:
    """Registry entries plus LAST OK / LAST GOOD, one row per SHA, with the static reasons."""
    rows: dict[str, dict[str, Any]] = {}
    for entry in registry.entries(state.root, host, program):
        rows[entry["sha"]] = {"sha": entry["sha"], "launcher": entry["launcher"], "registered": True,
                              "receipt": entry["receipt"], "reasons": [], "jobs": []}
    for which, reason in (("last-ok", "last-ok"), ("last-good", "last-good")):  # prune's words
        record = state.read_record("runtime", host, program, which) or {}
        sha = record.get("sha")
        if isinstance(sha, str) and SHA_RE.match(sha):
            row = rows.setdefault(sha, {"sha": sha, "launcher": record.get("launcher"), "registered": False,
                                        "receipt": record.get("receipt"), "reasons": [], "jobs": []})
            row["reasons"].append(reason)
    return sorted(rows.values(), key=lambda r: r["sha"])


def reader(transport: Transport) -> Reader:
    """The plain reader: each of :data:`READS` through *transport*, its job slot filled."""
    def read(name: str, job_id: str | None) -> RunResult:
        return transport.run(fill(READS[name], {JOB.name: job_id} if job_id is not None else {}), timeout=TIMEOUT)
    return read


def _run(read: Reader, name: str, job_id: str | None = None) -> RunResult:
    result = read(name, job_id)
    if result.interrupted:
        raise CensusError(f"{' '.join(result.argv[:3])}: {result.describe()}; the census is incomplete")
    return result


def active_jobs(transport: Transport, read: Reader | None = None) -> list[dict[str, str]]:
    """Every non-terminal job on the host: ``{id, display, state, text}`` (text: show job + script).
    *read* runs each command (default: :func:`reader` of *transport*; prune runs its planned steps)."""
    read = read or reader(transport)
    listed = _run(read, "squeue")
    if listed.exit_code != 0:
        raise CensusError(f"squeue failed on {transport.where} ({listed.describe()}): {listed.error_text()[-300:]}")
    jobs, seen = [], set()
    for line in listed.text().splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[0].isdigit():
            if line.strip():
                raise CensusError(f"unexpected squeue line on {transport.where}: {line[:200]!r}")
            continue
        job_id, display, state = parts
        if state.split()[0] in TERMINAL_STATES or job_id in seen:
            continue
        seen.add(job_id)
        shown = _run(read, "show-job", job_id)
        if shown.exit_code != 0:
            if _GONE.search(shown.error_text()):
                continue  # it ended between squeue and now
            raise CensusError(f"scontrol show job {job_id} failed on {transport.where}: {shown.error_text()[-300:]}")
        text = shown.text()
        now = re.search(r"\bJobState=(\S+)", text)
        state = now.group(1) if now else state
        if state in TERMINAL_STATES:
            continue
        if re.search(r"\bBatchFlag=1\b", text):
            script = _run(read, "batch-script", job_id)
            if script.exit_code != 0:
                if _GONE.search(script.error_text()):
                    continue
                raise CensusError(f"scontrol write batch_script {job_id} failed on {transport.where} "
                                  f"({script.error_text()[-300:]}); reading other users' scripts needs a Slurm "
                                  "operator or admin account")
            text += "\n" + script.text()
        jobs.append({"id": job_id, "display": display, "state": state, "text": text})
    return jobs


def _stable_links(launcher: object) -> list[str]:
    """``<root>/current`` for a ``<root>/releases/<sha>/...`` launcher."""
    if isinstance(launcher, str) and "/releases/" in launcher:
        return [launcher.split("/releases/", 1)[0] + "/current"]
    return []


def census(state: StateDir, transport: Transport, host: str, program: str,
           read: Reader | None = None) -> dict[str, Any]:
    """The census document (schema ``vq-admin/references/1``); *read* as :func:`active_jobs`."""
    started = time.monotonic()
    rows = generations(state, host, program)
    jobs = active_jobs(transport, read)
    warnings: list[str] = []
    links = sorted({link for row in rows for link in _stable_links(row["launcher"])})
    for job in jobs:
        label = f"job {job['id']} ({job['state']})"
        for row in rows:
            if row["sha"] in job["text"]:
                row["reasons"].append(label)
                match = "launcher" if row["launcher"] and row["launcher"] in job["text"] else "sha"
                row["jobs"].append({"id": job["id"], "display": job["display"], "state": job["state"], "match": match})
        for link in links:
            if re.search(re.escape(link) + r"(?![^/\s'\"])", job["text"]):
                warnings.append(f"{label} names {link}, a mutable path: it runs whatever current is at dispatch, "
                                "not a verified generation; resubmit it with the launcher vq admin launcher prints")
    known = {row["sha"] for row in rows}
    unregistered: dict[str, list[str]] = {}  # full SHAs a job names that no verification here knows of
    for job in jobs:
        for sha in sorted(set(SHA_IN_TEXT_RE.findall(job["text"])) - known):
            unregistered.setdefault(sha, []).append(f"job {job['id']} ({job['state']})")
    for row in rows:
        row["referenced"] = bool(row["reasons"])
    return {"host": host, "program": program, "where": transport.where, "taken_at": utc_now(),
            "complete": True, "jobs_scanned": len(jobs), "seconds": round(time.monotonic() - started, 3),
            "generations": rows, "warnings": warnings, "unregistered": unregistered}
