"""The references census: why each verified generation and launcher must be kept.

For one program on one host, every generation the driver knows of (the
registry of verified launchers, plus LAST OK and LAST GOOD) is listed with
the reasons it must stay:

* ``last-ok``: it is LAST OK, the identity the latest verified success proved
  active (what the stable ``current`` link pointed at then; ``vq admin prune``,
  which verifies it again, keeps it as ``active, last-ok``);
* ``last-good``: it is LAST GOOD, the generation to fall back to;
* ``job <id> (<state>)``: a queued or running Slurm job on the host names it.

Jobs are read on the login host by the agent's ``census`` verb, in one call
(:mod:`vq_admin.agent.census`): one ``squeue`` listing of every job (its state,
user, command, work dir and output paths) and, for a batch job not seen by an
earlier census, its stored script (``scontrol write batch_script``); what a
stored script names is kept in the login account's agent state, so a census
reads only the scripts of new jobs.  The agent answers with the *words* of
each job that name a full SHA (:class:`CensusScan`).  A generation is
referenced when its full SHA appears in one: every immutable launcher path,
and so its release directory, carries the full SHA.  Over-keeping is
harmless; under-keeping breaks a job, so any scheduler error fails the whole
census (:class:`CensusError`) rather than report less.  A job that names the
stable ``current`` link of a releases root is reported as a warning: it runs
whatever ``current`` is at dispatch.

This module runs the agent over the host's transport; it is not on the
per-job path (that is :mod:`vq_admin.bindings`).
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Callable, Iterable, Sequence

import msgspec

from . import registry
from ..core import protocol
from ..core.bounds import InputError
from ..core.identifiers import JOB_ID_RE, SHA_IN_TEXT_RE
from ..document import Count, Document
from ..report.outcome import VqAdminError
from ..state.records import StateDir
from ..core.stamps import utc_now
from ..ssh.transport import CAPTURE_LIMIT, RunResult, Transport

SCHEMA = "vq-admin/references/1"
#: Seconds the agent's census may take in all (each scheduler command it runs has its own bound).
TIMEOUT = 3600.0

#: Runs the census's one agent call (prune runs its planned step) and returns its result.
Runner = Callable[[], RunResult]


class CensusCost(Document, frozen=True, kw_only=True):
    """What one census asked of the scheduler and how long it took on the login host."""

    jobs_listed: Count  #: jobs the listing held, in every state
    scripts_read: Count  #: stored batch scripts read (one scheduler call each)
    scripts_cached: Count  #: batch jobs whose script's words came from the cache
    cache_rejected: Count  #: cache entries whose seal did not match (their scripts were read again)
    cache_problem: str | None  #: why the cache was not used or not written, if so
    scheduler_calls: Count  #: scheduler commands run: the listing (two RPCs) and each script read (one)
    seconds: Annotated[float, msgspec.Meta(ge=0)]


class QueuedJob(Document, frozen=True, kw_only=True):
    """One queued or running job as the census lists it."""

    id: Annotated[str, msgspec.Meta(pattern=JOB_ID_RE.pattern)]
    display: str  #: squeue's id (``10_[1-3]`` for a pending array)
    state: str
    user: str


class JobGroup(Document, frozen=True, kw_only=True):
    """Jobs whose command, paths and stored script name the same *words* (those with a full SHA or a
    ``current`` link)."""

    words: tuple[str, ...]
    jobs: tuple[QueuedJob, ...]


def _names(words: Iterable[str], needle: str) -> bool:
    """A job's words name *needle* (a full SHA or a launcher path): it is part of one of them."""
    return any(needle in word for word in words)


class CensusScan(Document, frozen=True, kw_only=True):
    """The agent's ``census`` answer: every queued or running job that names something, by its words.
    Strict: every member must be there (a missing one fails the census closed, never reads as "no job");
    ``jobs_scanned`` and ``groups`` are ``null`` in a failed census's answer."""

    complete: bool
    cost: CensusCost
    jobs_scanned: Count | None  #: jobs not in a terminal state
    groups: tuple[JobGroup, ...] | None
    error: str | None

    def jobs_naming(self, shas: Iterable[str]) -> dict[str, list[QueuedJob]]:
        """For each full SHA of *shas*, the jobs whose command, paths or stored script name it, by job id."""
        found: dict[str, list[QueuedJob]] = {sha: [] for sha in shas}
        for group in self.groups or ():
            for sha, jobs in found.items():
                if _names(group.words, sha):
                    jobs.extend(group.jobs)
        for jobs in found.values():
            jobs.sort(key=lambda job: int(job.id))
        return found


class CensusError(VqAdminError):
    """The scheduler could not be read completely; nothing may be pruned on this basis.
    ``cost`` is what the census cost until it failed, when the agent said."""

    def __init__(self, message: str, cost: CensusCost | None = None):
        super().__init__(message)
        self.cost = cost


class JobMatch(Document, frozen=True, kw_only=True):
    """A job that names a generation: by its launcher, or only by its SHA."""

    id: str
    display: str
    state: str
    user: str
    match: str  #: ``launcher`` or ``sha``


