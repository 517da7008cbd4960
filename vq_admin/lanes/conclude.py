"""What both lanes share: concluding a run into receipt, state and admin log."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable

from ..context import RunContext
from ..core import exits
from ..report.outcome import Outcome
from ..report.output import last_line
from ..report.receipt import Receipt
from ..report.sections import Readback, Record, Registry
from ..core.stamps import utc_now
from ..state.records import LastRun, LogLine, Verified
from ..ssh.transport import quote_argv


def rerun_command(ctx: RunContext, receipt: Receipt) -> str:
    """The ``next`` hint of every run (interrupted, unknown, locked): the command line that, run as printed, reruns
    this run: the same verb (rollback and prune set ``receipt.rerun``; else ``update``), host, program,
    SHA, tag, placement options, ``--wait-lock``, ``--config`` and ``--state-dir``."""
    options = ctx.options
    words = list(receipt.rerun or ())
    if not words:
        words = ["vq", "admin", "update", *([receipt.program] if receipt.program else []), receipt.host]
        words += ["--expected-sha", receipt.expected_sha] if receipt.expected_sha else []
        words += ["--tag", receipt.tag] if receipt.tag else []
        words += ["--cluster-install"] if options.cluster_install else []
        words += [f"--update-script-arg={arg}" for arg in options.update_script_args]
    words += ["--wait-lock", f"{options.wait_lock:g}"] if options.wait_lock is not None else []
    words += ["--config", options.config] if options.config else []
    words += ["--state-dir", options.state_dir] if options.state_dir else []
    return quote_argv(words)


def conclude(ctx: RunContext, receipt: Receipt, outcome: Outcome, verified: Verified | None = None,
             *, lane_started: bool = True, recorded: Verified | None = None) -> Receipt:
    """Finish *receipt*; store it, the lane records and one admin-log line.

    A dry run stores nothing.  *verified* is given only for a verified success
    and is what LAST OK becomes; *recorded* (a prune's proven active generation; a failed
    confirmation's proven revert target, or its unconfirmed SHA when nothing was reverted) goes to the host's
    record only, as *verified* does, and moves nothing here.  A run refused before its lane started
    (*lane_started* false: no authority, no such profile) gets a receipt and a
    log line but leaves the lane's records alone; so does a usage error (exit 2: a
    ``provider_options`` typo the provider reports when asked), whenever it is found.  A locked run names the
    line to rerun.
    """
    receipt.finish(outcome, utc_now())
    if ctx.options.dry_run:
        return receipt
    if outcome is Outcome.LOCKED and receipt.readback is None:  # the line to run once the holder has ended
        receipt.readback = Readback(read="nothing: another run holds the lane, or a deployment is under way",
                                    proven=False, next_command=rerun_command(ctx, receipt),
                                    advice="rerun it once that has ended; it verifies read-only first")
    receipt.plan.skip_unrun()
    receipt_id = receipt.id or ctx.state.new_receipt_id(receipt.lane, receipt.host, receipt.program)
    receipt.id = receipt_id
    ran = lane_started and outcome not in (Outcome.LOCKED, Outcome.USAGE)  # else the last outcome stands
    if ran:  # the host's record, on the lease, before the receipt is stored
        _append_host_record(ctx, receipt, verified, recorded)
    if verified is not None:
        verified = verified.replace(receipt=receipt_id, at=receipt.finished_at)
    apply_registry = _plan_registry(ctx, receipt, verified)
    # The receipt first: every record written after it (registry entry, latest.json, LAST OK,
    # last.json, the admin log) names it, so none may exist without it.
    try:
        path = _store_receipt(ctx, receipt, receipt_id)
    except OSError as exc:
        return _not_stored(ctx, receipt, exc)
    record_lane = partial(ctx.state.record_run, receipt.lane, receipt.host, receipt.program,
                          _summary(receipt, outcome), verified)
    _store_after(ctx, receipt, path, [
        ("the registry entry of the verified launcher", apply_registry),
        ("the lane records (last.json" + (", LAST OK, LAST GOOD)" if verified else ")"), record_lane if ran else None),
        ("the admin log line", partial(ctx.state.append_log, _log_line(receipt, outcome, path))),
    ])
    return receipt


def _store_after(ctx: RunContext, receipt: Receipt, path: Path,
                 steps: list[tuple[str, Callable[[], object] | None]]) -> None:
    """Run each record's write (``None``: not this run's) after the receipt at *path* was stored; the
    stored receipt stands, and what could not be recorded is named in ``not_stored`` and the errors."""
    unstored: list[tuple[str, OSError | ValueError]] = []
    for what, write in steps:
        try:
            if write is not None:
                write()
        except (OSError, ValueError) as exc:
            unstored.append((what, exc))
    if unstored:
        receipt.not_stored = [f"{what}: {_reason(err)}" for what, err in unstored]
    receipt.errors += [f"could not store {what} in {ctx.state.root}: {_reason(err)} "
                       f"(the receipt {path} was stored)" for what, err in unstored]


def _append_host_record(ctx: RunContext, receipt: Receipt, verified: Verified | None,
                        recorded: Verified | None) -> None:
    """The run's entry in the host's record (when it proved something), then its roots; both named in
    ``receipt.record``."""
    from ..record.view import append_roots, append_run

    proved = verified if verified is not None else recorded
    entry = append_run(ctx, receipt, proved) if proved is not None else None
    roots = append_roots(ctx, receipt, verified)
    for said in (entry, None if roots is None else Record(roots=roots)):
        if said is not None:
            receipt.record = said if receipt.record is None else receipt.record.replace(**said.to_value())


def _plan_registry(ctx: RunContext, receipt: Receipt, verified: Verified | None) -> Callable[[], None] | None:
    """A verified runtime's registry entry, planned into ``receipt.registry``: the write to apply once the
    receipt is stored, or ``None`` (nothing to write, or the plan was refused)."""
    if verified is None or receipt.lane != "runtime" or receipt.program is None:
        return None
    from ..launcher import registry

    try:
        planned, apply = registry.plan_verified(ctx.state.root, receipt.host, receipt.program, verified)
        receipt.registry = Registry.from_value(planned, "registry")
    except registry.RegistryError as exc:
        receipt.registry = Registry(entry=None, error=str(exc))
        return None
    return apply


def _store_receipt(ctx: RunContext, receipt: Receipt, receipt_id: str) -> Path:
    """Store the receipt (its transcript first); the stored receipt's path."""
    transcript = ["receipts", f"{receipt_id}.transcript"]
    receipt.keep_transcript(lambda: ctx.state.tree.path(*transcript),
                            lambda name, data: ctx.state.tree.write_atomic(transcript, name, data))
    return ctx.state.store_receipt(receipt_id, receipt.to_dict())


