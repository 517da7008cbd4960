"""``vq admin provider test NAME [--option KEY=VALUE]... [--script-arg ARG]... [--keep] [--json]``.

Exit 0 when every check passes, 1 when any fails, 2 for a usage error or a
provider that cannot be loaded.
"""

from __future__ import annotations

import argparse
import sys

from ..outcome import UsageError
from ..output import print_json, safe_text
from . import run_conformance


def _options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option {pair!r} must be KEY=VALUE")
        options[key] = value
    return options


def run(args: argparse.Namespace) -> int:
    report = run_conformance(args.name, provider_options=_options(args.option), script_args=args.script_arg,
                             keep=args.keep)
    if args.json:
        print_json(report.to_dict())
    else:
        print(safe_text(report.text()), file=sys.stdout if report.passed else sys.stderr)
    return 0 if report.passed else 1
