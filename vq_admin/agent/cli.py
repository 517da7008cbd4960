"""``vq-admin-agent``: the scheduler-side helper's verbs, which the driver runs on a login or
build host over ssh (``session`` and ``verify-readback`` are served by :mod:`.entry` before this
table is imported).

Each verb prints one JSON object on stdout.  Exit status: 0 done, 1 failed (message on stderr),
2 usage, 3 an identity did not match, 4 an unsafe path was refused, 75 (``lease`` only) the lease
is held by another run.  ``alloc-run``, ``alloc-reconcile``, ``detach-run`` and
``detach-reconcile`` print framed records instead (:mod:`vq_admin.core.frames`) and exit 0
whenever their ``summary`` record was written, whatever the deployment's own exit status.

Standard library only, Python 3.8 and later; nothing of the driver side is imported: the agent
must run on a host that has only this package's files (or only ``vq-admin-agent.pyz``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import TYPE_CHECKING, Callable, Mapping

from .. import __version__
from . import allocation, checkpaths, confirm, detached, identity, install_file, lease, stage, verify_readback
from ..core import checksum, protocol, safedirs, securepath
from ..core.frames import FrameWriter
from ..core.identifiers import ENV_NAME_RE
from ..core.exits import EXIT_FAILED, EXIT_HELD, EXIT_MISMATCH, EXIT_UNSAFE, EXIT_USAGE
from .spawn import TimeoutExpired, run_captured

if TYPE_CHECKING:
    from ..core.protocol import RecordRead, Sinfo, VersionAnswer


def _emit(obj: Mapping[str, object]) -> None:
    sys.stdout.write(protocol.encode(obj))
    sys.stdout.flush()


def cmd_hash_file(args: argparse.Namespace) -> int:
    answer, code = verify_readback.hash_answer(args.path)
    _emit(answer)
    return code


def cmd_check_paths(args: argparse.Namespace) -> int:
    """The secure-path rule on every absolute PATH (see :mod:`.checkpaths`); exit 4 when one fails it."""
    checked, refused = checkpaths.check(args.paths)
    _emit({"checked": checked, "refused": refused})
    for item in refused:
        print(f"vq-admin-agent: refused: {item['problem']}", file=sys.stderr)
    return EXIT_UNSAFE if refused else 0


def _stage_identity(args: argparse.Namespace) -> dict[str, str]:
    values = (args.sha, args.archive_sha256, args.tree_sha256, args.git_tree)
    return dict(zip(stage.IDENTITY_FILES, values))


def cmd_stage_create(args: argparse.Namespace) -> int:
    _emit(stage.create(args.root or os.path.expanduser("~"), args.kind, args.name, _stage_identity(args)))
    return 0


def cmd_stage_receive(args: argparse.Namespace) -> int:
    return stage.receive_verb(args.stage)


def cmd_stage_verify(args: argparse.Namespace) -> int:
    result = stage.verify(args.stage, _stage_identity(args))
    _emit(result)
    return 0 if result["verified"] else EXIT_MISMATCH


def cmd_stage_reclaim(args: argparse.Namespace) -> int:
    root = args.root or os.path.expanduser("~")
    _emit(stage.reclaim(root, args.kind, args.name, args.stage, args.outcome == protocol.OUTCOME_SUCCESS,
                        args.keep_failed))
    return 0


def cmd_identity(args: argparse.Namespace) -> int:
    found = identity.identity()
    if args.json:
        _emit(found)
    else:
        print(identity.human(found))
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    """Cheap liveness answer (``vq admin check --connect``): no tree digest; a ``stat`` walk per ``--root``."""
    found: VersionAnswer = {
        "version": __version__,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "interpreter": sys.executable,
        "checksum": checksum.default_algorithm(),
    }
    if args.sinfo:
        found["sinfo"] = _sinfo()
    if args.root:  # each scratch root as a run would find it (vq admin check --connect)
        found["scratch"] = [{"root": root, "problem": safedirs.scratch_problem(root)} for root in args.root]
    _emit(found)
    return 0


SINFO_TIMEOUT = 20.0


def _sinfo() -> Sinfo:
    """``sinfo -h -o %t`` on this host: node states and counts, or why it failed."""
    argv = ["sinfo", "-h", "-o", "%t"]
    try:
        code, out, err = run_captured(argv, timeout=SINFO_TIMEOUT)
    except TimeoutExpired:
        return {"argv": argv, "exit_code": None, "error": f"no answer within {SINFO_TIMEOUT:.0f} s"}
    except OSError as exc:
        return {"argv": argv, "exit_code": 127, "error": f"sinfo: {exc.strerror or exc}"}
    states = dict(Counter(out.decode("utf-8", "replace").split()))
    error = None
    if code:
        error = err.decode("utf-8", "replace").strip()[-300:] or None
    elif not states:
        error = "sinfo listed no nodes"
    return {"argv": argv, "exit_code": code, "states": states, "error": error}


def cmd_install_file(args: argparse.Namespace) -> int:
    try:
        mode = int(args.mode, 8)
    except ValueError:
        print(f"vq-admin-agent: --mode {args.mode!r} is not an octal mode", file=sys.stderr)
        return EXIT_USAGE
    try:
        _emit(install_file.install(args.dest, mode, sys.stdin.buffer))
    except ValueError as exc:
        print(f"vq-admin-agent: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite positive number of seconds")
    return value


def _at_least_one(text: str) -> float:
    value = _positive(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 1 second")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not ENV_NAME_RE.match(name):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def _alloc_verb(body: Callable[[FrameWriter], object]) -> int:
    """Run an allocation verb; errors go to stderr, which may be gone after a dropped session."""
    try:
        body(FrameWriter())
        return 0
    except lease.WorkHeld as exc:  # an earlier run's build or job still holds the lease's work lock
        message, code = f"vq-admin-agent: {exc}", EXIT_HELD
    except (safedirs.UnsafePath, securepath.Untrusted) as exc:
        message, code = f"vq-admin-agent: refused: {exc}", EXIT_UNSAFE
    except (OSError, ValueError, lease.LeaseError) as exc:
        message, code = f"vq-admin-agent: {exc}", EXIT_FAILED
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass
    return code


def cmd_alloc_run(args: argparse.Namespace) -> int:
    return _alloc_verb(lambda frames: allocation.run(
        args.root, args.program, args.command, dict(args.env), args.sbatch_arg, args.timeout, frames, args.attempt,
        archive=args.archive, archive_sha256=args.archive_sha256, progress=args.progress))


def cmd_reconcile(args: argparse.Namespace) -> int:
    """``alloc-reconcile``, ``detach-reconcile`` or ``confirm-reconcile``: *args.reconcile* is its module's."""
    return _alloc_verb(lambda frames: args.reconcile(args.root, args.program, args.attempt, args.timeout, frames))


