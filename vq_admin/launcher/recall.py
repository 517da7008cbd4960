"""Recall: per generation, the recorded uses (:mod:`vq_admin.launcher.uses`) and the jobs the
scheduler holds now that reference it (the census of :mod:`vq_admin.launcher.references`).

``vq admin jobs`` prints it (schema ``vq-admin/jobs/1``); ``vq admin prune`` keeps a generation used
within ``--used-within`` days (:func:`read_uses`); ``vq admin status --prometheus`` publishes the
counts (:func:`read_uses` too).
"""

from __future__ import annotations

import os
import re
from typing import Iterable

from . import registry, uses
from ..document import Count, Document, FullSha
from ..report.outcome import UsageError, VqAdminError
from ..state.tree import PrivateTree
from .references import CensusError, CensusScan, QueuedJob

SCHEMA = "vq-admin/jobs/1"
_SINCE_RE = re.compile(r"\A(\d{4}-\d{2}-\d{2})(?:T(\d{2}:\d{2}:\d{2})Z)?\Z")


class Uses(Document, frozen=True, kw_only=True):
    """The recorded uses of one generation."""

    count: Count  #: every recorded use (at or after ``since``), folded ones included
    first: str | None
    last: str | None
    references: tuple[str, ...]  #: every job reference of the uses still in segments, sorted
    folded: Count  #: uses counted from folded segments, whose references are no longer kept


class GenerationJobs(Document, frozen=True, kw_only=True):
    sha: FullSha
    launcher: str | None
    uses: Uses
    jobs: tuple[QueuedJob, ...]  #: pending, running, suspended or held jobs naming it now


class JobsReport(Document, frozen=True, kw_only=True):
    host: str
    program: str
    since: str | None
    generations: tuple[GenerationJobs, ...]
    jobs_scanned: Count
    census_error: str | None  #: why the scheduler could not be read completely (then exit 1)


def since_stamp(value: str | None) -> str | None:
    """``--since`` (``2026-11-30`` or ``2026-11-30T10:00:00Z``, UTC) as a prefix the use record compares."""
    if value is None:
        return None
    found = _SINCE_RE.match(value)
    if not found:
        raise UsageError(f"--since {value!r}: give a UTC date or time, 2026-11-30 or 2026-11-30T10:00:00Z")
    return f"{found.group(1)}T{found.group(2) or '00:00:00'}.000000Z"


def read_uses(state_root: str | os.PathLike[str], host: str, program: str, shas: Iterable[str] | None = None,
              since: str | None = None) -> dict[str, uses.Usage]:
    """:func:`uses.read` below the state directory *state_root* (every level checked): every generation's
    recorded uses without *shas* and *since* (for prune's ``--used-within`` and the Prometheus counts)."""
    fd = PrivateTree(state_root).open_dir([], create=False)
    if fd is None:
        return {}
    try:
        return uses.read(fd, host, program, shas, since)
    except (OSError, ValueError) as exc:  # never counted from zero (a prune would take what is in use)
        raise VqAdminError(f"the use record of {program} on {host} cannot be read: {exc}") from None
    finally:
        os.close(fd)


def report(state_root: str | os.PathLike[str], host: str, program: str, sha: str | None, since: str | None,
           census: CensusScan | CensusError) -> JobsReport:
    """The ``jobs`` document; *census* is the scan of the host's queue, or why it could not be read."""
    launchers = {e.sha: e.launcher for e in registry.entries(state_root, host, program)}
    found = read_uses(state_root, host, program, [sha] if sha else None, since)
    shas = [sha] if sha else sorted(set(launchers) | set(found))
    if isinstance(census, CensusError):
        naming, scanned, error = {}, 0, census.message
    else:
        naming, scanned, error = census.jobs_naming(shas), census.jobs_scanned or 0, None
    rows = []
    for each in shas:
        used = found.get(each) or uses.Usage(each)
        rows.append(GenerationJobs(
            sha=each, launcher=launchers.get(each), jobs=tuple(naming.get(each, ())),
            uses=Uses(count=used.count, first=used.first, last=used.last, references=tuple(sorted(used.refs)),
                      folded=used.folded)))
    return JobsReport(host=host, program=program, since=since, generations=tuple(rows), jobs_scanned=scanned,
                      census_error=error)


def lines(doc: JobsReport, limit: int = 20) -> list[str]:
    """The text of ``vq admin jobs``: at most *limit* references per generation (``--json`` lists all)."""
    from ..report.output import safe_text

    total = sum(g.uses.count for g in doc.generations)
    out = [f"{doc.program} on {doc.host}: {len(doc.generations)} generation(s), {total} recorded use(s)"
           + (f" since {doc.since}" if doc.since else "")
           + (f"; the scheduler could not be read: {doc.census_error}" if doc.census_error else
              f"; {doc.jobs_scanned} queued or running jobs read")]
    for g in doc.generations:
        u = g.uses
        refs = ", ".join(u.references[:limit]) + (f" (+{len(u.references) - limit} more)"
                                                  if len(u.references) > limit else "")
        out += [f"  {g.sha}  {g.launcher or '-'}",
                f"      uses: {u.count}" + (f", first {u.first}, last {u.last}" if u.count else "")
                + (f" ({u.folded} folded, without references)" if u.folded else ""),
                f"      references: {refs or '-'}",
                "      jobs now: " + (", ".join(f"{j.id} ({j.state}, {j.user})" for j in g.jobs) or "-")]
    return [safe_text(line) for line in out]
