"""The argument tree of ``vq admin`` / ``vq-admin``: one small function per verb.

``vq admin ARGS`` and ``vq-admin ARGS`` are the same entry point.  Usage
errors exit 2 with a message naming the rule; with ``--json`` even a usage
error prints exactly one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from .report.outcome import UsageError, VqAdminError

if TYPE_CHECKING:
    from .document import JsonObject
    from .ssh.early_start import EarlyStart


def error_document(args: argparse.Namespace | None, error: VqAdminError) -> JsonObject:
    """The one JSON document of a run that ended with an error before any verb printed its own: a lane
    verb's receipt (:func:`vq_admin.lanes.runner.error_document`), else the envelope's error document."""
    if args is not None and getattr(args, "verb", None) in ("update", "rollback", "prune"):
        from .lanes.runner import error_document as lane_error_document

        return lane_error_document(args, error)
    from .report.envelope import SCHEMAS, document

    return document(SCHEMAS["error"], error.outcome, None, [error.message])


class _Formatter(argparse.HelpFormatter):
    """Shows ``update``'s targets as ``[PROGRAM] HOST``: one or two words, not a list."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if action.nargs == "+" and action.metavar == "[PROGRAM] HOST":
            return action.metavar
        return super()._format_args(action, default_metavar)


class Parser(argparse.ArgumentParser):
    """One parser of a :func:`build_parser` tree (its subparsers are of the same class: ``parser_class``)."""

    #: The top-level prog ("vq admin" or "vq-admin"); main() prints it before every error.
    top_prog = ""
    #: Every parser of the tree, in the order built (the completion reads it: no private argparse).
    family: list[Parser] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        #: What :meth:`add_argument` returned for this parser, in order.
        self.arguments: list[argparse.Action] = []
        super().__init__(*args, **kwargs)
        self.family.append(self)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def error(self, message: str) -> NoReturn:
        # main() already prints "<prog>: usage: "; name only the verb (``update: ...``), never the prog twice.
        verb = self.prog[len(self.top_prog):].strip() if self.top_prog and self.prog.startswith(self.top_prog) else ""
        raise UsageError(f"{verb}: {message}" if verb else message)


def _common(parser: argparse.ArgumentParser, json_help: str = "print exactly one JSON document on stdout") -> None:
    parser.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                        help="configuration file (default: $VQ_ADMIN_CONFIG, else $XDG_CONFIG_HOME/vq/admin.toml)")
    parser.add_argument("--state-dir", metavar="DIR", default=argparse.SUPPRESS,
                        help="driver state directory (default: $VQ_ADMIN_STATE_DIR, else $XDG_STATE_HOME/vq-admin)")
    parser.add_argument("--json", action="store_true", help=json_help)


def _lane_options(parser: argparse.ArgumentParser, dry_run_help: str) -> None:
    """``--wait-lock``, ``--dry-run`` and ``-v`` of the verbs that run a lane."""
    parser.add_argument("--wait-lock", metavar="SECONDS", type=float,
                        help="wait up to SECONDS for a held lane lock or host-side lease (progress on a terminal), "
                             "then exit 75 as without it")
    parser.add_argument("--dry-run", action="store_true", help=dry_run_help)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="narrate on stderr and print the summary even when not a terminal")


