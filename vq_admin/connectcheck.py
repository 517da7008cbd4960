"""``vq admin check --connect``: can every configured host be reached, and
does its helper answer?

For each host (in configuration order; ``excluded`` hosts are listed, not
contacted) one call through the host's transport (one ssh round trip, no
shared connection) runs ``AGENT version`` — with ``--sinfo`` when a profile
of the host builds in an allocation, so the same round trip asks Slurm
whether it answers.  The hosts are probed in parallel threads, each bounded
by the timeout.  A host is ``ok`` when the agent printed its version object
and, where asked, ``sinfo`` answered and listed nodes; otherwise ``failed``
with the reason: the ssh error, the agent not found (exit 127), an answer
that is not the agent's, or the ``sinfo`` error.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .agent import protocol
from .config import Config, HostConfig
from .output import safe_text
from .transport import SSH_TRANSPORT_EXIT, Session, Transport

DEFAULT_TIMEOUT = 30.0
MAX_THREADS = 16
SCHEMA = "vq-admin/check-connect/1"


@dataclass
class Probe:
    """What one host answered."""

    host: str
    fleet_role: str
    where: str
    argv: list[str]
    status: str = "failed"  # ok | failed | skipped
    reason: str | None = None
    seconds: float = 0.0
    agent: dict[str, Any] = field(default_factory=dict)
    sinfo: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fleet_role": self.fleet_role, "where": self.where, "argv": self.argv, "status": self.status,
                "reason": self.reason, "seconds": round(self.seconds, 3), "agent": self.agent or None,
                "sinfo": self.sinfo}


def wants_sinfo(host: HostConfig) -> bool:
    return any(p.update_allocation is not None for p in host.runtimes.values())


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no message)"


def probe(host: HostConfig, transport: Transport, timeout: float) -> Probe:
    argv = protocol.version(host.agent, sinfo=wants_sinfo(host))
    found = Probe(host.name, host.fleet_role, transport.where, argv)
    result = transport.run(argv, timeout=timeout)
    found.seconds = result.seconds
    out = result.stdout.decode("utf-8", "replace")
    err = result.stderr.decode("utf-8", "replace")
    if result.interrupted == "timeout":
        found.reason = f"no answer within {timeout:g} s"
        return found
    if result.interrupted == "transport" or (transport.transport_exit is not None
                                             and result.exit_code == SSH_TRANSPORT_EXIT):
        found.reason = f"ssh to {transport.where} failed (exit 255): {_last_line(err)}"
        return found
    if result.exit_code == 127:
        found.reason = f"agent {host.agent[0]} not found on {transport.where}: {_last_line(err)}"
        return found
    if result.exit_code != 0:
        found.reason = f"agent exited {result.exit_code}: {_last_line(err)}"
        return found
    try:
        answer = protocol.parse_version(out)
    except protocol.ProtocolError:
        answer = None
    if answer is None:
        found.reason = (f"the answer is not vq-admin-agent's version object (an older agent without the "
                        f"'version' verb, or another program): {_last_line(out or err)}")
        return found
    found.agent = answer.facts()
    if protocol.SINFO in argv:
        found.sinfo = answer.sinfo if answer.sinfo is not None else {"error": "not reported"}
        if found.sinfo.get("error"):
            found.reason = f"sinfo: {_last_line(str(found.sinfo['error']))}"
            return found
    found.status = "ok"
    return found


def run_all(config: Config, timeout: float = DEFAULT_TIMEOUT) -> list[Probe]:
    """Probe every configured host in parallel; results in configuration order."""
    session = Session(config.ssh_config, share_connections=False)
    jobs: list[tuple[HostConfig, Any]] = []
    results: list[Probe] = []
    try:
        contacted = [h for h in config.hosts.values() if h.fleet_role != "excluded"]
        with ThreadPoolExecutor(max_workers=max(1, min(MAX_THREADS, len(contacted)))) as pool:
            for host in config.hosts.values():
                if host.fleet_role == "excluded":
                    jobs.append((host, None))
                    continue
                transport = session.for_host(host.transport, host.ssh)
                jobs.append((host, pool.submit(probe, host, transport, timeout)))
            for host, future in jobs:
                if future is None:
                    results.append(Probe(host.name, host.fleet_role, host.ssh or host.name, [], "skipped",
                                         "fleet_role = \"excluded\": never contacted"))
                else:
                    try:
                        results.append(future.result())
                    except Exception as exc:  # a probe must never take the others down
                        results.append(Probe(host.name, host.fleet_role, host.ssh or host.name, [], "failed",
                                             f"internal error: {type(exc).__name__}: {exc}"))
    finally:
        session.close()
    return results


def document(config: Config, probes: list[Probe]) -> dict[str, Any]:
    failed = [p.host for p in probes if p.status == "failed"]
    return {"config": config.path, "valid": True, "reachable": not failed,
            "failed": failed, "hosts": {p.host: p.to_dict() for p in probes}}


def table(probes: list[Probe]) -> list[str]:
    """One row per host: HOST ROLE WHERE STATUS AGENT PYTHON SINFO SECONDS, then the reasons."""
    rows = [("HOST", "ROLE", "WHERE", "STATUS", "AGENT", "PYTHON", "SINFO", "SECONDS")]
    for p in probes:
        if p.sinfo is None:
            sinfo = "-"
        elif p.sinfo.get("error"):
            sinfo = "failed"
        else:
            sinfo = ",".join(f"{n} {s}" for s, n in sorted((p.sinfo.get("states") or {}).items()))
        rows.append((p.host, p.fleet_role, p.where, p.status, str(p.agent.get("version") or "-"),
                     str(p.agent.get("python_version") or "-"), sinfo,
                     f"{p.seconds:.1f}" if p.status != "skipped" else "-"))
    widths = [max(len(safe_text(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(safe_text(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for p in probes:
        if p.reason and p.status != "ok":
            lines.append(f"{p.host}: {safe_text(p.reason)}")
    return lines
