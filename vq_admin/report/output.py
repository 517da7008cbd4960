"""What a run prints.

* ``--json``: exactly one JSON document on stdout, on success and on failure;
  narration goes to stderr.
* otherwise a short human summary: on stdout when it is a terminal (or with
  ``--verbose``); nothing at all on success when stdout is not a terminal, so
  cron mails only on failure; on failure, on stderr.

Text that came from a remote host is escaped before it reaches a terminal.
"""

from __future__ import annotations

import sys

from ..core.escape import escape, message
TYPE_CHECKING = False  # not typing's: vq admin launcher (per job) never imports typing
if TYPE_CHECKING:
    from typing import TextIO

    from ..document import JsonObject
    from .sections import CommandOutput, Confirm, Deploy, PlannedStep, ReceiptView, Rollback, Verify

#: Continuation lines of a multi-line value start here, so text from a host cannot pose as a field.
CONTINUATION = " " * 12


def safe_text(text: str) -> str:
    """Escape control characters (terminal escape sequences included; :mod:`vq_admin.core.escape`); tab and
    newline stay."""
    return escape(text, keep="\t\n")


def safe_message(text: str) -> str:
    """A one-line message as printed: every control character escaped (a newline too) and each echoed
    value longer than 200 characters shortened with its length (:func:`vq_admin.core.escape.message`)."""
    return message(text, keep="\t")


#: How much of a command's last stderr line the one-line error carries.
LAST_LINE = 200
#: How many of a failed provider command's last stderr lines its run's summary shows.
STDERR_LINES = 5
#: The line a Python traceback starts with: a failed run's summary shows its last line (the exception).
TRACEBACK = "Traceback (most recent call last):"


def bounded(line: str, limit: int = LAST_LINE) -> str:
    """*line* escaped (tabs as spaces), at most *limit* characters: a longer one keeps its start and its end
    around `` ... `` (the end of ``CalledProcessError: Command '[...]' returned non-zero exit status 1.``
    says what failed)."""
    line = safe_text(line.strip().replace("\t", " "))
    if len(line) <= limit:
        return line
    keep = (limit - 5) // 2
    return f"{line[:keep]} ... {line[-keep:]}"


def last_line(text: str) -> str:
    """*text*'s last non-empty line, escaped and bounded (what a one-line error quotes of a command's stderr)."""
    return (stderr_tail(text, 1) or ["(no message on stderr)"])[0]


def stderr_tail(text: str, count: int = STDERR_LINES) -> list[str]:
    """The last *count* non-empty lines of a command's stderr, each :func:`bounded`, for a failed run's summary.
    A Python traceback at the end is its exception line alone, so what the command printed before it (the
    error of the tool it ran) is still shown."""
    lines = [line for line in text.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK]
    if starts and starts[-1] < len(lines) - 1:
        lines = lines[:starts[-1]] + lines[-1:]
    return [bounded(line) for line in lines[-count:]]


def _field(name: str, value: object) -> str:
    """``  name      value``; the lines of a multi-line value are indented under the value."""
    return f"  {name:<9} " + str(value).replace("\n", "\n" + CONTINUATION)


def print_json(document: JsonObject, stream: TextIO | None = None) -> None:
    """Print *document* in envelope order (:func:`vq_admin.report.envelope.ordered`), unchecked.

    Verbs print through :mod:`vq_admin.report.envelope` (``emit``/``write``), which also checks the
    envelope; this stays for the per-job ``launcher`` path, whose documents carry no ``errors``."""
    from .envelope import dumps

    stream = stream or sys.stdout
    stream.write(dumps(document))
    stream.flush()


