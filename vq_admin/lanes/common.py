"""What both lanes share: concluding a run into receipt, state and admin log."""

from __future__ import annotations

from typing import Any

from ..context import RunContext
from ..outcome import Outcome
from ..receipt import Receipt
from ..state import utc_now


def conclude(ctx: RunContext, receipt: Receipt, outcome: Outcome, verified: dict[str, Any] | None = None,
             *, lane_started: bool = True) -> Receipt:
    """Finish *receipt*; store it, the lane records and one admin-log line.

    A dry run stores nothing.  *verified* is given only for a verified success
    and is what LAST OK becomes.  A run refused before its lane started
    (*lane_started* false: no authority, no such profile) gets a receipt and a
    log line but leaves the lane's records alone.
    """
    receipt.finish(outcome, utc_now())
    for step in receipt.plan.steps:
        if step.status == "planned" and not ctx.options.dry_run:
            step.status = "skipped"
    if ctx.options.dry_run:
        return receipt
    if receipt.id is None:
        receipt.id = ctx.state.new_receipt_id(receipt.lane, receipt.host, receipt.program)
    if verified is not None:
        verified = dict(verified, receipt=receipt.id, at=receipt.finished_at)
        if receipt.lane == "runtime":  # the registry of verified launchers (vq_admin.registry)
            from .. import registry

            try:
                receipt.extra["registry"] = registry.record_verified(ctx.state.root, receipt.host, receipt.program, verified)
            except registry.RegistryError as exc:
                receipt.extra["registry"] = {"entry": None, "error": str(exc)}
    path = ctx.state.store_receipt(receipt.id, receipt.to_dict())
    summary = {
        "outcome": outcome.value,
        "exit_code": outcome.exit_code,
        "expected_sha": receipt.expected_sha,
        "tag": receipt.tag,
        "receipt": receipt.id,
        "at": receipt.finished_at,
        "errors": receipt.errors[:5],
    }
    if lane_started and outcome is not Outcome.LOCKED:  # a locked run did nothing: the lane's last outcome stands
        ctx.state.record_run(receipt.lane, receipt.host, receipt.program, summary, verified)
    ctx.state.append_log({
        "at": receipt.finished_at,
        "lane": receipt.lane,
        "host": receipt.host,
        "program": receipt.program,
        "expected_sha": receipt.expected_sha,
        "outcome": outcome.value,
        "exit_code": outcome.exit_code,
        "receipt": str(path),
        "errors": receipt.errors[:5],
    })
    return receipt


#: A provider that exits 75 (EX_TEMPFAIL, sysexits.h) found its own host lock held:
#: another deploy holds the host.  Nothing was changed by this run.
PROVIDER_LOCKED_EXIT = 75


def provider_locked(ctx: RunContext, receipt: Receipt, what: str, reclaim) -> Receipt:
    """The provider's own lock is held (exit 75): outcome ``locked``; the stage is
    reclaimed as not failed (nothing was tried on it)."""
    receipt.errors.append(f"{what} exited {PROVIDER_LOCKED_EXIT} (EX_TEMPFAIL): its own host lock is held by another "
                          "deploy; nothing was changed by this run; rerun when that deploy has ended")
    reclaim(success=True)
    return conclude(ctx, receipt, Outcome.LOCKED)
