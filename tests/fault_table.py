"""The fault table: enumerate every external call and step boundary of one clean
run (``VQ_ADMIN_FAULT_LOG``), inject a fault into each (``VQ_ADMIN_FAULT``,
see vq_admin/core/failpoints.py), and judge each row against the only acceptable
behaviours (docs/reliability.md, "What each outcome promises").

A row is judged by :func:`run_row`; the worlds are in tests/fault_worlds.py and
the table is checked against docs/reliability.md by tests/test_fault_table.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from support import run_vq

from fault_worlds import RUN_TIMEOUT, World

EXIT = {"ok": 0, "already-current": 0, "failed": 1, "usage": 2, "unknown": 3, "locked": 75, "refused": 77}
KILLED = -signal.SIGKILL
DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
BEGIN, END = "<!-- fault-table:begin -->", "<!-- fault-table:end -->"
TABLE_ENV = "VQ_ADMIN_RELIABILITY_TABLE"
_HEX = re.compile(r"\A[0-9a-f]{7,64}\Z")
_SHA = re.compile(r"[0-9a-f]{40,64}")


@dataclass(frozen=True)
class Target:
    """One place to inject: a call index or a step boundary, with a stable label."""

    label: str
    rule: str      # the VQ_ADMIN_FAULT rule without its mode, e.g. "call:5" or "step:deploy"
    modes: tuple[str, ...]


@dataclass
class Row:
    lane: str
    target: str
    fault: str
    expected: str = ""
    outcome: str = ""
    exit: int | None = None
    next_run: str = "-"
    problems: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "pass" if not self.problems else "FAIL: " + "; ".join(self.problems)

    def cells(self) -> list[str]:
        code = "SIGKILL" if self.exit == KILLED else str(self.exit)
        return [self.lane, self.target, self.fault, self.expected, self.outcome, code, self.next_run, self.verdict]

    def line(self) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in self.cells()) + " |"


# -- enumeration ------------------------------------------------------------------------


def describe(argv: list[str], where: str) -> str:
    """A short, path-free description of a logged argv (the log keeps its first six words)."""
    if os.path.basename(argv[0]) == "ssh" and where == "local":
        return "ssh -O exit (close the shared connection)"
    words, skip = [os.path.basename(argv[0])], False
    for word in argv[1:]:
        if skip or word in ("-C", "-F", "-o"):
            skip = not skip
            continue
        if "/" in word or _HEX.match(word) or word.startswith("stage.") or word.startswith("--format=%"):
            continue
        words.append(_SHA.sub("<sha>", word))
    return " ".join(words[:3])


def enumerate_targets(log: Path, modes_for, window=None) -> list[Target]:
    """Every call (with the step it ran in) and every step boundary seen in one clean run.

    *modes_for(step, where, words)* gives the fault modes of a call; *window*
    (optional) limits the walk to calls and boundaries for which
    ``window(step_or_None, entry)`` is true.
    """
    calls, steps, open_step = [], [], None
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if "step" in entry:
            open_step = entry["step"] if entry["when"] == "before" else None
            if window is None or window(entry["step"], entry):
                steps.append(Target(f"step {entry['step']}, {entry['when']}", f"step:{entry['step']}",
                                    ("sigkill",) if entry["when"] == "before" else ("sigkill-after",)))
            continue
        if window is not None and not window(open_step, entry):
            continue
        what = describe(entry["argv"], entry["where"])
        label = f"call {entry['index']} [{open_step or '-'}] {entry['where']}: {what}"
        calls.append(Target(label, f"call:{entry['index']}", modes_for(open_step, entry["where"], what)))
    return calls + steps


# -- the one expected outcome of each row ----------------------------------------------

#: Read-only steps before anything changed: an interruption there is unknown ("nothing was deployed or activated"), but
#: the run's first agent call cut before the agent said a word is failed: the host was not reached.
READ_ONLY_FIRST = ("pre-verify", "pre-verify-readback", "pre-identity")
#: Steps that prepare without changing what runs (stages, mirror reads): nothing was installed -> failed.
NOTHING_INSTALLED = ("stage-create", "stage-receive", "stage-verify", "mirror-probe", "mirror-read", "mirror-symrefs",
                     "check-commands", "check-levels")
#: Steps that change a host: a drop after, a timeout or a kill is resolved by read-back (here: proven -> ok).
MUTATING = ("deploy", "helper", "mirror-feed")
#: Steps after the change whose loss the read-back resolves (here: proven -> ok).
AFTER_CHANGE = ("verify", "verify-readback", "stage-reclaim")


def expected_outcome(label: str, fault: str) -> str:
    """The one acceptable outcome of a row (docs/reliability.md, "One expected outcome per row").

    * vq-admin SIGKILLed at a step boundary: ``killed`` (no receipt; the next run converges);
    * a driver-side read before any step (git in the checkout) or closing the shared connection:
      ``failed`` (nothing ran anywhere) and ``ok`` (the work was done) respectively;
    * the read-only pre-verify (or pre-identity): ``unknown``, "nothing was deployed or activated"; but the run's
      first agent call (``session``) dropped before it ran: ``failed``, the host was not reached
      (CONTRACT section 15);
    * staging, the mirror reads and the command-file checks: ``failed``, nothing was installed;
    * a mutating call: dropped before it ran, ``unknown`` (the read-back cannot prove the new
      identity; the mirror feed's read-back proves nothing changed, so ``failed`` there); dropped
      after, timed out or killed, ``ok`` by read-back -- never ``failed``;
    * the final verify, its hash read-back, stage-reclaim: ``ok`` (resolved by a fresh read-back);
    * the helper's read-back itself and mirror-confirm: ``unknown`` (the read that would resolve it
      was the one lost); the preparer: ``unknown`` (it cannot be read back).
    """
    if fault in ("sigkill", "sigkill-after"):
        return "killed"
    match = re.search(r"\[([^\]]+)\]", label)
    step = re.sub(r"-\d+\Z", "", match.group(1)) if match else "-"  # check-commands-2: a second host's
    if step == "-":
        return "ok" if "ssh -O exit" in label else "failed"
    if step in READ_ONLY_FIRST:
        return "failed" if fault == "drop-before" and "vq-admin-agent session" in label else "unknown"
    if step in NOTHING_INSTALLED:
        return "failed"
    if step in MUTATING:
        if fault == "drop-before":
            return "failed" if step == "mirror-feed" else "unknown"
        return "ok"
    if step in AFTER_CHANGE:
        return "ok"
    if step in ("readback", "mirror-confirm", "prepare"):
        return "unknown"
    return "?"


# -- judging one row --------------------------------------------------------------------


def state_problems(state: Path) -> list[str]:
    """Every JSON file of the state directory parses, the admin log is whole lines of
    JSON, and no temporary file is left (kills at step boundaries never interrupt a write)."""
    problems = []
    for path in state.rglob("*"):
        if path.name.startswith(".tmp.") or ".holder." in path.name:
            problems.append(f"temporary file left: {path.relative_to(state)}")
        elif path.suffix == ".json" and path.is_file():
            try:
                if not isinstance(json.loads(path.read_text()), dict):
                    problems.append(f"{path.relative_to(state)} is not a JSON object")
            except ValueError:
                problems.append(f"{path.relative_to(state)} does not parse")
    log = state / "admin.log"
    if log.exists():
        data = log.read_text()
        if data and not data.endswith("\n"):
            problems.append("admin.log ends in a partial line")
        for line in data.splitlines():
            try:
                json.loads(line)
            except ValueError:
                problems.append("admin.log holds a line that is not JSON")
    return problems


def log_lines(state: Path) -> list[str]:
    try:
        return (state / "admin.log").read_text().splitlines()
    except FileNotFoundError:
        return []


def judge_printed(world: World, done, lines_before: int, problems: list[str]) -> dict | None:
    """The receipt a finished run printed: one JSON document, stored, logged, consistent."""
    try:
        receipt = json.loads(done.stdout)
    except ValueError:
        problems.append(f"stdout is not one JSON document: {done.stdout[:200]!r}")
        return None
    outcome = receipt.get("outcome")
    if EXIT.get(outcome) != done.exit_code or receipt.get("exit_code") != done.exit_code:
        problems.append(f"outcome {outcome} / receipt exit {receipt.get('exit_code')} / process exit {done.exit_code}")
    stored = world.state / "receipts" / f"{receipt.get('id')}.json"
    if not stored.exists() or json.loads(stored.read_text()) != receipt:
        problems.append("the printed receipt is not the stored one")
    lines = log_lines(world.state)
    if len(lines) != lines_before + 1 or json.loads(lines[-1]).get("outcome") != outcome:
        problems.append(f"admin.log gained {len(lines) - lines_before} lines, expected one for this run")
    return receipt


def judge_outcome(world: World, receipt: dict, before: dict, problems: list[str], expected: str | None = None) -> None:
    outcome = receipt["outcome"]
    if expected is not None and outcome != expected:
        problems.append(f"expected {expected}, got {outcome}")
    if outcome == "failed" and any(s.get("status") == "interrupted" for s in receipt.get("steps", [])):
        text = " ".join(receipt.get("errors") or [])
        if "interrupted" not in text and "nothing" not in text:
            problems.append("failed after an interrupted step without saying the transport was interrupted")
    if outcome in ("ok", "already-current"):
        problem = world.active_problem(world.b, receipt)
        if problem:
            problems.append(f"FALSE SUCCESS: {problem}")
        return
    if outcome not in ("failed", "refused", "unknown"):
        problems.append(f"outcome {outcome} is not acceptable here")
    if outcome == "unknown":
        if not (receipt.get("readback") or {}).get("next_command"):
            problems.append("unknown without readback.next_command")
    elif not receipt.get("errors"):
        problems.append(f"{outcome} without errors")
    if outcome == "refused" and world.current_sha() != before["current"]:
        problems.append("refused, but current changed")
    for which in ("last-ok", "last-good"):
        if (world.lane_record(which) or {}).get("sha") != before[which]:
            problems.append(f"{which} moved on a {outcome} run")


def converge(world: World, receipt: dict | None, problems: list[str]) -> str:
    """The next run, without a fault: the rerun the receipt names (or the same update)."""
    argv = world.argv(world.b)
    named = (receipt or {}).get("readback", {}) or {}
    if named.get("next_command"):
        words = shlex.split(named["next_command"])
        if words[:2] != ["vq", "admin"]:
            problems.append(f"next_command is not a vq admin command: {named['next_command']}")
        argv = words[2:]
    lines = len(log_lines(world.state))
    done = run_vq(*argv, "--json", config=world.config, state=world.state,
                  env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_HELPER_REREADS": "3",
                       "VQ_ADMIN_HELPER_REREAD_INTERVAL": "0.05"}, timeout=RUN_TIMEOUT)
    again = judge_printed(world, done, lines, problems)
    if again is None:
        return "no receipt"
    if again["outcome"] not in ("ok", "already-current"):
        problems.append(f"the next run did not converge: {again['outcome']} {again.get('errors')}")
    else:
        problem = world.active_problem(world.b, again)
        if problem:
            problems.append(f"after the next run: {problem}")
    return again["outcome"]


def run_row(world: World, target: Target, mode: str) -> Row:
    row = Row(world.lane, target.label, mode, expected_outcome(target.label, mode))
    world.reset()
    before = {"current": world.current_sha(), "last-ok": (world.lane_record("last-ok") or {}).get("sha"),
              "last-good": (world.lane_record("last-good") or {}).get("sha")}
    lines_before = len(log_lines(world.state))
    done = world.run(env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT": f"{target.rule}:{mode}"})
    row.exit = done.exit_code
    if "Traceback" in done.stderr:
        row.problems.append("traceback on stderr")
    receipt = None
    if done.exit_code == KILLED:
        row.outcome = "killed"
        if row.expected != "killed":
            row.problems.append(f"expected {row.expected}, got killed")
        if done.stdout:
            row.problems.append("a killed run printed a partial receipt")
        if len(log_lines(world.state)) != lines_before:
            row.problems.append("a killed run changed the admin log")
        last_ok = (world.lane_record("last-ok") or {}).get("sha")
        if last_ok not in (before["last-ok"], world.b):
            row.problems.append(f"LAST OK is {last_ok}")
        if last_ok == world.b and world.active_problem(world.b, None):
            row.problems.append("LAST OK names B but B is not active")
        if (world.lane_record("last-good") or {}).get("sha") not in (before["last-good"], before["last-ok"]):
            row.problems.append("LAST GOOD is neither the old LAST GOOD nor the old LAST OK")
    else:
        receipt = judge_printed(world, done, lines_before, row.problems)
        if receipt is not None:
            row.outcome = receipt["outcome"]
            judge_outcome(world, receipt, before, row.problems, row.expected)
    row.problems.extend(state_problems(world.state))
    if row.outcome in ("killed", "unknown"):
        row.next_run = converge(world, receipt, row.problems)
    return row


# -- the table --------------------------------------------------------------------------


def run_table(worlds: list[World], targets: list[Target]) -> list[Row]:
    """Every (target, mode), spread over *worlds* (independent copies of one subject)."""
    return run_rows(worlds, [(t, m) for t in targets for m in t.modes])


def run_rows(worlds: list[World], work: list[tuple[Target, str]]) -> list[Row]:
    """The rows *work* (a target and one of its modes each), spread over *worlds*, in *work*'s order."""
    rows: list[Row | None] = [None] * len(work)
    lock = threading.Lock()
    queue = list(enumerate(work))

    def worker(world: World) -> None:
        while True:
            with lock:
                if not queue:
                    return
                index, (target, mode) = queue.pop(0)
            try:
                rows[index] = run_row(world, target, mode)
            except Exception as exc:  # a harness failure is a failed row, never a lost one
                rows[index] = Row(world.lane, target.label, mode, expected_outcome(target.label, mode), "harness error",
                                  None, "-", [repr(exc)])

    threads = [threading.Thread(target=worker, args=(w,)) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in rows if r is not None]


