"""``vq admin provider test NAME [--option KEY=VALUE]... [--script-arg ARG]... [--source-repo PATH --sha SHA]
[--keep] [--json]``, and for the built-in provider ``vq admin provider test command --update-command CMD
--verify-command CMD [--install-command CMD] ...`` (a site's own scripts).  ``--source-repo``/``--sha``
deploy the site's own source instead of the kit's fixture.

Exit 0 when every check passes, 1 when any fails, 2 for a usage error or a
provider that cannot be loaded.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import source
from ..config import parse_command
from ..report.envelope import emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_text
from . import SCHEMA, run_conformance


def _options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option {pair!r} must be KEY=VALUE")
        options[key] = value
    return options


#: The command lines the built-in provider is tested with: option -> profile key.
COMMAND_OPTIONS = {"update_command": "--update-command", "install_command": "--install-command",
                   "verify_command": "--verify-command", "activate_command": "--activate-command",
                   "prune_command": "--prune-command"}


def _commands(args: argparse.Namespace) -> dict[str, tuple[str, ...]] | None:
    """The ``--*-command`` values, read as the configuration reads a command (:func:`vq_admin.config.parse_command`)."""
    given: dict[str, str] = {key: getattr(args, key) for key in COMMAND_OPTIONS if getattr(args, key, None) is not None}
    if args.name != "command":
        if given:
            raise UsageError(f"{', '.join(COMMAND_OPTIONS[k] for k in given)}: only for the built-in 'command' "
                             f"provider; {args.name!r} takes --option KEY=VALUE")
        return None
    for key in ("update_command", "verify_command"):
        if key not in given:
            raise UsageError(f"provider test command needs {COMMAND_OPTIONS[key]} (the site script's command line)")
    return {key: parse_command({COMMAND_OPTIONS[key]: line}, COMMAND_OPTIONS[key], "") or ()
            for key, line in given.items()}


def _source(args: argparse.Namespace) -> tuple[str, str] | None:
    """``--source-repo PATH --sha SHA`` (both or neither): the site's repository and full commit SHA."""
    from ..commands.arguments import full_sha

    if (args.source_repo is None) != (args.sha is None):
        raise UsageError("--source-repo and --sha go together: the site's repository and the full SHA of a commit "
                         "in it")
    if args.source_repo is None:
        return None
    sha = full_sha(args.sha, "--sha")
    assert sha is not None
    if not os.path.isdir(args.source_repo):
        raise UsageError(f"--source-repo {args.source_repo}: not a directory (a git repository holding --sha)")
    repo = os.path.abspath(args.source_repo)
    source.check_repository(repo, "--source-repo")  # git reads it as you: the trusted-path rule, as source_repo
    return repo, sha


def run(args: argparse.Namespace) -> int:
    commands = _commands(args)
    report = run_conformance(args.name, provider_options=_options(args.option), script_args=args.script_arg,
                             keep=args.keep, commands=commands, source=_source(args))
    if args.json:
        errors = ([report.error] if report.error else []) + [f"{c.name}: {c.detail}" for c in report.failed()]
        emit(SCHEMA, Outcome.OK if report.passed else Outcome.FAILED, report.to_dict(), errors)
    else:
        print(safe_text(report.text()), file=sys.stdout if report.passed else sys.stderr)
    return 0 if report.passed else 1
