"""Who may maintain what: fleet roles from the external configuration.

The runtime lane needs ``fleet_role = "managed"``; the helper lane needs
``managed`` or ``helper-only``.  Nothing on the command line widens this
(``--force`` included): a refusal is exit 77 naming the role, and for an
alias the canonical host to use instead.
"""

from __future__ import annotations

from . import Config, HostConfig, RuntimeProfile, did_you_mean
from ..report.outcome import Refused, UsageError

RUNTIME_ROLES = ("managed",)
HELPER_ROLES = ("managed", "helper-only")


def lookup(config: Config, host: str, program: str | None = None) -> HostConfig:
    """Host *host* of the configuration; one that is not there is a usage error naming the hosts, the one
    closest to a typo, and, when *program* (the word given as PROGRAM) is a host and *host* a program, the
    order of the words."""
    try:
        return config.hosts[host]
    except KeyError:
        known = ", ".join(sorted(config.hosts)) or "none"
        hint = did_you_mean(host, config.hosts)
        if program in config.hosts and any(host in h.runtimes for h in config.hosts.values()):
            hint = f"; {host!r} is a program and {program!r} a host: the order is PROGRAM HOST ({program} last)"
        raise UsageError(f"host {host!r} is not in the configuration {config.path} (hosts: {known}){hint}") from None


def with_role(config: Config, name: str, lane: str, roles: tuple[str, ...],
              instead: str = "run the update against") -> HostConfig:
    """Host *name*, refused unless its fleet_role is one of *roles*; an alias names its canonical host
    (``<instead> <canonical host>``)."""
    host = lookup(config, name)
    if host.fleet_role not in roles:
        message = f"host {host.name} has fleet_role {host.fleet_role!r}, which has no {lane} maintenance authority"
        if host.fleet_role == "alias":
            message += f"; it is an alias of {host.canonical_host}: {instead} {host.canonical_host}"
        raise Refused(message)
    return host


def runtime_host(config: Config, name: str) -> HostConfig:
    return with_role(config, name, "runtime", RUNTIME_ROLES)


def helper_host(config: Config, name: str) -> HostConfig:
    return with_role(config, name, "helper", HELPER_ROLES)


def runtime_profile(config: Config, host_name: str, program: str,
                    canonical: bool = False) -> tuple[HostConfig, RuntimeProfile]:
    """The host (with runtime authority, :func:`runtime_host`) and its profile of *program*; a
    program the host has no profile for is a usage error naming the profiles it has.  *canonical*: an
    alias stands for its canonical host (the commands that read or mark what a host runs)."""
    host = lookup(config, host_name, program)  # PROGRAM and HOST swapped: say so before anything else
    if canonical and host.fleet_role == "alias":
        host = lookup(config, host.canonical_host or "")
    host = runtime_host(config, host.name)
    return host, profile_of(host, program)


def profile_of(host: HostConfig, program: str) -> RuntimeProfile:
    """*host*'s profile of *program*; none is a usage error naming the profiles it has."""
    profile = host.runtimes.get(program)
    if profile is None:
        known = ", ".join(sorted(host.runtimes)) or "none"
        raise UsageError(f"host {host.name} has no scheduler_runtime_deployments.{program} profile "
                         f"(profiles: {known}){did_you_mean(program, host.runtimes)}")
    return profile
