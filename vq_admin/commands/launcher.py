"""``vq admin launcher PROGRAM HOST [--expected-sha SHA] [--path PATH] [--pin PIN] [--check-on-host] [--job REF]
[--json]``.

Prints the verified immutable launcher (one line, or one JSON document), its use recorded
(:mod:`vq_admin.launcher.uses`, with REF under ``--job``), and exits 0, or exits 77 with the reason and the
remedy on stderr and no launcher
on stdout (with ``--json``: only the refusal document).  The queue driver
runs this for every job it submits and again at dispatch (``--pin``), so this
module imports :mod:`vq_admin.bindings` and nothing heavy: no argparse (the
console scripts parse this verb by hand, :mod:`vq_admin.entry`), no typing, no
configuration module, no provider, no pluggy, plumbum or filelock.
"""

from __future__ import annotations

import sys

from ..bindings import SCHEMA_LAUNCHER, LauncherRefused, check_pin, resolve_launcher
from ..report.outcome import Outcome, UsageError

TYPE_CHECKING = False  # not typing's: the launcher path (vq admin launcher, per job) never imports typing
if TYPE_CHECKING:
    import argparse

    from ..core.plainargs import LauncherArgs


def run(args: argparse.Namespace | LauncherArgs) -> int:
    """*args*: the parsed verb (an ``argparse.Namespace`` or :class:`vq_admin.core.plainargs.LauncherArgs`)."""
    if args.pin is not None and (args.expected_sha is not None or args.path is not None):
        raise UsageError("--pin carries its own SHA and launcher; do not combine it with --expected-sha or --path")
    try:
        if args.pin is not None:
            binding = check_pin(args.pin, program=args.program, host=args.host, state_dir=args.state_dir,
                                config_path=args.config, check_on_host=args.check_on_host, job=args.job)
        else:
            binding = resolve_launcher(args.program, args.host, expected_sha=args.expected_sha, path=args.path,
                                       state_dir=args.state_dir, config_path=args.config,
                                       check_on_host=args.check_on_host, job=args.job)
    except LauncherRefused as exc:
        from ..report.output import safe_text

        if args.json:
            from ..report.envelope import emit

            emit(SCHEMA_LAUNCHER, exc.outcome, {"program": args.program, "host": args.host,
                                                "expected_sha": args.expected_sha, "launcher": None,
                                                **exc.to_dict()}, [exc.reason])
        print(f"vq-admin: refused ({exc.code}): {safe_text(exc.reason)}", file=sys.stderr)
        print(f"  remedy: {safe_text(exc.remedy)}", file=sys.stderr, flush=True)
        return exc.outcome.exit_code
    if args.json:
        from ..report.envelope import emit

        emit(SCHEMA_LAUNCHER, Outcome.OK, {"requested_host": args.host, **binding.to_dict(), "pin": binding.pin()})
    else:
        sys.stdout.write(binding.launcher + "\n")
        sys.stdout.flush()
    return 0
