"""``activate``: switch ``current`` to an existing, validated release (rollback).

::

    vq-site-example activate --root ROOT --program P --expected-sha SHA [--tag T]

Builds nothing and never touches a release: under ``ROOT/.deploy.lock`` it
checks that ``releases/<SHA>`` is a real directory with a ``VALIDATED``
marker whose ``SOURCE-SHA``, ``PROGRAM`` and ``TAG`` match the request and
whose launcher still passes the release's own check, then replaces
``current`` atomically (a temporary link renamed over it,
:func:`~vq_site_example.layout.switch_current`).  Exit 1 when the release is
missing, incomplete or records something else; ``current`` is then unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import layout as lay
from .deploy import _reuse
from .errors import failed


def run(ns: argparse.Namespace) -> int:
    lyt = lay.Layout(ns.root)
    lay.check_layout(lyt, create=False)
    with lay.DeployLock(lyt):
        release = lyt.release(ns.expected_sha)
        if not os.path.lexists(release):
            raise failed(f"{release} does not exist; activation never builds: deploy {ns.expected_sha} instead")
        _reuse(lyt, ns)  # real directory, VALIDATED, SOURCE-SHA/PROGRAM/TAG equal, selftest passes
        previous = lay.read_current(lyt)
        lay.switch_current(lyt, ns.expected_sha)
    print(f"vq-site-example: current -> releases/{ns.expected_sha} (was {previous or 'absent'}); nothing built",
          file=sys.stderr)
    return 0
