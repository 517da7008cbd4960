"""``vq admin provider install|test``: private provider maintenance.

* ``install``: :mod:`vq_admin.provider_install`;
* ``test``: the conformance kit, :mod:`vq_admin.conformance`.
"""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    if args.provider_verb == "install":
        from .. import provider_install

        return provider_install.run(args)
    from ..conformance import cli

    return cli.run(args)
