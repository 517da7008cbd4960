"""``vq admin update``: the helper lane (one positional) or the runtime lane (two)."""

from __future__ import annotations

import argparse
import sys

from vq_admin_hookspecs import FULL_SHA_RE

from .. import authority
from ..config import load_config
from ..context import RunContext, RunOptions, stderr_narrator
from ..locks import lane_lock
from ..outcome import Outcome, UsageError, VqAdminError
from ..output import plan_summary, receipt_summary, report
from ..plugins import Providers
from ..receipt import Receipt
from ..source import check_tag_name
from ..state import StateDir, utc_now
from ..transport import Session
from ..lanes.common import conclude

SHA_RULE = "give the full commit SHA: 40 (or 64) hex digits; abbreviations and ref names are not accepted"


def full_sha(value: str | None, option: str = "--expected-sha") -> str | None:
    if value is None:
        return None
    if not FULL_SHA_RE.match(value):
        raise UsageError(f"{option}: {value!r} is not a full commit SHA; {SHA_RULE}")
    return value.lower()


def options_from(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        json=args.json,
        dry_run=args.dry_run,
        force=args.force,
        cluster_install=args.cluster_install,
        update_script_args=tuple(args.update_script_arg or ()),
        verbose=args.verbose,
    )


def run(args: argparse.Namespace) -> int:
    targets = args.targets
    if len(targets) > 2:
        raise UsageError("update takes HOST (helper lane) or PROGRAM HOST (runtime lane)")
    sha = full_sha(args.expected_sha)
    if args.tag is not None:
        check_tag_name(args.tag)
    if len(targets) == 1:
        if args.tag is not None:
            raise UsageError("--tag belongs to the runtime lane (PROGRAM HOST)")
        from .update_helper import run_helper

        return run_helper(args, targets[0], sha)
    program, host_name = targets
    if sha is None:
        raise UsageError(f"the runtime lane needs --expected-sha; {SHA_RULE}")
    config = load_config(args.config)
    host = authority.runtime_host(config, host_name)
    profile = host.runtimes.get(program)
    providers = Providers.load([profile.provider] if profile else [])
    state = StateDir(args.state_dir)
    options = options_from(args)
    from ..lanes.runtime import RuntimeUpdate

    with Session(config.ssh_config) as session:
        ctx = RunContext(config, state, session, providers, options, stderr_narrator(options.verbose or sys.stderr.isatty()))
        lane = RuntimeUpdate(ctx, host_name, program, sha, args.tag)
        return execute_lane(ctx, lane.receipt, lane.run, ("runtime", host_name, program))


def execute_lane(ctx: RunContext, receipt: Receipt, body, lock_key: tuple[str, str, str | None]) -> int:
    """Run a lane body under its lock; turn every definite error into a receipt."""
    try:
        if ctx.options.dry_run:
            receipt = body()
        else:
            with lane_lock(ctx.state.root, *lock_key):
                receipt = body()
    except VqAdminError as exc:
        receipt.errors.append(exc.message)
        receipt = conclude(ctx, receipt, exc.outcome)
    return emit(ctx, receipt)


def emit(ctx: RunContext, receipt: Receipt) -> int:
    outcome = receipt.outcome or Outcome.FAILED
    if ctx.options.dry_run and outcome.success:
        document = receipt.plan_dict()
        report(document, plan_summary(document), as_json=ctx.options.json, success=True, verbose=True)
        return 0
    document = receipt.to_dict()
    path = str(ctx.state.receipt_path(receipt.id)) if receipt.id else None
    report(document, receipt_summary(document, path), as_json=ctx.options.json,
           success=outcome.success, verbose=ctx.options.verbose)
    return outcome.exit_code


def error_document(args: argparse.Namespace, error: VqAdminError) -> dict:
    """The receipt of a run that ended before its lane began."""
    targets = getattr(args, "targets", None) or []
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