def doc_rows(lane: str, doc: Path = DOC) -> list[str]:
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        return []
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return [line for line in table.splitlines() if line.startswith(f"| {lane} |")]


def record(rows: list[Row], indices: list[int]) -> None:
    """With VQ_ADMIN_RELIABILITY_TABLE=PATH, append the rows (JSON lines) for scripts/reliability_table.py,
    each with its place in its subject's table (*indices*: a test runs one chunk of a table)."""
    path = os.environ.get(TABLE_ENV)
    if path:
        with open(path, "a") as fh:
            for row, index in zip(rows, indices, strict=True):
                fh.write(json.dumps({"lane": row.lane, "index": index, "line": row.line()}) + "\n")


def leaked_masters() -> set[str]:
    return {d for d in os.listdir("/tmp") if d.startswith("vqssh-")}


def close_masters(names: set[str]) -> None:
    """A SIGKILLed run cannot close its shared ssh connection (ControlPersist ends it
    after 120 s); close and remove those of this test at once.

    Only directories whose run is gone (``vqssh-<pid>-*`` with a dead pid): /tmp is
    shared, and a live run's directory (another test's, another user's) is never touched.
    """
    from vq_admin.core.procs import process_alive

    for name in names:
        owner = name[len("vqssh-"):].split("-", 1)[0]
        if not (owner.isdigit() and "-" in name[len("vqssh-"):]) or process_alive(int(owner)):
            continue
        directory = Path("/tmp") / name
        for sock in directory.glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "unused"], capture_output=True,
                           timeout=10)
        subprocess.run(["rm", "-rf", str(directory)], check=False)
