"""The ``vq-site-example`` command: its grammar (CONTRACT section 4 argv shape) and its verbs.

::

    vq-site-example deploy   --root ROOT [--jobs N] [--note TEXT] --program P --expected-sha SHA [--tag T]
                             --source-archive PATH
    vq-site-example install  (as deploy; creates ROOT when missing)
    vq-site-example verify   --root ROOT --program P --expected-sha SHA [--tag T]
    vq-site-example activate --root ROOT --program P --expected-sha SHA [--tag T]
    vq-site-example prune    --root ROOT --program P (--keep SHA... | --referenced-file CENSUS) [--dry-run]

``--jobs`` and ``--note`` are the only accepted ``--update-script-arg`` values; anything
else is a usage error (exit 2).  No option may be given twice and abbreviations are not
accepted, so an ``--update-script-arg`` can never override ``--program`` or ``--expected-sha``.
Program names, SHAs and tags follow the rules of ``vq_admin_hookspecs`` (one home each).

Exit codes are those of :mod:`vq_site_example.errors`: 0 ok, 1 failed, 2 usage,
3 identity mismatch, 75 deploy lock held.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys

from vq_admin_identifiers import FULL_SHA_RE, NAME_RE, TAG_RE

from .errors import EXIT_FAILED, SiteError, failed, usage

TYPE_CHECKING = False  # not typing's: verify, on every update, imports no more than it needs
if TYPE_CHECKING:
    from typing import Callable, NoReturn, Sequence

#: ``--note`` text: one printable line.
NOTE_RE = re.compile(r"\A[^\x00-\x1f\x7f]{1,200}\Z")
#: Upper bound for ``--jobs``.
MAX_JOBS = 4096


def _checked(rule: re.Pattern[str], what: str) -> Callable[[str], str]:
    """An argparse type: the value when *rule* matches it, else a usage error naming *what*."""
    def check(value: str) -> str:
        if not rule.match(value):
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}")
        return value
    return check


program_name = _checked(NAME_RE, "a program name ([A-Za-z0-9][A-Za-z0-9._-]{0,63})")
tag_name = _checked(TAG_RE, "an accepted tag (a git tag name of letters, digits and ._/+-)")
note = _checked(NOTE_RE, "a --note: one printable line of 1 to 200 characters")


def full_sha(value: str) -> str:
    """argparse type: a full SHA, returned lower case."""
    if not FULL_SHA_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a full git object name: it must be exactly 40 or 64 "
                                         "hex digits (no abbreviations, no ref names)")
    return value.lower()


def abs_path(value: str) -> str:
    """argparse type: an absolute path, normalised (no trailing slash)."""
    if not value.startswith("/") or "\0" in value:
        raise argparse.ArgumentTypeError(f"{value!r} must be an absolute path")
    return os.path.normpath(value)


def jobs(value: str) -> int:
    """argparse type: ``--jobs N``, 1..MAX_JOBS."""
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"--jobs {value!r} must be an integer from 1 to {MAX_JOBS}")
    return int(value)


class _Once(argparse.Action):
    """Store an option's value, refusing a second occurrence."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if getattr(namespace, f"_seen_{self.dest}", False):
            parser.error(f"{option_string} given more than once")
        setattr(namespace, f"_seen_{self.dest}", True)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become :class:`~.errors.SiteError` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise usage(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The whole ``vq-site-example`` grammar."""
    parser = Parser(prog="vq-site-example", allow_abbrev=False,
                     description="Build, activate, verify and prune immutable per-SHA runtime releases.")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)
    texts = {"deploy": "build, validate and activate a release (ROOT must exist)",
             "install": "first-time deploy: create the ROOT layout if missing",
             "activate": "switch current to an existing validated release; builds nothing",
             "verify": "read-only: print the verify receipt of the active release",
             "prune": "remove releases that are not current, not kept and not referenced",
             "confirm": "inside a batch job: run a small computation through --launcher and print its metrics"}
    for verb, text in texts.items():
        sub = verbs.add_parser(verb, help=text, description=text, allow_abbrev=False)
        if verb == "confirm":
            sub.add_argument("--program", required=True, type=program_name, action=_Once)
            sub.add_argument("--expected-sha", required=True, type=full_sha, action=_Once)
            sub.add_argument("--launcher", required=True, type=abs_path, action=_Once,
                             help="the generation's immutable launcher, as vq-admin read it back")
            continue
        sub.add_argument("--root", required=True, type=abs_path, action=_Once,
                         help="absolute runtime root (holds releases/ and current)")
        sub.add_argument("--program", required=True, type=program_name, action=_Once)
        if verb == "prune":
            sub.add_argument("--keep", type=full_sha, action="append", default=[], metavar="SHA",
                             help="the keep set computed by 'vq admin prune' (repeatable)")
            sub.add_argument("--referenced-file", metavar="CENSUS",
                             help="output of 'vq admin references PROGRAM HOST --json'")
            sub.add_argument("--keep-sha", type=full_sha, action="append", default=[], metavar="SHA")
            sub.add_argument("--max-age", type=float, default=900.0, metavar="SECONDS",
                             help="refuse a census older than this (default 900)")
            sub.add_argument("--dry-run", action="store_true", help="report what would be removed; remove nothing")
            continue
        sub.add_argument("--expected-sha", required=True, type=full_sha, action=_Once,
                         help="full 40- or 64-digit commit id")
        sub.add_argument("--tag", type=tag_name, default=None, action=_Once)
        if verb in ("deploy", "install"):
            sub.add_argument("--source-archive", type=abs_path, default=None, action=_Once,
                             help="the staged source.tar (git archive of the commit)")
            sub.add_argument("--jobs", type=jobs, default=None, action=_Once,
                             help="site arg: build parallelism, exported as VQ_BUILD_JOBS")
            sub.add_argument("--note", type=note, default=None, action=_Once,
                             help="site arg: free text recorded in the release's BUILD-LOG")
    return parser


#: ``verify``'s options, each value's attribute and check (the parser's own, above).
_VERIFY = {"--root": ("root", abs_path), "--program": ("program", program_name),
           "--expected-sha": ("expected_sha", full_sha), "--tag": ("tag", tag_name)}


def plain_verify(words: list[str]) -> argparse.Namespace | None:
    """``verify`` *words* as vq-admin builds them on every update, without building the whole grammar
    (about 10 ms: docs/performance.md): each option once, with a well-formed value, ``--tag``
    optional; ``None`` for anything else, which the full parser then reads and reports."""
    if words[:1] != ["verify"] or len(words) % 2 == 0:
        return None
    values: dict[str, str | None] = {"verb": "verify", "tag": None}
    seen: set[str] = set()
    for option, value in zip(words[1::2], words[2::2], strict=True):
        if option not in _VERIFY or option in seen:
            return None
        seen.add(option)
        dest, check = _VERIFY[option]
        try:
            values[dest] = check(value)
        except argparse.ArgumentTypeError:
            return None
    return argparse.Namespace(**values) if len(seen - {"--tag"}) == 3 else None


def terminate(signum: int, _frame: object) -> None:
    """SIGTERM/SIGHUP (Slurm time limit, lost session) become a failure, so cleanup runs: this
    run's partial directory and pid file are removed and ``current`` is left as it was."""
    raise failed(f"terminated by signal {signum}; current unchanged unless the switch had completed")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns (and, as the command, exits with) its code."""
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        ns = plain_verify(words) or build_parser().parse_args(words)
        if ns.verb == "confirm":  # inside the confirmation job: read-only
            from . import confirm

            return confirm.run(ns)
        if ns.verb == "verify":  # read-only, on every update: it loads only its own module
            from . import verify

            return verify.run(ns)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, terminate)
        if ns.verb == "prune":
            from . import retention

            return retention.run(ns)
        from . import deploy

        return deploy.activate(ns) if ns.verb == "activate" else deploy.run(ns)
    except SiteError as exc:
        print(f"vq-site-example: error: {exc}", file=sys.stderr)
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