def receipt_summary(receipt: JsonObject, receipt_path: str | None) -> list[str]:
    """A receipt document as the operator reads it (:class:`vq_admin.report.sections.ReceiptView`)."""
    from .sections import ReceiptView

    view = ReceiptView.from_value(receipt, "receipt")
    first = f"vq-admin: {_lane(view.lane, view.program)} on {view.host}: {view.outcome} (exit {view.exit_code})"
    succeeded = view.outcome in ("ok", "already-current")
    lines = [first.replace("\n", "\n" + CONTINUATION)]
    lines += [_field(key, value) for key, value in (("sha", view.expected_sha), ("tag", view.tag)) if value]
    lines += [] if view.reverted else _proof_lines(view.verify)
    if view.rollback and succeeded:
        lines.append(_field("rollback", _rollback_text(view, view.rollback)))
    if view.prune and (view.prune.removed or succeeded):  # what a prune did
        lines += generation_lines(view.prune.keep, view.prune.removed)
    lines += _deploy_lines(view, succeeded)
    return [safe_text(line) for line in lines + _closing_lines(view, receipt_path)]


def _deploy_lines(view: ReceiptView, succeeded: bool) -> list[str]:
    """The provider command the run ran and its exit; where a failed run's transcript is."""
    lines, deploy = [], view.deploy
    if isinstance(deploy.exit_code, int):
        job = f", job {deploy.job_id}" if deploy.job_id else ""
        via = view.rollback.via if view.rollback else None
        command = "prune" if view.prune else "activate" if via == "activate" else "deploy"
        lines.append(_field(command, f"exit {deploy.exit_code}{job}"))
    if succeeded or view.confirm:  # a failed confirmation says what it found in its own lines
        return lines
    return lines + _transcript_lines(deploy, view.command_output)


def _closing_lines(view: ReceiptView, receipt_path: str | None) -> list[str]:
    """Notes, errors, the next command a read-back asks for, and where the receipt is."""
    lines = _confirm_lines(view) + [_field("note", note) for note in view.notes]
    lines += [_field("error", error) for error in view.errors]
    readback = view.readback
    if readback and readback.next_command:
        lines.append(_field("next", readback.next_command))
        lines += [_field("", readback.advice)] if readback.advice else []
    return lines + ([_field("receipt", receipt_path)] if receipt_path else [])


def _proof_lines(verify: Verify) -> list[str]:
    """The launcher and its SHA-256 the final verify (or the read-back) proved."""
    final = verify.final or verify.readback or {}
    vr = final.get("receipt")
    if not (isinstance(vr, dict) and final.get("proven")):
        return []
    return [_field("launcher", vr["active_path"]), _field("sha256", vr["active_path_sha256"])]


def _rollback_text(view: ReceiptView, rollback: Rollback) -> str:
    to = str(rollback.to)[:12]
    if view.outcome != "ok":
        return f"{to} was already active on {view.host}; nothing was changed"
    via = "activation" if rollback.via == "activate" else "rebuilt by the provider's update"
    was = rollback.from_[:12] if rollback.from_ else "nothing active"
    return f"rolled back {view.program} on {view.host} from {was} to {to} ({via})"


def _confirm_lines(view: ReceiptView) -> list[str]:
    """The confirmation job (CONTRACT section 13): its end and metrics; a revert and whether it was proven."""
    confirm, reverted = view.confirm, view.reverted
    if not confirm:
        return []
    lines = [_field("confirm", _confirm_end(confirm))]
    if confirm.accepted:
        lines.append(_field("accepted", f"{confirm.accepted.reason}: " + "; ".join(confirm.accepted.regressed or [])))
    if reverted:
        proven = "proven by a read-only verify" if reverted.proven else "NOT proven"
        lines.append(_field("reverted", f"{reverted.from_[:12]} -> {reverted.to[:12]} "
                                        f"({proven}); the queue keeps {reverted.to[:12]}"))
    if confirm.passed is False:
        output = confirm.output
        tail = (stderr_tail(output.stderr) or stderr_tail(output.stdout)) if output else []
        lines += [_field("job said", "\n".join(tail))] if tail else []
        lines.append(_field("log dir", str(confirm.attempt_dir)))
    return lines