def build_parser(prog: str = "vq admin") -> Parser:
    tree: type[Parser] = type("Tree", (Parser,), {"top_prog": prog, "family": []})
    parser = tree(prog=prog, description="Keep the vq helper and managed runtimes on Slurm login hosts exactly right.")
    parser.add_argument("--version", action="version", version=f"vq-admin {__version__}")
    parser.add_argument("--config", metavar="PATH", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", metavar="DIR", default=None, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser("update", help="update the helper (HOST) or one runtime (PROGRAM HOST)",
                       description="HOST: the helper lane. PROGRAM HOST: the runtime lane.")
    p.add_argument("targets", nargs="+", metavar="[PROGRAM] HOST")
    p.add_argument("--expected-sha", metavar="SHA", help="full commit SHA (40 or 64 hex digits)")
    p.add_argument("--tag", metavar="TAG", help="the tag the runtime must report (runtime lane)")
    p.add_argument("--cluster-install", action="store_true", help="run the provider's install instead of its update")
    p.add_argument("--update-script-arg", metavar="ARG", action="append", default=[],
                   help="pass ARG to the provider's update/install command (repeatable, kept in order)")
    p.add_argument("--force", action="store_true", help="rebuild even when the requested identity is already active")
    p.add_argument("--retry-confirmation", action="store_true",
                   help="run the confirmation job again for an unconfirmed SHA (activating it first when needed)")
    p.add_argument("--accept-regression", metavar="REASON",
                   help="a confirmation metric out of tolerance is recorded with REASON, not reverted")
    _lane_options(p, "print the plan; run and change nothing")
    p.add_argument("--all", action="store_true",
                   help="fleet rollout: update PROGRAM on every managed host that has a profile for it")
    p.add_argument("--canary", metavar="HOST", help="with --all: run HOST alone first; nothing else starts unless "
                   "it ends ok or already-current")
    p.add_argument("--parallel", metavar="N", type=int, help="with --all: at most N hosts at a time (default 4)")
    p.add_argument("--max-failed", metavar="K", type=int, help="with --all: once more than K hosts end other than "
                   "ok/already-current, start no further host (default 0)")
    _common(p, "print exactly one JSON document (the receipt) on stdout")
    p.set_defaults(func="commands.update")

    p = sub.add_parser("status", help="last outcome, LAST OK and LAST GOOD per host and lane")
    p.add_argument("host", nargs="?", metavar="HOST")
    p.add_argument("--all", action="store_true",
                   help="every host's LAST OK side by side, per program (drift at a glance)")
    p.add_argument("--prometheus", action="store_true",
                   help="print the Prometheus text exposition format (for node_exporter's textfile collector)")
    p.add_argument("--textfile", metavar="PATH", help="write that format to PATH (*.prom) atomically; print nothing")
    _common(p)
    p.set_defaults(func="commands.status")

    p = sub.add_parser("verify", help="read-only drift check: is the runtime LAST OK names (or SHA) still active?",
                       description="Run the profile's verify and the launcher read-back on the login host(s); "
                       "change nothing. Each runtime is current, drifted, unhealthy, broken or unknown.")
    p.add_argument("program", nargs="?", metavar="PROGRAM")
    p.add_argument("host", nargs="?", metavar="HOST")
    p.add_argument("--all", action="store_true",
                   help="every managed host's profile of PROGRAM (of every program without PROGRAM)")
    p.add_argument("--expected-sha", metavar="SHA", help="compare with this full commit SHA instead of LAST OK")
    p.add_argument("--job", action="store_true", help="also run the profile's confirmation job against the active "
                   "generation (read-only: nothing activated or reverted)")
    p.add_argument("--prometheus", action="store_true", help="print the drift gauge in the Prometheus text format")
    p.add_argument("--textfile", metavar="PATH", help="write that format to PATH (*.prom) atomically")
    p.add_argument("-v", "--verbose", action="store_true", help="print the table even when every runtime is current")
    _common(p)
    p.set_defaults(func="commands.verify")

    p = sub.add_parser("providers", help="list installed and selected providers")
    _common(p)
    p.set_defaults(func="commands.providers")

    p = sub.add_parser("check", help="validate the configuration and load its providers; run nothing")
    p.add_argument("hosts", nargs="*", metavar="HOST",
                   help="with --connect: reach only these hosts (and the build hosts they name)")
    p.add_argument("--connect", action="store_true",
                   help="also reach every configured host (one ssh round trip each, in parallel): agent version, "
                        "scratch_root, and sinfo where a profile builds in an allocation")
    p.add_argument("--timeout", type=float, metavar="SECONDS", default=None,
                   help="with --connect: bound on each host's round trip (default 30)")
    _common(p)
    p.set_defaults(func="commands.check")

    p = sub.add_parser("launcher", help="print the verified immutable launcher of a runtime, or refuse")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--expected-sha", metavar="SHA", help="refuse unless the verified launcher is for this SHA")
    p.add_argument("--path", metavar="PATH", help="refuse unless PATH is exactly the verified launcher")
    p.add_argument("--pin", metavar="PIN", help="validate a pin recorded at submission (its JSON object, or a legacy "
                   "bare SHA) at dispatch time; legacy and mutable pins are refused")
    p.add_argument("--check-on-host", action="store_true",
                   help="re-hash the launcher on the login host; refuse unless it has the attested SHA-256")
    p.add_argument("--job", metavar="REF", help="the queue's job reference, recorded with this use (every lookup "
                   "records its use; vq admin jobs lists them)")
    _common(p)
    p.set_defaults(func="commands.launcher")

    p = sub.add_parser("references", help="why each verified generation and launcher must be kept (current, "
                       "LAST GOOD, queued or running jobs)")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    _common(p)
    p.set_defaults(func="commands.references")

    p = sub.add_parser("jobs", help="which jobs used each generation (recorded uses) and which reference it now "
                       "(the scheduler)")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--sha", metavar="SHA", help="only this generation (a full commit SHA)")
    p.add_argument("--since", metavar="UTC", help="only uses at or after this UTC date or time (2026-11-30, "
                   "2026-11-30T10:00:00Z)")
    _common(p, "print one JSON document (schema vq-admin/jobs/1) on stdout")
    p.set_defaults(func="commands.jobs")

    p = sub.add_parser("quarantine", help="stop further use of a generation (launcher, update and rollback refuse "
                       "it), list the jobs using it, optionally hold the pending ones; --lift ends it")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("sha", metavar="SHA")
    p.add_argument("--reason", metavar="TEXT", help="why (required, except with --lift); launcher refusals say "
                   "'quarantined: TEXT'")
    p.add_argument("--hold-jobs", action="store_true", help="hold the pending jobs that reference SHA (scontrol "
                   "hold); running jobs are never touched")
    p.add_argument("--lift", action="store_true", help="end the quarantine")
    _common(p, "print one JSON document (schema vq-admin/quarantine/1) on stdout")
    p.set_defaults(func="commands.quarantine")

    p = sub.add_parser("rollback", help="re-activate an earlier verified generation (LAST GOOD, or --to SHA)")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--to", metavar="SHA", help="the verified generation to return to (default: LAST GOOD)")
    _lane_options(p, "print the plan; run and change nothing")
    _common(p, "print exactly one JSON document (the receipt) on stdout")
    p.set_defaults(func="commands.rollback", force=False, cluster_install=False, update_script_arg=[])

    p = sub.add_parser("prune", help="remove generations no job, LAST OK, LAST GOOD or recent run needs")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--keep", metavar="N", type=int, default=3,
                   help="also keep the N most recent distinct verified generations (default 3)")
    p.add_argument("--used-within", metavar="DAYS", type=float, default=14.0,
                   help="also keep every generation with a use recorded within DAYS days (default 14)")
    p.add_argument("--forget-driver", metavar="ID", help="drop the retired driver ID's roots (USER@HOST/<8 hex>), "
                   "recorded on the host's record")
    _lane_options(p, "print the keep set and reasons; remove nothing")
    _common(p, "print exactly one JSON document (the receipt) on stdout")
    p.set_defaults(func="commands.prune", force=False, cluster_install=False, update_script_arg=[])

    p = sub.add_parser("history", help="runs, newest first: every administrator's on HOST (its record), or stored")
    p.add_argument("host", nargs="?", metavar="HOST")
    p.add_argument("program", nargs="?", metavar="PROGRAM")
    p.add_argument("--limit", metavar="N", type=int, default=None, help="print at most N runs (default 20)")
    p.add_argument("--local", action="store_true",
                   help="with HOST: this driver's stored receipts only (no ssh), not the host's record")
    _common(p, "print one JSON document (schema vq-admin/history/1) on stdout")
    p.set_defaults(func="commands.history")

    p = sub.add_parser("attest", help="print the host's signed record entry (in-toto statement) of a generation")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("host", metavar="HOST")
    p.add_argument("--sha", metavar="SHA", help="the generation (full SHA; default: the newest verified one)")
    p.add_argument("--out", metavar="DIR", help="write DIR/statement.json and DIR/statement.json.sig")
    _common(p, "print one JSON document (schema vq-admin/attest/1) on stdout")
    p.set_defaults(func="commands.attest")

    p = sub.add_parser("provider", help="install or test a private site provider command")
    psub = p.add_subparsers(dest="provider_verb", required=True)
    q = psub.add_parser("install", help="install one reviewed site command on a host (old/new hash, interpreter)")
    q.add_argument("src", metavar="SRC", help="the reviewed file on this machine (never from a product tree or stage)")
    q.add_argument("--host", required=True, metavar="HOST", help="configured host (managed or helper-only)")
    q.add_argument("--dest", required=True, metavar="PATH", help="absolute path of the command on that host")
    q.add_argument("--on", metavar="DEST",
                   help="install on this configured destination of HOST (default: its login host)")
    q.add_argument("--mode", default="0755", help="octal mode of the installed file (default 0755)")
    q.add_argument("--dry-run", action="store_true", help="print what would run; run and change nothing")
    _common(q, "print exactly one JSON document (the install receipt) on stdout")
    q.set_defaults(func="provider_install")
    q = psub.add_parser("test", help="run the provider conformance kit against a disposable root")
    q.add_argument("name", metavar="NAME", help="provider entry-point name")
    q.add_argument("--option", metavar="KEY=VALUE", action="append", default=[],
                   help="provider_options entry ({root} expands to the disposable root; repeatable)")
    q.add_argument("--script-arg", metavar="ARG", action="append", default=[],
                   help="an --update-script-arg value for every deploy (repeatable, kept in order)")
    q.add_argument("--source-repo", metavar="PATH",
                   help="deploy the site's own source (a git repository) instead of the kit's fixture; with --sha")
    q.add_argument("--sha", metavar="SHA", help="with --source-repo: the full SHA of the commit to deploy")
    q.add_argument("--keep", action="store_true", help="keep the disposable directory and print its path")
    for option, what in (("--update-command", "update"), ("--install-command", "install"),
                         ("--verify-command", "verify"), ("--activate-command", "activate (rollback)"),
                         ("--prune-command", "prune")):
        q.add_argument(option, metavar="CMD", help=f"built-in 'command' provider only: the site's {what} command "
                       "line ({root} expands to the disposable root)")
    _common(q, "print exactly one JSON document (the conformance report) on stdout")
    q.set_defaults(func="conformance.cli")

    p = sub.add_parser("completion", help="print the bash or zsh completion script of vq and vq-admin")
    p.add_argument("shell", metavar="SHELL", choices=("bash", "zsh"), help="bash or zsh")
    p.set_defaults(func="completion")
    return parser


