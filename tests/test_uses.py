"""The use record (vq_admin.launcher.uses): concurrent appends lose nothing, rotation and folding keep
counts exact, a lookup killed at any line leaves a record every reader takes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys

import pytest

from vq_admin.launcher import uses

HOST, PROGRAM, SHA = "cluster", "vibeqc", "b" * 40
LAUNCHER = f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python"


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    fd = os.open(path, os.O_RDONLY)
    yield fd
    os.close(fd)


def usage(root: int) -> uses.Usage:
    return uses.read(root, HOST, PROGRAM)[SHA]


def small_segments(monkeypatch) -> None:
    monkeypatch.setattr(uses, "SEGMENT_BYTES", 2000)
    monkeypatch.setattr(uses, "KEEP_SEGMENTS", 2)


def test_uses_are_counted_with_their_references(root):
    for ref in ("101", "102", None, "101"):
        uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, ref)
    found = usage(root)
    assert (found.count, found.refs, found.folded) == (4, {"101", "102"}, 0)
    assert found.first is not None and found.last is not None and found.first <= found.last
    assert uses.read(root, HOST, PROGRAM, since="2999-01-01")[SHA].count == 0


def test_sixteen_processes_with_rotation_lose_nothing(root, monkeypatch):
    small_segments(monkeypatch)  # ~20 uses per segment: hundreds of rotations and folds under contention
    children = []
    for worker in range(16):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(60):
                    uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, f"w{worker}-{i}")
            finally:
                os._exit(0)
        children.append(pid)
    assert all(os.waitpid(pid, 0)[1] == 0 for pid in children)
    found = usage(root)
    assert found.count == 16 * 60 and found.folded > 0  # exact across folds
    assert found.refs <= {f"w{w}-{i}" for w in range(16) for i in range(60)}
    assert len(found.refs) == found.count - found.folded  # every use of the kept segments, each reference once
    names = sorted(os.listdir(os.path.join(f"/proc/self/fd/{root}", "uses", HOST, PROGRAM, SHA)))
    assert len([n for n in names if n.endswith(".log") and n != uses.CURRENT]) <= uses.KEEP_SEGMENTS + 1


def test_torn_and_foreign_lines_never_break_a_reader(root):
    uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, "1")
    path = os.path.join(f"/proc/self/fd/{root}", "uses", HOST, PROGRAM, SHA, uses.CURRENT)
    with open(path, "ab") as fh:
        fh.write(b"not a use\n\xff\xfe\t\t\t\n2026-12-02T15:55:00.000000Z\tu\tr\xff\t/a\tb\n"  # foreign lines
                 b"2026-12-02T15:55:00.1")  # then a torn last line
    assert usage(root).count == 2  # the launcher is the rest of its line; a reference not UTF-8 reads with U+FFFD
    uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, "2")  # on its own line: the torn one is skipped, not glued
    found = usage(root)
    assert (found.count, found.refs) == (3, {"1", "r\ufffd", "2"})


def test_a_failing_rotation_never_counts_the_use_twice(root, monkeypatch):
    """The line is written before the rotation: its error is not the lookup's (a False from record_use
    would send the caller to append again)."""
    from vq_admin.launcher.plain_lookup import record_use

    monkeypatch.setattr(uses, "SEGMENT_BYTES", 1)

    def broken(dfd: int) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(uses, "rotate", broken)
    assert record_use(os.readlink(f"/proc/self/fd/{root}"), HOST, PROGRAM, SHA, LAUNCHER, "1") is True
    assert usage(root).count == 1


def test_an_unreadable_folded_record_is_never_overwritten(root, monkeypatch):
    small_segments(monkeypatch)
    monkeypatch.setattr(uses, "SEGMENT_BYTES", 1)
    monkeypatch.setattr(uses, "KEEP_SEGMENTS", 1)
    uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, "1")
    where = os.path.join(f"/proc/self/fd/{root}", "uses", HOST, PROGRAM, SHA)
    folded = os.path.join(where, uses.FOLDED)
    with open(folded, "w") as fh:
        json.dump({"days": {"2026-01-01": [500, "2026-01-01T00:00:00.000000Z", "2026-01-01T01:00:00.000000Z"]},
                   "segments": []}, fh)
    os.chmod(folded, 0o666)  # fails the secure-path rule: unreadable to the record, not absent
    before = open(folded, "rb").read()
    for i in range(3):
        uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, f"n{i}")  # each wants to fold: it aborts instead
    assert open(folded, "rb").read() == before
    segments = [n for n in os.listdir(where) if n.endswith(".log") and n != uses.CURRENT]
    assert len(segments) == 4  # every rotated segment kept: nothing counted was lost
    with pytest.raises(PermissionError):
        usage(root)  # never read as zero
    from vq_admin.launcher.recall import read_uses
    from vq_admin.report.outcome import VqAdminError

    with pytest.raises(VqAdminError, match="use record of vibeqc on cluster cannot be read"):
        read_uses(os.readlink(f"/proc/self/fd/{root}"), HOST, PROGRAM)  # prune keeps nothing it cannot count


def _killed_at(root: int, step: int) -> bool:
    """Append one use in a child that SIGKILLs itself at its *step*-th line executed in uses.py; whether
    it was killed before finishing."""
    pid = os.fork()
    if pid == 0:
        seen = [0]

        def trace(frame, event, arg):
            if frame.f_code.co_filename == uses.__file__:
                if event == "line":
                    seen[0] += 1
                    if seen[0] == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                return trace
            return None

        sys.settrace(trace)
        uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, f"s{step}")
        sys.settrace(None)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def test_sigkill_at_every_line_leaves_a_readable_exact_record(tmp_path, monkeypatch):
    """From the same state each time (a full segment to rotate, one beyond the kept ones to fold), a
    lookup killed at its 1st, 2nd, ... line: the record stays readable, the use counted once or not at all."""
    small_segments(monkeypatch)
    monkeypatch.setattr(uses, "SEGMENT_BYTES", 1)  # every append rotates and folds: every line is reached
    template = tmp_path / "template"
    template.mkdir(mode=0o700)
    fd = os.open(template, os.O_RDONLY)
    for i in range(4):
        uses.append(fd, HOST, PROGRAM, SHA, LAUNCHER, f"p{i}")
    monkeypatch.setattr(uses, "KEEP_SEGMENTS", 1)
    os.close(fd)
    step = 0
    while True:
        step += 1
        work = tmp_path / f"run{step}"
        shutil.copytree(template, work)
        fd = os.open(work, os.O_RDONLY)
        try:
            was_killed = _killed_at(fd, step)
            after = usage(fd)  # never fails
            assert after.count in (4, 5), step  # never a use counted twice, none of the earlier lost
            uses.append(fd, HOST, PROGRAM, SHA, LAUNCHER, "next")  # the next lookup is not hindered
            assert usage(fd).count == after.count + 1 and "next" in usage(fd).refs
        finally:
            os.close(fd)
        shutil.rmtree(work)
        if not was_killed:
            assert after.count == 5
            break
    assert step > 40  # every line of an append, a rotation and a fold was a kill point


def test_a_reference_that_would_break_a_line_is_refused(root):
    for ref in ("", "a b", "a\tb", "x" * 201, "é"):
        assert uses.ref_problem(ref)
        with pytest.raises(ValueError):
            uses.append(root, HOST, PROGRAM, SHA, LAUNCHER, ref)


def _last_document(capsys) -> str:
    out = capsys.readouterr().out
    return out[out.index("{"):]


def test_the_console_script_records_each_use_and_refuses_a_bad_reference(tmp_path, capsys):
    from vq_admin import entry
    from vq_admin.launcher import registry
    from vq_admin.state.records import Verified

    state = tmp_path / "state"
    registry.record_verified(state, HOST, PROGRAM, Verified(sha=SHA, tag=None, launcher=LAUNCHER, receipt="r",
                                                            launcher_sha256="e" * 64, at="2026-11-30T00:00:00Z"))
    base = ["launcher", PROGRAM, HOST, "--state-dir", str(state)]
    assert entry.main([*base, "--job", "4711"]) == 0  # the plain path
    assert entry.main([*base, "--job", "4712", "--json"]) == 0  # the full command
    pin = json.loads(_last_document(capsys))["pin"]
    assert entry.main([*base, "--pin", json.dumps(pin), "--job", "4713"]) == 0  # the dispatch-time check
    assert entry.main(base) == 0  # a use without a reference
    assert entry.main([*base, "--job", "a b"]) == 2
    fd = os.open(state, os.O_RDONLY)
    try:
        found = usage(fd)
    finally:
        os.close(fd)
    assert (found.count, found.refs) == (4, {"4711", "4712", "4713"})
    assert LAUNCHER in capsys.readouterr().out


def test_a_launcher_visible_here_that_is_missing_or_changed_is_refused(tmp_path, capsys):
    """CONTRACT 12: where the launcher's path is visible on the driver, a lookup that finds it missing or
    changed exits 77 (launcher-gone), never 0 with a dead path; a path not visible here is not judged."""
    import hashlib

    from vq_admin import entry
    from vq_admin.launcher import registry
    from vq_admin.state.records import Verified

    state = tmp_path / "state"
    launcher = tmp_path / "apps" / "releases" / SHA / "bin" / f"tool-{SHA}"
    launcher.parent.mkdir(parents=True)
    launcher.write_bytes(b"#!/bin/sh\nexit 0\n")
    elsewhere = "c" * 40
    for sha, path, digest in ((SHA, str(launcher), hashlib.sha256(launcher.read_bytes()).hexdigest()),
                              (elsewhere, f"/nonexistent/releases/{elsewhere}/bin/tool-{elsewhere}", "e" * 64)):
        registry.record_verified(state, HOST, PROGRAM, Verified(sha=sha, tag=None, launcher=path, receipt="r",
                                                                launcher_sha256=digest, at="2026-11-30T00:00:00Z"))

    def lookup(sha: str, *extra: str) -> int:
        capsys.readouterr()
        return entry.main(["launcher", PROGRAM, HOST, "--expected-sha", sha, "--state-dir", str(state), *extra])

    assert lookup(SHA) == 0 and capsys.readouterr().out == f"{launcher}\n"  # first sight: hashed, its stat cached
    assert (state / "registry" / HOST / PROGRAM / "seen" / SHA).exists()
    assert lookup(SHA, "--json") == 0  # the full lookup agrees
    assert lookup(elsewhere) == 0  # not visible here: the login host's read-back decides
    launcher.write_bytes(b"#!/bin/sh\nexit 1\n")
    assert lookup(SHA) == 77
    err = capsys.readouterr().err
    assert "refused (launcher-gone)" in err and "changed:" in err and "vq admin update" in err
    launcher.unlink()
    assert lookup(SHA) == 77 and "missing:" in capsys.readouterr().err
    launcher.parent.parent.parent.rename(tmp_path / "gone")  # the release directory is gone
    assert lookup(SHA) == 77 and "missing:" in capsys.readouterr().err


def test_since_and_the_quarantine_statement(tmp_path):
    from vq_admin.launcher.quarantine import statement
    from vq_admin.record.statement import QUARANTINE
    from vq_admin.state.records import StateDir
    from vq_admin.launcher.recall import since_stamp
    from vq_admin.report.outcome import UsageError

    assert since_stamp("2026-11-30") == "2026-11-30T00:00:00.000000Z"
    assert since_stamp("2026-11-30T10:00:00Z") == "2026-11-30T10:00:00.000000Z"
    for bad in ("yesterday", "2026-11-30T10:00", "2026-11-30 10:00:00Z"):
        with pytest.raises(UsageError):
            since_stamp(bad)
    text = statement(StateDir(tmp_path / "state"), HOST, PROGRAM, SHA, "quarantine", "wrong results",
                     "2026-12-02T10:00:00Z", LAUNCHER, "e" * 64)
    assert text.endswith(b"\n") and text.count(b"\n") == 1
    doc = json.loads(text)
    assert doc["_type"] == "https://in-toto.io/Statement/v1" and doc["predicateType"] == QUARANTINE
    assert doc["subject"] == [{"name": LAUNCHER, "digest": {"sha256": "e" * 64}}]
    assert doc["predicate"]["driver"].count("/") == 1  # this state directory's driver id, as the record's entries
    assert {k: doc["predicate"][k] for k in ("action", "sha", "reason")} == {"action": "quarantine", "sha": SHA,
                                                                             "reason": "wrong results"}


def _lane(tmp_path) -> int:
    lane = tmp_path / "lane"
    lane.mkdir(mode=0o700)
    return os.open(lane, os.O_RDONLY | os.O_DIRECTORY)


def test_a_fifo_in_the_launchers_place_is_refused_without_blocking(tmp_path):
    import threading

    from vq_admin.launcher.present import launcher_problem_here

    launcher = tmp_path / "releases" / SHA / f"tool-{SHA}"
    launcher.parent.mkdir(parents=True)
    os.mkfifo(launcher)
    lane = _lane(tmp_path)
    found: list[str | None] = []
    worker = threading.Thread(target=lambda: found.append(launcher_problem_here(lane, SHA, str(launcher), "e" * 64)),
                              daemon=True)
    worker.start()
    worker.join(10)
    os.close(lane)
    assert found and found[0] is not None and "not a regular file" in found[0]


def test_a_swap_between_stat_and_hash_never_plants_a_seen_entry(tmp_path, monkeypatch):
    """The bad file is at the path when looked at; the good one is swapped in before the bytes are hashed,
    then swapped out again: what is hashed is what was looked at, so the bad file is never cached as good."""
    import hashlib

    from vq_admin.launcher import present

    launcher = tmp_path / "releases" / SHA / f"tool-{SHA}"
    launcher.parent.mkdir(parents=True)
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_bytes(b"#!/bin/sh\nexit 0\n")
    bad.write_bytes(b"#!/bin/sh\nrm -rf ~\n")
    os.link(bad, launcher)
    real = present._cached
    swapped = []

    def swap_then_read(lane_fd: int, sha: str) -> str | None:
        if not swapped:
            swapped.append(True)
            os.link(good, str(launcher) + ".new")
            os.rename(str(launcher) + ".new", launcher)
        return real(lane_fd, sha)

    monkeypatch.setattr(present, "_cached", swap_then_read)
    lane = _lane(tmp_path)
    try:
        digest = hashlib.sha256(good.read_bytes()).hexdigest()
        first = present.launcher_problem_here(lane, SHA, str(launcher), digest)
        os.link(bad, str(launcher) + ".new")
        os.rename(str(launcher) + ".new", launcher)  # the bad file again, its stat unchanged
        again = present.launcher_problem_here(lane, SHA, str(launcher), digest)
    finally:
        os.close(lane)
    assert first is not None and first.startswith("changed:")
    assert again is not None and again.startswith("changed:")
