"""``vq admin check --connect``: can every host the configuration would use be
reached, and does the agent answer there?

The hosts are the login hosts (in configuration order; ``excluded`` hosts and
aliases are listed, not contacted: an alias is reached as its canonical host)
and the build hosts (``update_host`` of a managed host's profiles,
``helper_update_host``), each destination once.  A mirror
(``feed_source_mirror``) lives on its login host, so that row covers it.
Each gets one call through its transport (one ssh round trip, no shared
connection) that runs ``AGENT version`` (the agent of the host that names it)
— with ``--sinfo`` when a profile of a login host builds in an allocation, so
the same round trip asks Slurm whether it answers, and ``--root`` for each
``scratch_root`` a run would use there (a login host's own; on a build host,
that of each login host naming it), which the agent checks as a run would
(exists, trusted, usable: :func:`vq_admin.core.safedirs.scratch_problem`).
The hosts are probed in parallel threads, each bounded by the timeout.  A
host is ``ok`` when the agent printed its version object, every scratch root
passed and, where asked, ``sinfo`` answered and listed nodes; otherwise
``failed`` with the reason: the ssh error, the agent not found (exit 127), an
answer that is not the agent's, the scratch root's problem and its fix, or
the ``sinfo`` error.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Sequence

from msgspec import UNSET, UnsetType

from ..core import protocol
from ..config import Config
from ..document import Document, DocumentError
from ..report.output import safe_text
from .transport import Session, Transport

DEFAULT_TIMEOUT = 30.0
MAX_THREADS = 16
SCHEMA = "vq-admin/check-connect/1"


class ScratchCheck(Document, frozen=True, kw_only=True):
    """One scratch root as the agent's ``version --root`` found it: ``problem`` (with its fix) or ``None``."""

    root: str
    problem: str | None


class Sinfo(Document, frozen=True, kw_only=True):
    """``sinfo -h -o %t`` as the agent ran it: node states and their counts, or why it failed."""

    argv: list[str] | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    states: dict[str, int] | UnsetType = UNSET
    error: str | None = None


class AgentFacts(Document, frozen=True, kw_only=True):
    """A probe's ``agent``: the members of the agent's ``version`` answer (``protocol.VersionAnswer``)."""

    version: str
    python_version: str | None = None
    interpreter: str | None = None
    checksum: str | None = None


class VersionFacts(AgentFacts, frozen=True, kw_only=True):
    """The agent's ``version`` answer (the connect-check answer): :class:`AgentFacts` and, when asked,
    ``sinfo`` and each scratch root as a run would find it."""

    sinfo: Sinfo | UnsetType = UNSET
    scratch: list[ScratchCheck] | UnsetType = UNSET


class ProbeDocument(Document, frozen=True, kw_only=True):
    """One host of the check-connect document (``hosts.HOST``, ``build_hosts.DESTINATION``)."""

    fleet_role: str
    where: str
    argv: list[str]
    status: str
    reason: str | None
    seconds: float
    agent: AgentFacts | None
    sinfo: Sinfo | None
    scratch: list[ScratchCheck]
    used_by: list[str]


class ConnectDocument(Document, frozen=True, kw_only=True):
    """``vq admin check --connect --json``'s data."""

    config: str | None
    valid: bool
    reachable: bool
    failed: list[str]
    hosts: dict[str, ProbeDocument]
    build_hosts: dict[str, ProbeDocument]


@dataclass
class Probe:
    """What one host answered."""

    host: str
    fleet_role: str  # the host's, or "build" for a build host
    where: str
    argv: list[str]
    status: str = "failed"  # ok | failed | skipped
    reason: str | None = None
    seconds: float = 0.0
    agent: AgentFacts | None = None
    sinfo: Sinfo | None = None
    scratch: list[ScratchCheck] = field(default_factory=list)
    #: What else the configuration uses this host for (a build host: the keys that name it; a login host: mirrors).
    used_by: list[str] = field(default_factory=list)

    def document(self) -> ProbeDocument:
        return ProbeDocument(fleet_role=self.fleet_role, where=self.where, argv=self.argv, status=self.status,
                             reason=self.reason, seconds=round(self.seconds, 3), agent=self.agent, sinfo=self.sinfo,
                             scratch=self.scratch, used_by=self.used_by)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no message)"


def probe(found: Probe, transport: Transport, timeout: float) -> None:
    found.reason = _problem(found, transport, timeout)
    found.status = "ok" if found.reason is None else found.status


def _problem(found: Probe, transport: Transport, timeout: float) -> str | None:
    """Why *found*'s host does not pass (its agent's answer is recorded on *found* as far as it got)."""
    argv = found.argv
    result = transport.run(argv, timeout=timeout)
    found.seconds = result.seconds
    out, err = result.stdout.decode("utf-8", "replace"), result.stderr.decode("utf-8", "replace")
    if result.interrupted == "timeout":
        return f"no answer within {timeout:g} s"
    if result.interrupted == "transport":  # (ssh's own exit 255 is one: Transport.run classifies it)
        return f"ssh to {transport.where} failed (exit 255): {_last_line(err)}"
    if result.exit_code != 0:
        return (f"agent {argv[0]} not found on {transport.where}: {_last_line(err)}" if result.exit_code == 127
                else f"agent exited {result.exit_code}: {_last_line(err)}")
    try:
        answer = VersionFacts.from_value(protocol.parse_version(out), "the agent's version answer")
    except protocol.ProtocolError:
        return ("the answer is not vq-admin-agent's version object (an older agent without the "
                f"'version' verb, or another program): {_last_line(out or err)}")
    except DocumentError as exc:
        return str(exc)
    found.agent = AgentFacts(version=answer.version, python_version=answer.python_version,
                             interpreter=answer.interpreter, checksum=answer.checksum)
    return _answer_problem(found, answer)