#: Stands in for a literal "--" option value while argparse parses (a NUL never occurs in a real argv).
_DOUBLE_DASH = "\0--"


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, except that ``--option=--`` keeps its value ``--``
    (Python 3.11's argparse turns it into ``[]``, which no option expects)."""
    args = parser.parse_args([a[:-2] + _DOUBLE_DASH if a.startswith("--") and a.partition("=")[2] == "--" else a
                              for a in argv])
    for key, value in vars(args).items():
        if value == _DOUBLE_DASH:
            setattr(args, key, "--")
        elif isinstance(value, list):
            setattr(args, key, ["--" if v == _DOUBLE_DASH else v for v in value])
    return args


def run(prog: str, argv: list[str], early: EarlyStart | None = None) -> int:
    """The full command line after the console script's own work (:func:`vq_admin.entry.main`): parse,
    dispatch to the verb's command (with *early*, what an ``update``'s early start read and started:
    ``args.early_start``), turn a definite error into its message (and JSON document)."""
    args = None
    try:
        args = parse(build_parser(prog), argv)
        args.early_start = early
        code: int = import_module(f".{args.func}", __package__).run(args)  # the verb's module
        return code
    except (VqAdminError, KeyboardInterrupt) as exc:
        from . import interrupts

        # an interruption before a lane started (a lane makes it a receipt) is 130: nothing changed
        error = exc if isinstance(exc, VqAdminError) else interrupts.early_error(exc)
        return interrupts.finish_early(prog, error, error_document(args, error) if "--json" in argv else None)


if __name__ == "__main__":  # python -m vq_admin.cli: the console script's entry (this module is __main__ then)
    from vq_admin.entry import main

    sys.exit(main())
