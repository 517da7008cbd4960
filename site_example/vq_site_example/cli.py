"""The ``vq-site-example`` command: ``deploy``, ``install``, ``verify``, ``activate`` and ``prune``.

Installed as our own script (``site_example/bin/vq-site-example``, ``scripts`` in
setup.cfg), not a generated console-script wrapper, which imports ``re`` first;
``python -m vq_site_example.cli`` runs the same :func:`main`.

Runs on the build host (deploy/install) and the scheduler login host
(verify); standard library only.  Exit codes are those of
:mod:`vq_site_example.errors`: 0 ok, 1 failed, 2 usage, 3 identity
mismatch, 75 deploy lock held.
"""

from __future__ import annotations

import sys

from .errors import EXIT_FAILED, SiteError, failed

TYPE_CHECKING = False  # not typing's: verify, run for every update, loads only what it needs
if TYPE_CHECKING:
    from typing import Sequence


def _terminate(signum: int, _frame: object) -> None:
    """Turn SIGTERM/SIGHUP (Slurm time limit, lost session) into a failure, so
    cleanup runs: this run's partial directory and pid file are removed and
    ``current`` is left as it was."""
    raise failed(f"terminated by signal {signum}; current unchanged unless the switch had completed")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns (and, as the command, exits with) its code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["prune"]:  # retention: vq_site_example.retention
            from . import retention

            return retention.run(argv[1:])
        if argv[:1] == ["verify"]:  # read-only, run for every update: only what it needs is imported
            from . import verify

            plain = verify.parse(argv[1:])  # its few options, without argparse, when plainly well-formed
            if plain is not None:
                return verify.run(plain)
        from . import args

        ns = args.parse(argv)  # the whole grammar, and every usage error
        if ns.verb == "verify":
            from . import verify

            return verify.run(ns)
        if ns.verb == "activate":
            from . import activate

            return activate.run(ns)
        import signal

        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _terminate)
        from . import deploy

        return deploy.run(ns)
    except SiteError as exc:
        print(f"vq-site-example: error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("vq-site-example: error: interrupted", file=sys.stderr)
        return EXIT_FAILED
    except Exception:  # an unforeseen failure is a failed step, with its evidence
        import traceback

        traceback.print_exc()
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
