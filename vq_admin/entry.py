"""The ``vq`` and ``vq-admin`` console scripts.

``vq admin launcher ...`` (``vq-admin launcher ...``) is what the queue driver
runs for every job, so it is served before anything heavy is imported: its
few options are parsed here by hand (standard library ``os`` and ``sys``; the
verb itself reads a small JSON registry entry through
:mod:`vq_admin.bindings`), and argparse, typing and the rest of the command
line are never loaded.  Its plain, successful case (no ``--pin``, ``--path``,
``--check-on-host`` or ``--json``) is answered by :mod:`vq_admin.launcher.plain_lookup`
without ``re``, ``json`` or ``enum``; everything else runs the verb.
Anything this parser does not take as plainly well-formed (``--help``, an
abbreviated or unknown option, a value that looks like an option, a wrong
number of operands) goes to the full parser in
:mod:`vq_admin.cli`, which then behaves, and words its usage errors, exactly as
for every other verb.  Every other verb goes there directly, ``update``
after :func:`vq_admin.ssh.early_start.start` read the configuration and started
the first ssh process of a plainly usual ``update PROGRAM HOST --expected-sha
SHA`` (cron's already-current run), before argparse and the rest are imported;
the full command line is handed what it started.
"""

from __future__ import annotations

import os
import sys
TYPE_CHECKING = False  # not typing's: the launcher path (vq admin launcher, per job) never imports typing
if TYPE_CHECKING:
    from typing import Callable, TypeVar

    from .core.plainargs import LauncherArgs
    from .ssh.early_start import EarlyStart
    _T = TypeVar("_T")

#: ``vq admin launcher`` options that take a value, and the attribute each sets.
_VALUED = {"--expected-sha": "expected_sha", "--path": "path", "--pin": "pin", "--config": "config",
           "--state-dir": "state_dir", "--job": "job"}
#: ``vq admin launcher`` flags.
_FLAGS = {"--json": "json", "--check-on-host": "check_on_host"}


def parse_launcher(words: list[str]) -> LauncherArgs | None:
    """*words* after ``launcher``; ``None`` unless they are plainly well-formed (:mod:`vq_admin.core.plainargs`)."""
    from .core.plainargs import LauncherArgs, plain_words

    parsed = plain_words(words, _VALUED, _FLAGS)
    if parsed is None or len(parsed[0]) != 2:
        return None
    operands, values, flags = parsed
    return LauncherArgs(operands[0], operands[1], {**values, **{key: True for key in flags}})


def launcher(words: list[str], prog: str) -> int | None:
    """Run ``launcher`` with *words*; ``None`` when the full parser must take them."""
    args = parse_launcher(words)
    if args is None:
        return None
    try:
        if args.pin is None and args.path is None and not args.check_on_host and not args.json:
            from .launcher.plain_lookup import plain_launcher

            found = plain_launcher(args.program, args.host, args.expected_sha, args.state_dir, args.job)
            if found is not None:  # what the full command prints; anything else is decided by it
                sys.stdout.write(found + "\n")
                sys.stdout.flush()
                return 0
        from .commands.launcher import run
        from .report.outcome import VqAdminError

        try:
            return run(args)
        except VqAdminError as exc:
            from .cli import error_document
            from .report.output import print_json, safe_text

            if "--json" in words:
                print_json(error_document(args, exc))  # type: ignore[arg-type]
            print(f"{prog}: {exc.outcome.value}: {safe_text(exc.message)}", file=sys.stderr)
            return exc.outcome.exit_code
    except KeyboardInterrupt:
        from .core.exits import INTERRUPTED

        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED


#: The exit status when the reader of stdout went away (``vq admin status | head -1``):
#: 128 + SIGPIPE, what the shell reports for a program a closed pipe ends (``yes | head -1``).
EXIT_CLOSED_PIPE = 128 + 13


def guarded(call: Callable[[], _T]) -> _T | int:
    """``call()``, with stdout flushed here (not at interpreter exit), so a reader that closed
    the pipe ends the run quietly with :data:`EXIT_CLOSED_PIPE`: no traceback, no second error
    when Python flushes stdout at exit.  A run's receipt and admin-log line are stored before
    anything is printed, so the outcome is still on record."""
    try:
        try:
            return call()
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return EXIT_CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """The ``vq`` and ``vq-admin`` console scripts (and ``python -m vq_admin.cli``): ``launcher`` served
    here when it can be, everything else by the full command line (:func:`vq_admin.cli.run`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    invoked = os.path.basename(sys.argv[0]) if sys.argv else "vq-admin"
    prog = "vq-admin"
    if invoked == "vq":
        prog = "vq admin"
        if not argv or argv[0] != "admin":
            from .report.outcome import Outcome

            print("usage: vq admin VERB ... (this entry point only serves 'vq admin')", file=sys.stderr)
            return Outcome.USAGE.exit_code
        argv = argv[1:]
    if argv[:1] == ["launcher"]:  # per job: parsed by hand, without argparse
        code = guarded(lambda: launcher(argv[1:], prog))
        if code is not None:
            return code
    from . import interrupts

    interrupts.install()  # from here no signal ends the process by itself (vq_admin.interrupts)
    try:
        return _interruptible(prog, argv)
    except KeyboardInterrupt as exc:  # outside the full command line (which says it itself): 130
        from .report.envelope import SCHEMAS, document

        error = interrupts.early_error(exc)
        return interrupts.finish_early(prog, error, document(SCHEMAS["error"], error.outcome, None, [error.message])
                                       if "--json" in argv else None)
    finally:
        interrupts.finish()  # the answer is out: a signal now changes nothing


def _interruptible(prog: str, argv: list[str]) -> int:
    if argv[:1] == ["update"]:  # cron's already-current run: its one ssh process starts before argparse
        from .ssh.early_start import start

        early = start(argv[1:])
        try:
            return _full(prog, argv, early)
        finally:
            if early is not None:
                early.close()
    return _full(prog, argv)


def _full(prog: str, argv: list[str], early: EarlyStart | None = None) -> int:
    """The full command line (:func:`vq_admin.cli.run`), with argparse and every verb."""
    from .cli import run

    return guarded(lambda: run(prog, argv, early))  # --help and --version leave through SystemExit


if __name__ == "__main__":
    sys.exit(main())
