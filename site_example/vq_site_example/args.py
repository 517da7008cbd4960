"""Command-line grammar of ``vq-site-example`` (CONTRACT section 4 argv shape).

::

    vq-site-example deploy  --root ROOT [--jobs N] [--note TEXT] --program P --expected-sha SHA [--tag T]
                            [--source-archive PATH]
    vq-site-example install --root ROOT [--jobs N] [--note TEXT] --program P --expected-sha SHA [--tag T]
                            [--source-archive PATH]
    vq-site-example verify  --root ROOT --program P --expected-sha SHA [--tag T]
    vq-site-example activate --root ROOT --program P --expected-sha SHA [--tag T]

``--jobs`` and ``--note`` are the only accepted ``--update-script-arg``
values; anything else is a usage error (exit 2).  No option may be given
twice and abbreviations are not accepted, so an ``--update-script-arg`` can
never override ``--program`` or ``--expected-sha``.
"""

from __future__ import annotations

import argparse
import os
import re

from .errors import usage
from .names import FULL_SHA_RE as FULL_SHA_RE  # re-exported: deploy, identity, retention and helper_update use it
from .names import NOTE_RE, PROGRAM_RE, TAG_RE

TYPE_CHECKING = False  # not typing's: nothing here needs it at run time
if TYPE_CHECKING:
    from typing import NoReturn, Sequence

#: Upper bound for ``--jobs``.
MAX_JOBS = 4096


def program_name(value: str) -> str:
    """argparse type: a program name."""
    if not PROGRAM_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a program name ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")
    return value


def full_sha(value: str) -> str:
    """argparse type: a full SHA, returned lower case."""
    if not FULL_SHA_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a full git object name: it must be exactly 40 or 64 hex "
            "digits (no abbreviations, no ref names)")
    return value.lower()


def tag_name(value: str) -> str:
    """argparse type: a tag."""
    if not TAG_RE.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an accepted tag ([A-Za-z0-9][A-Za-z0-9._/+-]{{0,127}}, no '..')")
    return value


def root_path(value: str) -> str:
    """argparse type: an absolute runtime root, normalised (no trailing slash)."""
    if not value.startswith("/") or "\0" in value:
        raise argparse.ArgumentTypeError(f"--root {value!r} must be an absolute path")
    return os.path.normpath(value)


def abs_path(value: str) -> str:
    """argparse type: an absolute path."""
    if not value.startswith("/") or "\0" in value:
        raise argparse.ArgumentTypeError(f"{value!r} must be an absolute path")
    return os.path.normpath(value)


def jobs(value: str) -> int:
    """argparse type: ``--jobs N``, 1..MAX_JOBS."""
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"--jobs {value!r} must be an integer from 1 to {MAX_JOBS}")
    return int(value)


def note(value: str) -> str:
    """argparse type: ``--note TEXT``, one printable line of at most 200 characters."""
    if not NOTE_RE.match(value):
        raise argparse.ArgumentTypeError("--note must be one printable line of 1 to 200 characters")
    return value


class _Once(argparse.Action):
    """Store an option's value, refusing a second occurrence."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        if getattr(namespace, f"_seen_{self.dest}", False):
            parser.error(f"{option_string} given more than once")
        setattr(namespace, f"_seen_{self.dest}", True)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become :class:`~.errors.SiteError` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise usage(f"{self.prog}: {message}")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", required=True, type=root_path, action=_Once,
                        help="absolute runtime root (holds releases/ and current)")
    parser.add_argument("--program", required=True, type=program_name, action=_Once)
    parser.add_argument("--expected-sha", required=True, type=full_sha, action=_Once,
                        help="full 40- or 64-digit commit id")
    parser.add_argument("--tag", type=tag_name, default=None, action=_Once)


def build_parser() -> argparse.ArgumentParser:
    """The whole ``vq-site-example`` grammar."""
    parser = _Parser(prog="vq-site-example", allow_abbrev=False,
                     description="Build, activate and verify immutable per-SHA runtime releases.")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb, text in (("deploy", "build, validate and activate a release (ROOT must exist)"),
                       ("install", "first-time deploy: create the ROOT layout if missing")):
        sub = verbs.add_parser(verb, help=text, description=text, allow_abbrev=False)
        _common(sub)
        sub.add_argument("--source-archive", type=abs_path, default=None, action=_Once,
                         help="the staged source.tar (git archive of the commit)")
        sub.add_argument("--jobs", type=jobs, default=None, action=_Once,
                         help="site arg: build parallelism, exported as VQ_BUILD_JOBS")
        sub.add_argument("--note", type=note, default=None, action=_Once,
                         help="site arg: free text recorded in the release's BUILD-LOG")
    sub = verbs.add_parser("activate", allow_abbrev=False,
                           help="switch current to an existing validated release; builds nothing")
    _common(sub)
    sub.add_argument("--jobs", type=jobs, default=None, action=_Once, help=argparse.SUPPRESS)
    sub = verbs.add_parser("verify", allow_abbrev=False,
                           help="read-only: print the verify receipt of the active release")
    _common(sub)
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Parse *argv* (without the program name); raises SiteError(2) on any error."""
    return build_parser().parse_args(list(argv))
