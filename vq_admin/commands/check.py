"""``vq admin check``: validate the configuration and load the providers it
names, running nothing anywhere (with ``--connect``: then reach every login
and build host it uses, see :mod:`vq_admin.ssh.connect_check`).  Each profile's
provider is asked for its verify and update commands, so a provider that
cannot answer for a profile is reported here rather than at 3 a.m.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from vq_admin_hookspecs import RuntimeRequest

from ..config import Config, authority, load_config
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome, UsageError
from ..plugins import Providers

PROBE_SHA = "0" * 40


def run(args: argparse.Namespace) -> int:
    if not args.connect:
        if args.timeout is not None:
            raise UsageError("--timeout applies only with --connect")
        if args.hosts:
            raise UsageError("HOST applies only with --connect (without it, the whole configuration is checked)")
    config = load_config(args.config)  # an ssh_config that is missing, not a file or not trusted is refused there
    if config.ssh_config and not os.access(config.ssh_config, os.R_OK):
        raise UsageError(f"ssh_config: {config.ssh_config} is not readable by this user")
    from ..ssh import effective

    for host in config.hosts.values():  # what ssh would load for each destination (77 naming option and path)
        if host.transport == "ssh":
            effective.check(config.ssh_config, host.ssh)
    providers = Providers.load(config.provider_names())
    hosts = {}
    for name, host in config.hosts.items():
        profiles = {}
        for program, profile in host.runtimes.items():
            request = RuntimeRequest(program=program, host=name, expected_sha=PROBE_SHA, tag=None,
                                     settings=profile.settings())
            providers.runtime_verify(profile.provider, request)
            providers.runtime_update(profile.provider, request)
            profiles[program] = {"provider": profile.provider, "build_place": profile.build_place}
        hosts[name] = {"fleet_role": host.fleet_role, "transport": host.transport, "runtimes": profiles}
    if args.connect:
        return _connect(args, config)
    document = {"config": config.path, "valid": True, "providers": sorted(providers.info), "hosts": hosts}
    if args.json:
        emit(SCHEMAS["check"], Outcome.OK, document)
    else:
        count = f"{len(hosts)} host" + ("" if len(hosts) == 1 else "s")
        print(f"{config.path}: valid; {count}, providers: {', '.join(sorted(providers.info))}")
    return 0


def _connect(args: argparse.Namespace, config: Config) -> int:
    """``--connect``: one round trip per host, in parallel; exit 0 when all answered, else 1."""
    from ..ssh import connect_check

    timeout = args.timeout if args.timeout is not None else connect_check.DEFAULT_TIMEOUT
    if not (timeout > 0 and math.isfinite(timeout)):
        raise UsageError(f"--timeout must be a finite positive number of seconds, not {timeout:g}")
    for name in args.hosts:
        authority.lookup(config, name)  # a host not in the configuration: a usage error naming those that are
    probes = connect_check.run_all(config, timeout, args.hosts)
    document = connect_check.document(config, probes)
    outcome = Outcome.FAILED if document.failed else Outcome.OK
    if args.json:
        failed = [f"{p.host}: {p.reason or 'failed'}" for p in probes if p.status == "failed"]
        emit(SCHEMAS["check-connect"], outcome, document.to_value(), failed)
    else:
        stream = sys.stdout if outcome is Outcome.OK else sys.stderr
        for line in connect_check.table(probes):
            print(line, file=stream)
    return outcome.exit_code
