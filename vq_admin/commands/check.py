"""``vq admin check``: validate the configuration and load the providers it
names, running nothing anywhere.  Each profile's provider is asked for its
verify and update commands, so a provider that cannot answer for a profile
is reported here rather than at 3 a.m.
"""

from __future__ import annotations

import argparse

from vq_admin_hookspecs import RuntimeRequest

from ..config import load_config
from ..output import print_json
from ..plugins import Providers

PROBE_SHA = "0" * 40


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
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
    document = {"schema": "vq-admin/check/1", "config": config.path, "valid": True,
                "providers": sorted(providers.info), "hosts": hosts}
    if args.json:
        print_json(document)
    else:
        print(f"{config.path}: valid; {len(hosts)} hosts, providers: {', '.join(sorted(providers.info))}")
    return 0