def _confirm_end(confirm: Confirm) -> str:
    """``job 42 COMPLETED exit 0 on node1 in 3.2 s; energy=-1.5``."""
    from ..document import given

    exit_code = given(confirm.exit_code)
    found = confirm.metrics if isinstance(confirm.metrics, dict) else {}
    metrics = " ".join(f"{k}={v}" for k, v in sorted(found.items()))
    seconds = f" in {confirm.seconds:.1f} s" if isinstance(confirm.seconds, (int, float)) else ""
    node = f" on {confirm.node}" if confirm.node else ""
    return (f"job {confirm.job_id or '?'} {confirm.state or 'not ended'} exit {exit_code}{node}{seconds}"
            + (f"; {metrics}" if metrics else ""))


def _transcript_lines(deploy: Deploy, output: CommandOutput) -> list[str]:
    """A run that did not succeed: the provider command's last stderr lines, the directory that holds its
    whole transcript on the host (``log dir``) and the driver's copy of it (``log copy``)."""
    lines = []
    tail = stderr_tail(output.stderr or "")
    if tail:
        lines.append(_field("stderr", "\n".join(tail)))
    log_dir = deploy.log_dir or output.log_dir
    if log_dir:
        lines.append(_field("log dir", f"{log_dir} on {deploy.where}" if deploy.where else log_dir))
    if output.transcript:
        lines.append(_field("log copy", output.transcript))
    return lines


def generation_lines(keep: dict[str, list[str]], removed: list[str], *, dry_run: bool = False,
                     last_used: dict[str, str] | None = None) -> list[str]:
    """A prune's generations: each kept, with its reasons, then each removed (or, in a dry run, to be), each
    with its last recorded use when *last_used* is given (the dry run)."""
    kept, gone = ("keep", "remove") if dry_run else ("kept", "removed")

    def used(sha: str) -> str:
        return "" if last_used is None else f"  (last use: {last_used.get(sha) or 'none recorded'})"

    return ([_field(kept, f"{sha}  {', '.join(keep[sha])}{used(sha)}") for sha in sorted(keep)]
            + [_field(gone, f"{sha}{used(sha)}") for sha in removed])


def plan_summary(plan: JsonObject) -> list[str]:
    """A plan document as the operator reads it (:class:`vq_admin.report.sections.PlanView`)."""
    from .sections import PlanView

    view = PlanView.from_value(plan, "plan")
    lines = [f"vq-admin: dry run: {_lane(view.lane, view.program)} on {view.host}, {len(view.steps)} steps, "
             "nothing is run"]
    for i, step in enumerate(view.steps, 1):
        lines += _step_lines(f"{i:2d}.", step)
    if view.when_needed:
        lines.append("  only when needed:")
    for step in view.when_needed:
        lines += _step_lines("  -", step)
    return [safe_text(line) for line in lines]


def _lane(lane: str, program: str | None) -> str:
    """``runtime vibeqc`` (the lane and its program), or ``helper`` (a lane without one)."""
    return f"{lane} {program}" if program else lane


def _step_lines(mark: str, step: PlannedStep) -> list[str]:
    from ..ssh.transport import quote_argv

    env = " ".join(f"{k}={v}" for k, v in (step.env or {}).items())
    return [f"  {mark} {step.name} [{step.where}] {step.purpose}",
            f"      {env + ' ' if env else ''}{quote_argv(step.argv)}"]


def report(document: JsonObject, lines: list[str], *, as_json: bool, success: bool, verbose: bool) -> None:
    from .envelope import hold_interrupts

    hold_interrupts()
    if as_json:
        from .envelope import write

        write(document)
        return
    if success:
        if verbose or sys.stdout.isatty():
            print("\n".join(lines), flush=True)
    else:
        print("\n".join(lines), file=sys.stderr, flush=True)
