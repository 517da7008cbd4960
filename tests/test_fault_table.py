"""Issue 7: a fault at every external call and every step boundary of the runtime
lane, the helper lane and the mirror feed, and the table in docs/reliability.md.

For each subject one clean run with ``VQ_ADMIN_FAULT_LOG`` lists the calls and
step boundaries; then each call gets the faults of :func:`modes_for` and each
boundary a SIGKILL of vq-admin (tests/fault_table.py judges every row).  The
rows must equal the table in docs/reliability.md: regenerate it with
``python3 scripts/reliability_table.py`` after a deliberate change.

Each table runs in chunks (:data:`CHUNKS`), one test each, so that pytest-xdist
spreads it: every chunk checks the whole table's calls and faults against the
document and its own rows in full, and together the chunks run every row once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from fault_table import (DOC, TABLE_ENV, Row, Target, close_masters, doc_rows, enumerate_targets, leaked_masters,
                         record, run_rows)
from fault_worlds import WORLDS, World
from realhosts import SshdServer

pytestmark = pytest.mark.real
T = TypeVar("T")
#: Independent copies of each world a chunk's rows are spread over (the chunks themselves are
#: spread over pytest-xdist's workers).
WORKERS = 1
ALL_MODES = ("drop-before", "drop-after", "timeout", "kill")
BOTH_DROPS = ("drop-before", "drop-after")


def modes_for(step: str | None, where: str, what: str) -> tuple[str, ...]:
    """Every call gets both drops; the calls that change something on a host (the
    deploy, the helper command, the push, the preparer) get the timeout and the kill too."""
    if step in ("deploy", "helper", "mirror-feed", "prepare"):
        return ALL_MODES
    return BOTH_DROPS


def mirror_window() -> Callable[[str | None, dict[str, Any]], bool]:
    """The mirror subject walks the feed only: the tag listing of the ref set and every
    call and boundary from mirror-probe to prepare (the rest is the runtime subject)."""
    inside = {"on": False}

    def window(step: str | None, entry: dict[str, Any]) -> bool:
        if entry.get("step") == "mirror-probe" and entry.get("when") == "before":
            inside["on"] = True
        keep = inside["on"] or "for-each-ref" in entry.get("argv", [])
        if entry.get("step") == "prepare" and entry.get("when") == "after":
            inside["on"] = False
        return keep

    return window


#: Each subject's rows are cut into this many chunks, one test each, so that pytest-xdist spreads
#: a table over its workers (one table in one test was the suite's tail).  Chunk k of n holds the
#: rows k, k + n, k + 2n, ... of the table (the slow rows, the ones with a next run, are spread too).
#: Each chunk's worker sets its subject up once (two deploys and a clean run), so more chunks cost
#: CPU: with 8, 4 and 8 chunks the tables took 26 % more CPU-seconds than in one test each.
CHUNKS = {"runtime": 3, "helper": 2, "mirror": 3}
CASES = [(lane, k, n) for lane, n in CHUNKS.items() for k in range(n)]


def chunk(items: list[T], k: int, n: int) -> list[T]:
    """Chunk *k* (0-based) of *n* of the table's rows *items*."""
    return items[k::n]


def make_worlds(lane: str, tmp_path: Path, sshd: SshdServer, count: int) -> list[World]:
    worlds = [WORLDS[lane](tmp_path / f"{lane}-{i}", sshd) for i in range(count)]
    errors: list[BaseException] = []

    def setup(world: World) -> None:
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


#: Per pytest worker process, each subject's set-up worlds and the targets of their clean run:
#: a worker that gets several chunks of one subject builds it once.  Every row starts with
#: ``World.reset()``, so a world serves any number of rows (as it did within one test).
_SUBJECTS: dict[str, tuple[list[World], list[Target]]] = {}


def subject(lane: str, tmp_path_factory: pytest.TempPathFactory, sshd: SshdServer) -> tuple[list[World], list[Target]]:
    if lane not in _SUBJECTS:
        tmp = tmp_path_factory.mktemp(f"fault-{lane}")
        worlds = make_worlds(lane, tmp, sshd, WORKERS)
        log = tmp / "calls.jsonl"
        worlds[0].reset()
        clean = worlds[0].run(env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT_LOG": str(log)})
        assert clean.exit_code == 0 and clean.json()["outcome"] == "ok", clean.stdout + clean.stderr
        targets = enumerate_targets(log, modes_for, mirror_window() if lane == "mirror" else None)
        assert len(targets) >= 10, targets
        _SUBJECTS[lane] = (worlds, targets)
    return _SUBJECTS[lane]


def row_key(line: str) -> tuple[str, str]:
    """A table line's "call or step" and "fault" cells."""
    cells = line.split(" | ")
    return cells[1], cells[2]


@pytest.mark.parametrize(("lane", "k", "n"), CASES, ids=[f"{lane}-{k + 1}of{n}" for lane, k, n in CASES])
def test_fault_table(lane: str, k: int, n: int, tmp_path_factory: pytest.TempPathFactory,
                     real_sshd: SshdServer) -> None:
    masters = leaked_masters()
    try:
        worlds, targets = subject(lane, tmp_path_factory, real_sshd)
        work = [(t, m) for t in targets for m in t.modes]
        mine = chunk(list(range(len(work))), k, n)
        rows = run_rows(worlds, [work[i] for i in mine])
    finally:
        close_masters(leaked_masters() - masters)
    record(rows, mine)
    failed = [r.line() for r in rows if r.problems]
    assert not failed, f"{len(failed)} of {len(rows)} rows are not acceptable:\n" + "\n".join(failed)
    if os.environ.get(TABLE_ENV):
        return  # scripts/reliability_table.py is rewriting the table from these rows
    documented = doc_rows(lane)
    # The whole table's rows (call or step, fault), from the clean run, against the document's ...
    listed = [row_key(d) for d in documented]
    enumerated = [row_key(Row(lane, t.label, m).line()) for t, m in work]
    assert listed == enumerated, (
        f"the {lane} rows of {DOC} are not this run's calls and faults; run python3 scripts/reliability_table.py\n"
        + "\n".join(f"- {d}" for d in listed if d not in enumerated)
        + "\n" + "\n".join(f"+ {p}" for p in enumerated if p not in listed))
    # ... and this chunk's rows, run and judged, in full.
    produced = [r.line() for r in rows]
    expected = chunk(documented, k, n)
    assert expected == produced, (
        f"the {lane} rows of {DOC} do not match this run; run python3 scripts/reliability_table.py\n"
        + "\n".join(f"- {d}" for d in expected if d not in produced)
        + "\n" + "\n".join(f"+ {p}" for p in produced if p not in expected))


@pytest.mark.parametrize("lane", list(CHUNKS))
def test_the_chunks_cover_every_documented_row_once(lane: str) -> None:
    """The chunks of test_fault_table together run every row of the document exactly once."""
    documented = doc_rows(lane)
    n = CHUNKS[lane]
    assert len(documented) >= 2 * n, f"{len(documented)} {lane} rows for {n} chunks"
    seen = [i for k in range(n) for i in chunk(list(range(len(documented))), k, n)]
    assert sorted(seen) == list(range(len(documented)))
    assert all(chunk(documented, k, n) for k in range(n))
    assert sorted(d for k in range(n) for d in chunk(documented, k, n)) == sorted(documented)