def cmd_detach_run(args: argparse.Namespace) -> int:
    return _alloc_verb(lambda frames: detached.run(
        args.root, args.program, args.command, dict(args.env), args.timeout, frames, args.attempt,
        archive=args.archive, archive_sha256=args.archive_sha256, progress=args.progress))


def cmd_confirm_run(args: argparse.Namespace) -> int:
    return _alloc_verb(lambda frames: confirm.run(
        args.root, args.program, args.command, args.sbatch_arg, args.timeout, frames, args.attempt,
        metrics=args.metric, baseline=dict(args.baseline), accept_regression=args.accept_regression,
        revert=args.revert, progress=args.progress))


def _attempt_run_options(p: argparse.ArgumentParser, what: str, *, bound: str, progress: str,
                         sbatch: bool = False) -> None:
    """The options of ``alloc-run`` (*what* "job", with ``--sbatch-arg``) and ``detach-run`` (*what* "build")."""
    p.add_argument(protocol.ROOT, required=True, help="scratch root (absolute)")
    p.add_argument(protocol.PROGRAM, required=True)
    p.add_argument(protocol.ATTEMPT, help="attempt name deploy.<UTC>.<hex> chosen by the driver (created fresh)")
    p.add_argument(protocol.TIMEOUT, type=_positive, required=True, help=bound)
    if sbatch:
        p.add_argument(protocol.SBATCH_ARG, action="append", default=[], metavar="ARG",
                       help="one sbatch option (repeat)")
    p.add_argument(protocol.ENV, action="append", default=[], type=_env_pair, metavar="NAME=VALUE",
                   help="environment for the provider command (repeat)")
    p.add_argument(protocol.ARCHIVE, metavar="PATH",
                   help=f"the staged source.tar the provider reads; the {what} refuses to run if it changed")
    p.add_argument(protocol.ARCHIVE_SHA256, metavar="HEX", help="its SHA-256 as staged and verified")
    p.add_argument(protocol.PROGRESS, type=_at_least_one, metavar="SECONDS", help=progress)
    p.add_argument("command", nargs="+", help="the provider argv, after --")