class Generation(Document, frozen=True, kw_only=True):
    """One generation the driver knows of and the reasons to keep it."""

    sha: str
    launcher: str | None
    registered: bool  #: a registry entry (else only LAST OK or LAST GOOD names it)
    receipt: str | None
    reasons: tuple[str, ...] = ()
    jobs: tuple[JobMatch, ...] = ()
    referenced: bool = False


class Census(Document, frozen=True, kw_only=True):
    """The references census (schema ``vq-admin/references/1``) of one program on one host."""

    host: str
    program: str
    where: str
    taken_at: str
    complete: bool
    jobs_scanned: Count | None
    seconds: float
    cost: CensusCost
    generations: tuple[Generation, ...]
    warnings: tuple[str, ...]
    unregistered: dict[str, tuple[str, ...]]  #: full SHAs jobs name that no verification here knows of


def generations(state: StateDir, host: str, program: str) -> list[Generation]:
    """Registry entries plus LAST OK / LAST GOOD, one row per SHA, with the static reasons."""
    rows = {entry.sha: Generation(sha=entry.sha, launcher=entry.launcher, registered=True, receipt=entry.receipt)
            for entry in registry.entries(state.root, host, program)}
    for which in ("last-ok", "last-good"):  # prune's words
        record = state.verified("runtime", host, program, which)
        if record is not None:
            row = rows.get(record.sha) or Generation(sha=record.sha, launcher=record.launcher or None,
                                                     registered=False, receipt=record.receipt)
            rows[record.sha] = row.replace(reasons=(*row.reasons, which))
    return sorted(rows.values(), key=lambda r: r.sha)


def scan(transport: Transport, agent: Sequence[str], run: Runner | None = None) -> CensusScan:
    """The census of the queue on *transport*'s host: one ``census`` call of the agent (*agent*: its
    words, ``hosts.<name>.agent``); *run* runs that call instead (prune runs its planned step).
    :class:`CensusError` when the census is not complete, for whatever reason."""
    result = run() if run is not None else transport.run(protocol.census(agent), timeout=TIMEOUT)
    where = transport.where
    if result.interrupted:
        raise CensusError(f"the census on {where}: {result.describe()}; the census is incomplete")
    if protocol.lacks_verb(protocol.CENSUS, result.exit_code, result.stdout, result.stderr):
        raise CensusError(f"the agent on {where} has no census verb: update the helper first (vq admin update "
                          "HOST --expected-sha SHA)")
    if result.stdout_truncated:
        raise CensusError(f"the census answer on {where} is larger than {CAPTURE_LIMIT} bytes")
    try:
        found = CensusScan.from_json(result.stdout, f"the agent's census answer on {where}", limit=CAPTURE_LIMIT)
    except InputError as exc:
        raise CensusError(f"{exc} (exit status {result.exit_code}: {result.error_text()[-300:]})") from None
    if result.exit_code != 0 or not found.complete or found.groups is None or found.jobs_scanned is None:
        raise CensusError(f"the agent on {where} could not read the queue completely: "
                          f"{found.error or result.describe()}", found.cost)
    return found


def census(state: StateDir, transport: Transport, agent: Sequence[str], host: str, program: str,
           run: Runner | None = None) -> Census:
    """The census of *program* on *host*; *agent* and *run* as for :func:`scan`."""
    started = time.monotonic()
    rows = generations(state, host, program)
    found = scan(transport, agent, run)
    warnings: list[str] = []
    links = sorted({row.launcher.split("/releases/", 1)[0] + "/current"  # <root>/current of <root>/releases/<sha>/...
                    for row in rows if row.launcher and "/releases/" in row.launcher})
    known = {row.sha for row in rows}
    unregistered: dict[str, tuple[str, ...]] = {}
    named = sorted(((job, group.words) for group in found.groups or () for job in group.jobs),
                   key=lambda p: int(p[0].id))
    for job, words in named:
        label = f"job {job.id} ({job.state})"
        rows = [_referenced(row, job, words, label) if _names(words, row.sha) else row for row in rows]
        for link in links:
            if any(re.search(re.escape(link) + r"(?![^/\s'\"])", word) for word in words):
                warnings.append(f"{label} names {link}, a mutable path: it runs whatever current is at dispatch, "
                                "not a verified generation; resubmit it with the launcher vq admin launcher prints")
        for sha in sorted({sha for word in words for sha in SHA_IN_TEXT_RE.findall(word)} - known):
            unregistered[sha] = (*unregistered.get(sha, ()), label)
    return Census(host=host, program=program, where=transport.where, taken_at=utc_now(), complete=True,
                  jobs_scanned=found.jobs_scanned, seconds=round(time.monotonic() - started, 3), cost=found.cost,
                  generations=tuple(row.replace(referenced=bool(row.reasons)) for row in rows),
                  warnings=tuple(warnings), unregistered=unregistered)


def _referenced(row: Generation, job: QueuedJob, words: Sequence[str], label: str) -> Generation:
    """*row*, which *job* (its *words*) names: its label a reason to keep it, and the job listed."""
    match = "launcher" if row.launcher and _names(words, row.launcher) else "sha"
    return row.replace(reasons=(*row.reasons, label), jobs=(*row.jobs, JobMatch(
        id=job.id, display=job.display, state=job.state, user=job.user, match=match)))
