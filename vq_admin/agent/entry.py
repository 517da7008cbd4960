"""The ``vq-admin-agent`` console script.

``verify-readback`` (what every runtime update's verify runs: the read-only
verify plus the launcher read-back, see :mod:`.verify_readback`) is served
before the full verb table (:mod:`.cli`: argparse, tarfile, the allocation and
staging modules) is imported, so the remote start of an already-current run
stays close to a bare interpreter.  Every other verb goes to :func:`.cli.main`.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify-readback"]:
        from .verify_readback import main as verify_readback

        return verify_readback(argv[1:])
    if argv[:1] == ["session"]:  # a run's first call: probe, lease, check-paths and verify in one start
        from .session import main as session

        return session(argv[1:])
    from .cli import main as full

    return full(argv)


if __name__ == "__main__":
    sys.exit(main())