def _attempt_reconcile_options(p: argparse.ArgumentParser, what: str,
                               reconcile: Callable[..., allocation.Summary]) -> None:
    """The options of ``alloc-reconcile`` (*what* "job"), ``detach-reconcile`` ("build") and
    ``confirm-reconcile`` ("confirmation"), whose *reconcile* :func:`cmd_reconcile` calls."""
    p.add_argument(protocol.ROOT, required=True)
    p.add_argument(protocol.PROGRAM, required=True)
    p.add_argument(protocol.ATTEMPT, required=True)
    p.add_argument(protocol.TIMEOUT, type=_positive, required=True, help=f"how long to wait for the {what}'s end")
    p.set_defaults(func=cmd_reconcile, reconcile=reconcile)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vq-admin-agent", description="vq scheduler-side helper verbs")
    sub = parser.add_subparsers(dest="verb", required=True)

    p = sub.add_parser(protocol.HASH_FILE, help="SHA-256 of the file at PATH (following symlinks)")
    p.add_argument("path")
    p.set_defaults(func=cmd_hash_file)

    p = sub.add_parser(protocol.CHECK_PATHS, help="refuse (exit 4) a command path another user could change",
                       description="Check every absolute PATH, and every directory above it, with the "
                                   "secure-path rule: owned by you or root, not writable by group or others "
                                   "(a directory may be if it is sticky).")
    p.add_argument("paths", nargs="*", metavar="PATH", help="the words of the configured commands")
    p.set_defaults(func=cmd_check_paths)

    p = sub.add_parser(protocol.VERIFY_READBACK, help="run the read-only verify command, then hash the launcher its "
                       "receipt names; one JSON answer",
                       description="Run COMMAND (the provider's read-only verify argv, no shell), read the "
                                   "active_path its JSON receipt names and hash that file, as hash-file does.")
    p.add_argument(protocol.LEASE_OF, metavar="PROGRAM", help="also say who holds PROGRAM's runtime lease now "
                   "(read without taking it)")
    p.add_argument(protocol.RECORD_AFTER, type=int, metavar="N", help="with --lease-of: also answer the host's "
                   "record of PROGRAM after entry N")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the verify argv, after --")
    p.set_defaults(func=lambda args: verify_readback.main(
        ([protocol.LEASE_OF, args.lease_of] if args.lease_of else [])
        + ([protocol.RECORD_AFTER, str(args.record_after)] if args.lease_of and args.record_after is not None
           else []) + args.command))

    def identity_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(protocol.SHA, required=True)
        p.add_argument(protocol.ARCHIVE_SHA256, required=True)
        p.add_argument(protocol.TREE_SHA256, required=True)
        p.add_argument(protocol.GIT_TREE, required=True)

    p = sub.add_parser(protocol.STAGE_CREATE, help="create a fresh stage with its identity files")
    p.add_argument(protocol.ROOT, help="scratch root (default: home directory)")
    p.add_argument(protocol.KIND, choices=stage.KINDS, required=True)
    p.add_argument(protocol.NAME, required=True)
    identity_args(p)
    p.set_defaults(func=cmd_stage_create)

    p = sub.add_parser(protocol.STAGE_RECEIVE, help="write the archive read from stdin into a stage")
    p.add_argument(protocol.STAGE, required=True)
    p.set_defaults(func=cmd_stage_receive)

    p = sub.add_parser(protocol.STAGE_VERIFY, help="prove a staged archive's identity")
    p.add_argument(protocol.STAGE, required=True)
    identity_args(p)
    p.set_defaults(func=cmd_stage_verify)

    p = sub.add_parser(protocol.STAGE_RECLAIM, help="remove a succeeded stage or cap failed ones")
    p.add_argument(protocol.ROOT)
    p.add_argument(protocol.KIND, choices=stage.KINDS, required=True)
    p.add_argument(protocol.NAME, required=True)
    p.add_argument(protocol.STAGE, required=True)
    p.add_argument(protocol.OUTCOME, choices=protocol.OUTCOMES, required=True)
    p.add_argument(protocol.KEEP_FAILED, type=int, default=protocol.KEEP_FAILED_DEFAULT)
    p.set_defaults(func=cmd_stage_reclaim)

    p = sub.add_parser(protocol.IDENTITY, help="version, source SHA, tree digest, path and interpreter of this helper")
    p.add_argument(protocol.JSON, action="store_true", help="print one JSON object (what the driver reads)")
    p.set_defaults(func=cmd_identity)

    p = sub.add_parser(protocol.VERSION, help="version, Python and checksum of this helper, as one JSON object")
    p.add_argument(protocol.SINFO, action="store_true", help="also run 'sinfo -h -o %%t' and report the node states")
    p.add_argument(protocol.ROOT, action="append", default=[],
                   help="also check this scratch root as a run would (exists, trusted; repeatable)")
    p.set_defaults(func=cmd_version)

    p = sub.add_parser(protocol.INSTALL_FILE, help="replace the file at --dest with stdin, atomically")
    p.add_argument(protocol.DEST, required=True, help="absolute path of the file to install")
    p.add_argument(protocol.MODE, default=protocol.MODE_DEFAULT,
                   help="octal file mode (default 0755; no group/other write)")
    p.set_defaults(func=cmd_install_file)

    p = sub.add_parser(protocol.ALLOC_RUN, help="run a provider argv as a Slurm batch job in a fresh attempt directory",
                       description="Create <root>/.vq-admin/runtime-deploy/<program>/<attempt>/, submit "
                                   "sbatch --parsable --wait, bound the wait, settle the transcripts, apply "
                                   "retention and stream the result (framed records).")
    _attempt_run_options(p, "job", bound="bound on the wait, in seconds", sbatch=True,
                         progress="report queue state and the transcript's last line every SECONDS (at least 1), "
                                  "and each settle observation, as progress records (for a terminal)")
    p.set_defaults(func=cmd_alloc_run)

    p = sub.add_parser(protocol.ALLOC_RECONCILE, help="establish the end of an attempt's recorded job (never submits)")
    _attempt_reconcile_options(p, "job", allocation.reconcile)

    p = sub.add_parser(protocol.DETACH_RUN, help="run a provider argv on this host, detached from the connection, in a "
                       "fresh attempt directory",
                       description="Create <root>/.vq-admin/runtime-deploy/<program>/<attempt>/, start the "
                                   "provider argv under a supervising process in its own session (stdin from "
                                   "/dev/null, output to the attempt's stdout and stderr, its pid in 'build' and "
                                   "its exit status in 'exit'), follow it, bound it, settle the transcripts, apply "
                                   "retention and stream the result (framed records). A dropped connection leaves "
                                   "the build running to its end.")
    _attempt_run_options(p, "build", bound="bound on the build, in seconds (at the bound its process group is ended)",
                         progress="report whether the build runs and the transcript's last line every SECONDS "
                                  "(at least 1), and each settle observation, as progress records (for a terminal)")
    p.set_defaults(func=cmd_detach_run)

    p = sub.add_parser(protocol.DETACH_RECONCILE,
                       help="establish the end of an attempt's detached build (never starts one)")
    _attempt_reconcile_options(p, "build", detached.reconcile)

    p = sub.add_parser(protocol.CONFIRM_RUN, help="prove a generation by a Slurm batch job; revert when it fails",
                       description="Create an attempt, submit the confirmation argv as a batch job under a supervisor "
                                   "detached from the connection (it holds the lease's work lock), judge its end and "
                                   "its VQ-DEPLOY-METRIC lines, run --revert words when it did not pass, and stream "
                                   "the verdict and transcripts (framed records).")
    _attempt_run_options(p, "job", bound="bound on the job, from submission (scancel at the bound)", sbatch=True,
                         progress="report queue state every SECONDS (at least 1) as progress records")
    p.add_argument(protocol.METRIC, action="append", default=[], metavar="NAME=BETTER:TOL",
                   help="a declared metric (repeat)")
    p.add_argument(protocol.BASELINE, action="append", default=[], type=_env_pair, metavar="NAME=VALUE",
                   help="the previous generation's value (repeat)")
    p.add_argument(protocol.ACCEPT_REGRESSION, action="store_true", help="a metric out of tolerance does not fail")
    p.add_argument(protocol.REVERT, action="append", default=[], metavar="WORD",
                   help="one word of the revert argv, run on this host when the job does not pass (repeat)")
    p.set_defaults(func=cmd_confirm_run)

    p = sub.add_parser(protocol.CONFIRM_RECONCILE,
                       help="the verdict of an attempt's confirmation (never submits or reverts)")
    _attempt_reconcile_options(p, "confirmation", confirm.reconcile)

    p = sub.add_parser(protocol.LEASE, help="hold the host-side lease of one lane until stdin closes (75 when held)",
                       description="Take an exclusive flock on $XDG_STATE_HOME/vq-admin-agent/locks/"
                                   "runtime.<program>.lock (helper.lock for the helper lane), record the holder, "
                                   "print one JSON line, and hold it until stdin closes. Never waits: exit 75 "
                                   "naming what holds it (a run's agent, or a build or job a run left running).")
    p.add_argument(protocol.LANE, choices=lease.LANES, required=True)
    p.add_argument(protocol.HOST, required=True, help="holder record: the host name in the driver's configuration")
    p.add_argument(protocol.PROGRAM, help="the program (runtime lane only)")
    p.add_argument(protocol.RECORD_AFTER, type=int, metavar="N",
                   help="also answer the host's record of the lane after entry N (member record)")
    p.add_argument(protocol.DRIVER_HOST, required=True, help="holder record: the driver's host name")
    p.add_argument(protocol.USER, required=True, help="holder record: the user running vq-admin")
    p.add_argument(protocol.PID, type=int, required=True, help="holder record: the driver's pid")
    p.add_argument(protocol.SINCE, required=True, help="holder record: when the run started (UTC)")
    p.add_argument(protocol.RUN_ID, required=True, help="holder record: the run's id")
    p.set_defaults(func=lease.main_lease)

    p = sub.add_parser(protocol.SESSION, help="a run's first call: login-shell probe, lease, check-paths and verify in "
                       "one start (one JSON request line on stdin), then hold the lease until stdin closes",
                       description="Read one JSON request line on stdin; run the login-shell probe, take the "
                                   "lease, check the command paths and run the verify with its launcher read-back, "
                                   "each only when everything before it passed; print one JSON answer line; hold "
                                   "the lease (when taken) until stdin closes.")
    p.add_argument(protocol.PROBE, nargs="*", metavar="WORD", default=None,
                   help="the login-shell probe's words, as the login shell passed them (request member "
                        "shell_probe with argv true); must be the last option")
    p.set_defaults(func=cmd_session)

    p = sub.add_parser(protocol.CENSUS, help="the words of every queued or running Slurm job that name a full SHA, "
                       "as one JSON answer (exit 1 when the queue could not be read completely)",
                       description="List the queue with one squeue call; read the stored batch script of a job "
                                   "only when the cache ($XDG_STATE_HOME/vq-admin-agent/census/) does not hold it "
                                   "yet (scontrol write batch_script); keep what was read there, sealed, for the "
                                   "jobs still queued; report what it cost.")
    p.set_defaults(func=cmd_census)

    p = sub.add_parser(protocol.RECORD, help="the entries of the host's record after entry N, as one JSON answer",
                       description="Read $XDG_STATE_HOME/vq-admin-agent/record/<program>/ (_helper/ for the helper "
                                   "lane): each entry numbered above N, its statement and its signature.")
    p.add_argument("cursors", nargs="*", metavar="NAME=N", help="a program (_helper: the helper lane) and the "
                   "number of the last entry already read (0: all)")
    p.set_defaults(func=cmd_record)

    p = sub.add_parser(protocol.RECORD_QUARANTINE, help="append one quarantine or lift entry to the host's record "
                       "under the record's own lock (never a lease); one JSON answer",
                       description="Read one JSON line {\"append\": {\"statement\": TEXT, \"sig\": TEXT or null}} "
                                   "on stdin; append it to $XDG_STATE_HOME/vq-admin-agent/record/PROGRAM/ when it is "
                                   "an in-toto quarantine or lift statement of PROGRAM (exit 1 otherwise); answer "
                                   "the entries after N too (member record).")
    p.add_argument(protocol.PROGRAM, required=True)
    p.add_argument(protocol.RECORD_AFTER, type=int, default=0, metavar="N")
    p.set_defaults(func=cmd_record_quarantine)
    return parser