def _answer_problem(found: Probe, answer: VersionFacts) -> str | None:
    """What the agent's version answer says is wrong: a scratch root, or ``sinfo`` (when asked)."""
    argv = found.argv
    found.scratch = answer.scratch or []  # (no --root given: the agent checks none, and none are asked)
    asked = [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == protocol.ROOT]
    if [check.root for check in found.scratch] != asked:
        return (f"the agent did not check the scratch roots it was given ({', '.join(asked)}): "
                "an older agent? update the helper (vq admin update HOST)")
    problems = [check.problem for check in found.scratch if check.problem]
    if problems:
        return "; ".join(problems)
    if protocol.SINFO in argv:
        found.sinfo = answer.sinfo or Sinfo(error="not reported")
        if found.sinfo.error:
            return f"sinfo: {_last_line(found.sinfo.error)}"
    return None


def probes(config: Config, session: Session, only: Sequence[str] = ()) -> list[tuple[Probe, Transport | None]]:
    """What ``--connect`` reaches, in configuration order, each with its transport (``None``: skipped):
    every login host (those named in *only*, when given), then each build host destination they name once
    (running the agent of the host naming it)."""
    rows: list[tuple[Probe, Transport | None]] = []
    builds: dict[str, tuple[Probe, Transport]] = {}
    roots: dict[str, dict[str, None]] = {}  # each build destination's scratch roots (of the login hosts naming it)
    for host in config.hosts.values():
        if only and host.name not in only:
            continue
        if host.fleet_role in ("excluded", "alias"):
            why = ("fleet_role = \"excluded\": never contacted" if host.fleet_role == "excluded"
                   else f"alias of {host.canonical_host}: reached as {host.canonical_host}, never under this name")
            rows.append((Probe(host.name, host.fleet_role, host.ssh, [], "skipped", why), None))
            continue
        managed = host.runtimes if host.fleet_role == "managed" else {}
        mirrors = [f"feed_source_mirror of {program}" for program, p in managed.items() if p.feed_source_mirror]
        scratch = [host.scratch_root] if host.scratch_root else []
        sinfo = any(p.update_allocation is not None for p in host.runtimes.values())
        argv = protocol.version(host.agent, sinfo=sinfo, roots=scratch)
        rows.append((Probe(host.name, host.fleet_role, host.ssh, argv, used_by=mirrors),
                     session.for_host(host.transport, host.ssh)))
        uses = [(host.helper_update_host, f"helper_update_host of {host.name}")]
        uses += [(p.update_host, f"update_host of {host.name}/{program}") for program, p in managed.items()]
        for destination, use in uses:
            if destination:
                found = builds.setdefault(destination, (Probe(destination, "build", destination,
                                                              list(host.agent)), session.ssh(destination)))
                found[0].used_by.append(use)
                roots.setdefault(destination, {}).update(dict.fromkeys(scratch))  # each root once, in order
    for destination, (build, _) in builds.items():  # the agent of the first host naming it, every root
        build.argv = protocol.version(build.argv, roots=list(roots[destination]))
    return rows + list(builds.values())


def run_all(config: Config, timeout: float = DEFAULT_TIMEOUT, only: Sequence[str] = ()) -> list[Probe]:
    """Probe every host the configuration uses (:func:`probes`; those of *only*) in parallel; results in that
    order."""
    with Session(config.ssh_config, share_connections=False) as session:
        planned = probes(config, session, only)
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(planned)))) as pool:
            jobs = [(found, pool.submit(probe, found, transport, timeout) if transport else None)
                    for found, transport in planned]
        for found, job in jobs:
            try:
                if job is not None:
                    job.result()
            except Exception as exc:  # a probe must never take the others down
                found.status, found.reason = "failed", f"internal error: {type(exc).__name__}: {exc}"
    return [found for found, _ in planned]


def document(config: Config, probes: list[Probe]) -> ConnectDocument:
    failed = [p.host for p in probes if p.status == "failed"]
    return ConnectDocument(config=config.path, valid=True, reachable=not failed, failed=failed,
                           hosts={p.host: p.document() for p in probes if p.fleet_role != "build"},
                           build_hosts={p.host: p.document() for p in probes if p.fleet_role == "build"})


def table(probes: list[Probe]) -> list[str]:
    """One line per host: HOST ROLE WHERE STATUS AGENT PYTHON SINFO SECONDS DETAIL (the reason it failed
    or was skipped; else what else uses it)."""
    rows = [("HOST", "ROLE", "WHERE", "STATUS", "AGENT", "PYTHON", "SINFO", "SECONDS", "DETAIL")]
    for p in probes:
        if p.sinfo is None:
            sinfo = "-"
        elif p.sinfo.error:
            sinfo = "failed"
        else:
            sinfo = ",".join(f"{n} {s}" for s, n in sorted((p.sinfo.states or {}).items()))
        detail = p.reason or ", ".join(p.used_by) or "-"  # (a probe is ok exactly when it has no reason)
        agent = p.agent or AgentFacts(version="-")
        rows.append((p.host, p.fleet_role, p.where, p.status, agent.version, agent.python_version or "-", sinfo,
                     f"{p.seconds:.1f}" if p.status != "skipped" else "-", detail))
    widths = [max(len(safe_text(r[i])) for r in rows) for i in range(len(rows[0]) - 1)]
    return [("  ".join(safe_text(c).ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + safe_text(r[-1]))
            .rstrip() for r in rows]
