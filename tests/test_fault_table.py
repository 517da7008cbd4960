"""Issue 7: a fault at every external call and every step boundary of the runtime
lane, the helper lane and the mirror feed, and the table in docs/reliability.md.

For each subject one clean run with ``VQ_ADMIN_FAULT_LOG`` lists the calls and
step boundaries; then each call gets the faults of :func:`modes_for` and each
boundary a SIGKILL of vq-admin (tests/fault_table.py judges every row).  The
rows must equal the table in docs/reliability.md: regenerate it with
``python3 scripts/reliability_table.py`` after a deliberate change.
"""

from __future__ import annotations

import os
import threading

import pytest

from fault_table import (DOC, TABLE_ENV, close_masters, doc_rows, enumerate_targets, leaked_masters, record,
                         run_table)
from fault_worlds import WORLDS

pytestmark = pytest.mark.real
#: Independent copies of each world the rows are spread over (2 cores here).
WORKERS = 2
ALL_MODES = ("drop-before", "drop-after", "timeout", "kill")
BOTH_DROPS = ("drop-before", "drop-after")


def modes_for(step: str | None, where: str, what: str) -> tuple[str, ...]:
    """Every call gets both drops; the calls that change something on a host (the
    deploy, the helper command, the push, the preparer) get the timeout and the kill too."""
    if step in ("deploy", "helper", "mirror-feed", "prepare"):
        return ALL_MODES
    return BOTH_DROPS


def mirror_window():
    """The mirror subject walks the feed only: the tag listing of the ref set and every
    call and boundary from mirror-probe to prepare (the rest is the runtime subject)."""
    inside = {"on": False}

    def window(step, entry) -> bool:
        if entry.get("step") == "mirror-probe" and entry.get("when") == "before":
            inside["on"] = True
        keep = inside["on"] or "for-each-ref" in entry.get("argv", [])
        if entry.get("step") == "prepare" and entry.get("when") == "after":
            inside["on"] = False
        return keep

    return window


def make_worlds(lane: str, tmp_path, sshd, count: int):
    worlds = [WORLDS[lane](tmp_path / f"{lane}-{i}", sshd) for i in range(count)]
    errors: list[BaseException] = []

    def setup(world):
        try:
            world.setup()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=setup, args=(w,)) for w in worlds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return worlds


@pytest.mark.parametrize("lane", ["runtime", "helper", "mirror"])
def test_fault_table(lane, tmp_path, real_sshd):
    masters = leaked_masters()
    try:
        worlds = make_worlds(lane, tmp_path, real_sshd, WORKERS)
        log = tmp_path / "calls.jsonl"
        worlds[0].reset()
        clean = worlds[0].run(env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT_LOG": str(log)})
        assert clean.exit_code == 0 and clean.json()["outcome"] == "ok", clean.stdout + clean.stderr
        targets = enumerate_targets(log, modes_for, mirror_window() if lane == "mirror" else None)
        assert len(targets) >= 10, targets
        rows = run_table(worlds, targets)
    finally:
        close_masters(leaked_masters() - masters)
    record(rows)
    failed = [r.line() for r in rows if r.problems]
    assert not failed, f"{len(failed)} of {len(rows)} rows are not acceptable:\n" + "\n".join(failed)
    if os.environ.get(TABLE_ENV):
        return  # scripts/reliability_table.py is rewriting the table from these rows
    produced = [r.line() for r in rows]
    documented = doc_rows(lane)
    assert documented == produced, (
        f"the {lane} rows of {DOC} do not match this run; run python3 scripts/reliability_table.py\n"
        + "\n".join(f"- {d}" for d in documented if d not in produced)
        + "\n" + "\n".join(f"+ {p}" for p in produced if p not in documented))