def _summary(receipt: Receipt, outcome: Outcome) -> LastRun:
    """The lane's ``last.json``: the run's outcome, what it deployed, its receipt and first errors."""
    return LastRun(outcome=outcome.value, exit_code=outcome.exit_code, expected_sha=receipt.expected_sha,
                   tag=receipt.tag, receipt=receipt.id, at=receipt.finished_at, errors=tuple(receipt.errors[:5]))


def _log_line(receipt: Receipt, outcome: Outcome, path: Path) -> LogLine:
    """The run's admin-log line."""
    return LogLine(at=receipt.finished_at, lane=receipt.lane, host=receipt.host, program=receipt.program,
                   expected_sha=receipt.expected_sha, outcome=outcome.value, exit_code=outcome.exit_code,
                   receipt=str(path), errors=tuple(receipt.errors[:5]))


def unstored_warning(ctx: RunContext, receipt: Receipt) -> str | None:
    """What a run whose receipt or records could not be stored says on stderr in every mode (cron mails
    it; ``--json`` keeps stdout for the document): what is not recorded, what that means for the queue,
    and the rerun that records it.  ``None`` when everything was stored."""
    if not receipt.not_stored:
        return None
    outcome = receipt.outcome or Outcome.FAILED
    lane = f"{receipt.lane} {receipt.program}" if receipt.program else receipt.lane
    lines = [f"vq-admin: warning: {lane} on {receipt.host}: {outcome.value} (exit {outcome.exit_code}), but not "
             f"recorded in {ctx.state.root}: {', '.join(receipt.not_stored)}"]
    if outcome.success and any("LAST OK" in item or "registry" in item for item in receipt.not_stored):
        lines.append("  until it is recorded, LAST OK and the registry (what vq admin launcher hands the queue) "
                     "still name the previous generation")
    lines.append(f"  free space there, then rerun (it verifies read-only first and records it): "
                 f"{rerun_command(ctx, receipt)}")
    return "\n".join(lines)


def _reason(exc: OSError | ValueError) -> str:
    """Why a record was not stored: an OSError's strerror, else the exception's text."""
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def _not_stored(ctx: RunContext, receipt: Receipt, exc: OSError) -> Receipt:
    """The receipt could not be stored (a full or read-only state filesystem).

    Nothing that would name it is written (registry, LAST OK, last.json, the
    admin log); the receipt is still printed, saying what was not stored, so
    the outcome on the host is never lost from the operator's view.
    """
    reason = _reason(exc)
    if receipt.registry:
        receipt.registry = Registry(entry=None, error=f"not recorded: the receipt could not be stored ({reason})")
    receipt.not_stored = ["the receipt", "the registry entry", "the lane records (last.json, LAST OK)",
                                   "the admin log line"]
    receipt.errors.append(f"could not store the receipt in {ctx.state.root}: {reason}; nothing naming it was "
                          "recorded (registry, LAST OK, last.json, admin log): keep this printed receipt, free "
                          "space in the state directory, then rerun (it verifies read-only first)")
    receipt.stored = False
    return receipt


def provider_ended(ctx: RunContext, receipt: Receipt, what: str, exit_code: int | None,
                   reclaim: Callable[..., None]) -> Receipt | None:
    """What the provider's exit status decides: ``None`` for 0 (the run goes on); 75, its own
    lock held, is :func:`provider_locked`; any other is ``failed`` ("<what> exited N: <the last line
    of its stderr>", from the receipt's ``command_output``), the stage reclaimed as failed."""
    if exit_code == exits.PROVIDER_LOCKED:
        return provider_locked(ctx, receipt, what, reclaim)
    if exit_code != 0:
        receipt.errors.append(exited(what, exit_code, receipt.command_output.stderr or ""))
        reclaim(success=False)
        return conclude(ctx, receipt, Outcome.FAILED)
    return None


def exited(what: str, exit_code: int | None, stderr: str) -> str:
    """The one-line error of a provider command that failed: "<what> exited N: <its stderr's last line>"."""
    return f"{what} exited {exit_code}: {last_line(stderr)}"


def provider_locked(ctx: RunContext, receipt: Receipt, what: str, reclaim: Callable[..., None]) -> Receipt:
    """The provider's own lock is held (exit 75): outcome ``locked``; the stage is
    reclaimed as not failed (nothing was tried on it)."""
    receipt.errors.append(f"{what} exited {exits.PROVIDER_LOCKED} (EX_TEMPFAIL): its own host lock is held by another "
                          "deploy; nothing was changed by this run; rerun when that deploy has ended")
    reclaim(success=True)
    return conclude(ctx, receipt, Outcome.LOCKED)
