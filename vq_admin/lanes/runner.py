"""The lane runner: configuration, one ssh session, the lane built by its command, then the
lane run under its lock and lease; refusals, interruptions and bugs turned into receipts; the
receipt (or the plan of a dry run) printed.

The commands (:mod:`vq_admin.commands`) check their arguments and hand a lane's builder here;
no lane module imports a command.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from contextlib import ExitStack
from typing import TYPE_CHECKING, Callable, TypeVar

from .. import interrupts
from ..config import authority
from ..config import load_config
from ..context import RunContext, RunOptions, stderr_narrator
from ..lease import host_lease, plan_lease
from ..lockwait import LockWait
from ..report import progress
from ..state.locks import lane_lock
from ..report.outcome import Interrupted, Outcome, UsageError, VqAdminError
from ..report.output import plan_summary, receipt_summary, report, safe_text
from ..report.receipt import Receipt
from ..document import JsonObject, JsonValue
from ..report.sections import Readback, Section
from ..state.records import StateDir
from ..core.stamps import utc_now
from ..state.tree import UnsafeState
from ..ssh.transport import Session
from .conclude import conclude, rerun_command, unstored_warning

if TYPE_CHECKING:
    from .lane import Lane

Built = TypeVar("Built")

#: The longest ``--wait-lock``: a week (a build may take a day; nothing sane waits longer).
MAX_WAIT_LOCK = 7 * 24 * 3600


def run_lane(args: argparse.Namespace, key: tuple[str, str, str | None], sha: str | None, tag: str | None,
             build: Callable[[RunContext], Lane], early: dict[str, Section | JsonValue] | None = None) -> int:
    """Both lanes: configuration, one ssh session, the lane built by *build* (authority,
    providers), then the lane run under its lock *key* = (lane, host, program).

    A lane refused while being built gets a receipt and a log line; its lane records stay untouched.
    """
    started = getattr(args, "early_start", None)  # vq_admin.ssh.early_start: the configuration read, ssh started
    config = started.config if started is not None else load_config(args.config)
    # a host or program not configured (a typo, or PROGRAM and HOST swapped) is a usage error: nothing is recorded
    host = authority.lookup(config, key[1], key[2])
    if key[2] is not None and host.fleet_role in authority.RUNTIME_ROLES:
        authority.profile_of(host, key[2])
    wait = getattr(args, "wait_lock", None)
    if wait is not None and not 0 <= wait <= MAX_WAIT_LOCK:
        raise UsageError(f"--wait-lock {wait:g}: give the seconds to wait for a held lock (0 to {MAX_WAIT_LOCK})")
    options = RunOptions(
        wait_lock=wait,
        json=args.json,
        dry_run=args.dry_run,
        force=args.force,
        cluster_install=args.cluster_install,
        update_script_args=tuple(args.update_script_arg or ()),
        verbose=args.verbose,
        accept_regression=getattr(args, "accept_regression", None),
        retry_confirmation=getattr(args, "retry_confirmation", False),
        config=args.config,
        state_dir=args.state_dir,
    )
    lane_name, host_name, program = key
    with started.session if started is not None else Session(config.ssh_config) as session:
        ctx = RunContext(config, StateDir(args.state_dir), session, None, options,  # type: ignore[arg-type]
                         stderr_narrator(options.verbose or sys.stderr.isatty()))
        try:
            lane = build(ctx)
        except VqAdminError as exc:
            receipt = Receipt(lane_name, host_name, program, sha, tag, utc_now())
            receipt.set_sections(early)  # e.g. the "rollback" or "prune" field of a refused rollback or prune
            receipt.errors.append(exc.message)
            return emit(ctx, conclude(ctx, receipt, exc.outcome, lane_started=False))
        return execute_lane(ctx, lane.receipt, lane.run, key, deferred_lease=getattr(lane, "opens_lease", False))


def provider_lane(lane: Callable[..., Built], ctx: RunContext, *, host_name: str, program: str,
                  **options: object) -> Built:
    """The builder of a runtime lane that needs only its profile's provider (``prune``, ``rollback``):
    authority, then that provider loaded, then ``lane(ctx, host_name, program, **options)``."""
    from ..plugins import Providers

    _, profile = authority.runtime_profile(ctx.config, host_name, program)  # no such profile: 2, naming them
    ctx.providers = Providers.load([profile.provider])
    return lane(ctx, host_name, program, **options)


def execute_lane(ctx: RunContext, receipt: Receipt, body: Callable[[], Receipt],
                 lock_key: tuple[str, str, str | None], deferred_lease: bool = False) -> int:
    """Run a lane body under its lock and its host-side lease (:mod:`vq_admin.lease`:
    a second run from any driver exits 75 naming the holder); turn every definite
    error into a receipt.

    SIGINT, SIGTERM and SIGHUP end the run as ``unknown`` (exit 3) with a
    receipt: a step may have been under way on a host.
    """
    interrupts.checkpoint()  # a signal Python could not raise before the lane: 130, as any before it
    try:
        with interrupts.handled_by(None):  # the three signals raise Interruption (vq_admin.interrupts)
            try:
                if ctx.options.dry_run:
                    plan_lease(ctx, receipt, *lock_key)
                    receipt = body()
                else:
                    ctx.state.require_free_space()  # before the lock and any mutation (a full state filesystem)
                    ctx.state.check_run_dirs(*lock_key)  # a loose directory there: refused before the lock is written
                    waiter = LockWait(ctx.options.wait_lock, terminal=progress.enabled(ctx.options.json),
                                      narrate=ctx.narrate)
                    with ExitStack() as held:
                        waiter.run(lambda: held.enter_context(lane_lock(ctx.state.root, *lock_key)), lambda: None)
                        held.enter_context(host_lease(ctx, receipt, *lock_key, deferred=deferred_lease, waiter=waiter))
                        ctx.state.sweep_leftovers()  # temp files of killed runs (issue 14)
                        receipt = body()
                interrupts.checkpoint()  # one Python could not raise during the body: unknown, as any other
            except KeyboardInterrupt as exc:  # SIGINT, SIGTERM or SIGHUP
                raise Interrupted(f"vq-admin received {interrupts.name_of(exc)}") from None
    except UnsafeState:
        raise  # the state directory cannot be trusted: write nothing there, not even a receipt (exit 77)
    except Interrupted as exc:
        receipt.errors.append(f"{exc.message} during step {_current_step(receipt)}; the outcome is unknown")
        from .interrupted import interrupted_readback

        if not (receipt.readback and receipt.readback.next_command):  # a lane that said more keeps its own account
            receipt.readback = interrupted_readback(receipt, exc.message, rerun_command(ctx, receipt),
                                                    ctx.options.wait_lock)
        receipt = conclude(ctx, receipt, exc.outcome)
    except VqAdminError as exc:
        receipt.errors.append(exc.message)
        receipt = conclude(ctx, receipt, exc.outcome)
    except Exception as exc:  # a bug must still leave a receipt, and is never called a success
        receipt.errors.append(f"internal error during step {_current_step(receipt)}: {type(exc).__name__}: {exc}; "
                              "the outcome is unknown (please report this with the receipt)")
        receipt.traceback = traceback.format_exc()
        receipt.readback = Readback(read="nothing (vq-admin failed internally)", proven=False,
                                    next_command=rerun_command(ctx, receipt))
        receipt = conclude(ctx, receipt, Outcome.UNKNOWN)
    finally:
        interrupts.hold()  # the outcome is decided and recorded: a signal now changes nothing
    return emit(ctx, receipt)


def _current_step(receipt: Receipt) -> str:
    started = [s.name for s in receipt.plan.steps if s.argv is not None]
    return started[-1] if started else "(before any step)"


def emit(ctx: RunContext, receipt: Receipt) -> int:
    outcome = receipt.outcome or Outcome.FAILED
    if ctx.options.dry_run and outcome.success:
        document = receipt.plan_dict()
        report(document, plan_summary(document), as_json=ctx.options.json, success=True, verbose=True)
        return 0
    document = receipt.to_dict()
    path = str(ctx.state.receipt_path(receipt.id)) if receipt.id and receipt.stored else None
    report(document, receipt_summary(document, path), as_json=ctx.options.json,
           success=outcome.success, verbose=ctx.options.verbose)
    warning = unstored_warning(ctx, receipt)
    if warning is not None and (ctx.options.json or outcome.success):  # a failure's summary already says so
        try:
            print(safe_text(warning), file=sys.stderr, flush=True)
        except OSError:  # a closed stderr: the printed document still says it (not_stored)
            pass
    return outcome.exit_code


def error_document(args: argparse.Namespace, error: VqAdminError) -> JsonObject:
    """The receipt of a run that ended before its lane began."""
    targets = getattr(args, "targets", None) or [getattr(args, k, None) for k in ("program", "host")
                                                  if getattr(args, k, None)]  # rollback, prune
    if getattr(args, "all", False):  # a fleet rollout refused before any host started
        from ..report.envelope import SCHEMAS, document

        return document(SCHEMAS["fleet"], error.outcome, {"program": targets[0] if targets else None,
                                                "expected_sha": getattr(args, "expected_sha", None), "hosts": {}},
                        [error.message])
    receipt = Receipt(
        lane="runtime" if len(targets) == 2 else "helper",
        host=targets[-1] if targets else "",
        program=targets[0] if len(targets) == 2 else None,
        expected_sha=getattr(args, "expected_sha", None),
        tag=getattr(args, "tag", None),
        started_at=utc_now(),
    )
    receipt.errors.append(error.message)
    return receipt.finish(error.outcome, utc_now()).to_dict()