def cmd_record_quarantine(args: argparse.Namespace) -> int:
    """Append a quarantine or lift entry (:func:`.record.serve_line`), then read the record after N."""
    from . import record

    answer = record.serve_line(sys.stdin.buffer.readline(4 * record.MAX_ENTRY), args.program, quarantine=True)
    answer["record"] = record.read_after(args.program, max(0, args.record_after))
    _emit(answer)
    return EXIT_FAILED if "append_error" in answer else 0


def cmd_record(args: argparse.Namespace) -> int:
    """The host's record of each ``NAME=N`` word's program (``_helper``: the helper lane) after entry N."""
    from . import record

    records: dict[str, RecordRead] = {}
    for word in args.cursors:
        name, _, after = word.partition("=")
        try:
            if not after.isdigit():
                raise ValueError(f"{word!r} is not NAME=N")
            records[name] = record.read_after(None if name == protocol.HELPER_RECORD else name, int(after))
        except ValueError as exc:
            print(f"vq-admin-agent: record-read: {exc}", file=sys.stderr)
            return EXIT_USAGE
    _emit({"records": records})
    return EXIT_FAILED if any("error" in found for found in records.values()) else 0


def cmd_session(args: argparse.Namespace) -> int:
    """See :mod:`.session` (normally served by the console entry before this table is loaded)."""
    from . import session

    return session.main([] if args.probe is None else protocol.session_probe(args.probe))


def cmd_census(args: argparse.Namespace) -> int:
    """See :mod:`.census` (imported here: the other verbs need none of it)."""
    from . import census

    return census.main()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return safedirs.verb_status(lambda: func(args))


if __name__ == "__main__":
    sys.exit(main())
