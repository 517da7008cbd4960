"""Retention of attempt directories, attempt creation and its symlink refusals.

Sizes: the rule counts ``st_size`` (the bytes a reader of the transcripts
streams), so MiB-sized transcripts are made as sparse files with
``os.truncate``: real sizes, no disk or time cost.  An implementation that
counted allocated blocks instead would see ~0 bytes and keep everything,
which these tests catch.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import AGENT, plant_symlink, tree_digest
from vq_admin.agent import allocation, retention
from vq_admin.core import safedirs

MiB = 1 << 20


def program_dir(scratch: Path, program: str = "prog") -> Path:
    d = scratch / ".vq-admin" / "runtime-deploy" / program
    d.mkdir(parents=True, exist_ok=True)
    return d


def make_attempt(parent: Path, stamp: str, size_mib: float, suffix: str = "0a0b0c0d") -> str:
    name = f"deploy.{stamp}.{suffix}"
    d = parent / name
    d.mkdir()
    with open(d / "stdout", "wb") as fh:
        os.truncate(fh.fileno(), int(size_mib * MiB))
    (d / "stderr").write_bytes(b"")
    (d / "job").write_text("17\n")
    return name


def prune(parent: Path, current: str, cap: int = retention.CAP_BYTES) -> dict:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return retention.prune(fd, current, cap)
    finally:
        os.close(fd)


def attempts(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir() if retention.ATTEMPT_RE.match(p.name)}


def test_keeps_newest_that_fit_counting_current_first(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 60)
    a30 = make_attempt(parent, "20260104T000000Z", 30)
    a20 = make_attempt(parent, "20260103T000000Z", 20)
    a5 = make_attempt(parent, "20260102T000000Z", 5)
    result = prune(parent, cur)
    assert attempts(parent) == {cur, a30}
    # the 5 MiB attempt would fit (95 MiB) but is older than the first misfit: it goes too
    assert sorted(result["removed"]) == sorted([a20, a5])
    assert result["retained_bytes"] == 90 * MiB + 2 * 3  # plus the two kept "17\n" job files


def test_current_counts_first_even_when_it_is_not_the_newest(tmp_path):
    parent = program_dir(tmp_path)
    newer = make_attempt(parent, "20260106T000000Z", 50)
    cur = make_attempt(parent, "20260105T000000Z", 60)
    older = make_attempt(parent, "20260101T000000Z", 1)
    prune(parent, cur)
    assert attempts(parent) == {cur}
    assert newer not in attempts(parent) and older not in attempts(parent)


def test_current_over_the_cap_alone_survives(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 150)
    make_attempt(parent, "20260104T000000Z", 1)
    make_attempt(parent, "20260103T000000Z", 0.001)
    result = prune(parent, cur)
    assert attempts(parent) == {cur}
    assert len(result["removed"]) == 2
    assert (parent / cur / "stdout").stat().st_size == 150 * MiB


def test_exactly_the_cap_fits(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 60)
    other = make_attempt(parent, "20260104T000000Z", 40)
    (parent / other / "job").write_bytes(b"")
    (parent / cur / "job").write_bytes(b"")
    prune(parent, cur)
    assert attempts(parent) == {cur, other}


def test_same_second_attempts_are_ordered_by_name(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 60, "ffffffff")
    b = make_attempt(parent, "20260104T000000Z", 30, "bbbbbbbb")
    a = make_attempt(parent, "20260104T000000Z", 30, "aaaaaaaa")
    prune(parent, cur)
    assert attempts(parent) == {cur, b} and a not in attempts(parent)


def test_legacy_files_go_and_everything_else_stays_byte_identical(tmp_path):
    scratch = tmp_path
    parent = program_dir(scratch, "prog")
    other = program_dir(scratch, "other-prog")
    cur = make_attempt(parent, "20260105T000000Z", 60)
    make_attempt(parent, "20260104T000000Z", 50)  # misfit: removed
    make_attempt(other, "20260101T000000Z", 200)  # another program: never touched
    (parent / "deploy.out").write_text("legacy out\n")
    (parent / "deploy.err").write_text("legacy err\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep\n")
    # unknown names, look-alikes and a symlink that matches the attempt pattern
    (parent / "notes.txt").write_text("operator notes\n")
    (parent / "deploy.20260101T000000Z.nothex!").mkdir()
    (parent / "deploy.20260101T000000Z.nothex!" / "f").write_text("x")
    (parent / "deploy.old").mkdir()
    (parent / "stage.20260101T000000Z.0a0b0c0d").mkdir()
    os.symlink(outside, parent / "deploy.20250101T000000Z.deadbeef")
    untouched = {p: tree_digest(p) for p in (other, outside)}
    names_before = {n: tree_digest(parent / n) if (parent / n).is_dir() and not (parent / n).is_symlink() else None
                    for n in ("notes.txt", "deploy.20260101T000000Z.nothex!", "deploy.old",
                              "stage.20260101T000000Z.0a0b0c0d")}
    notes = (parent / "notes.txt").read_bytes()
    result = prune(parent, cur)
    assert result["legacy_removed"] == ["deploy.out", "deploy.err"]
    assert not (parent / "deploy.out").exists() and not (parent / "deploy.err").exists()
    assert {p: tree_digest(p) for p in (other, outside)} == untouched
    for name, digest in names_before.items():
        assert (parent / name).exists()
        if digest is not None:
            assert tree_digest(parent / name) == digest
    assert (parent / "notes.txt").read_bytes() == notes
    assert os.readlink(parent / "deploy.20250101T000000Z.deadbeef") == str(outside)
    assert attempts(parent) == {cur, "deploy.20250101T000000Z.deadbeef"}


def test_a_symlink_inside_an_attempt_is_removed_not_followed(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 99)
    old = make_attempt(parent, "20260104T000000Z", 2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "data").write_text("keep\n")
    os.symlink(victim, parent / old / "link")
    prune(parent, cur)
    assert attempts(parent) == {cur}
    assert (victim / "data").read_text() == "keep\n"


def test_a_live_attempt_of_another_run_is_neither_removed_nor_counted(tmp_path):
    parent = program_dir(tmp_path)
    live = make_attempt(parent, "20260106T000000Z", 70)
    (parent / live / retention.LIVE_LOCK).write_bytes(b"")
    cur = make_attempt(parent, "20260105T000000Z", 60)
    older = make_attempt(parent, "20260104T000000Z", 30)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"), str(parent / live / retention.LIVE_LOCK)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        result = prune(parent, cur)
        assert attempts(parent) == {live, cur, older}  # 60 + 30 fit once the live 70 is not counted
        assert result["live_skipped"] == [live]
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    result = prune(parent, cur)  # the other run is over: the rule now applies to its attempt too
    assert attempts(parent) == {cur}  # 60 + 70 does not fit: the 70 and everything older go
    assert sorted(result["removed"]) == sorted([live, older])


def test_nested_directories_symlinks_and_odd_entries_inside_an_attempt_go_and_nothing_is_followed(tmp_path):
    """Each entry is unlinked without a stat first; a directory is opened O_NOFOLLOW, emptied and removed."""
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 99)
    old = make_attempt(parent, "20260104T000000Z", 2)
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "data").write_text("keep\n")
    deep = parent / old / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    os.symlink(victim / "sub", deep / "dirlink")
    os.symlink(victim / "sub" / "data", parent / old / "a" / "filelink")
    os.symlink("dangling", parent / old / "a" / "b" / "dangling")
    os.mkfifo(parent / old / "a" / "fifo")
    (parent / old / "a" / "b" / "empty").mkdir()
    before = tree_digest(victim)
    result = prune(parent, cur)
    assert attempts(parent) == {cur} and result["removed"] == [old] and result["errors"] == []
    assert tree_digest(victim) == before


def test_a_live_attempt_older_than_the_first_misfit_is_left_in_place(tmp_path):
    parent = program_dir(tmp_path)
    cur = make_attempt(parent, "20260105T000000Z", 60)
    misfit = make_attempt(parent, "20260104T000000Z", 50)
    live = make_attempt(parent, "20260103T000000Z", 1)
    gone = make_attempt(parent, "20260102T000000Z", 1)
    lock = os.open(parent / live / retention.LIVE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        holder = subprocess.Popen([sys.executable, "-c", (
            "import fcntl, os, sys\n"
            "fcntl.flock(int(sys.argv[1]), fcntl.LOCK_SH)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n"), str(lock)], pass_fds=(lock,), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            result = prune(parent, cur)
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
    finally:
        os.close(lock)
    assert attempts(parent) == {cur, live}
    assert sorted(result["removed"]) == sorted([misfit, gone]) and result["live_skipped"] == [live]
    assert (parent / live / "stdout").stat().st_size == 1 * MiB


def test_choose_removals_asks_liveness_only_until_the_first_misfit():
    names = ["deploy.20260104T000000Z.aaaaaaaa", "deploy.20260103T000000Z.aaaaaaaa", "deploy.20260102T000000Z.aaaaaaaa"]
    asked = []

    def live(name):
        asked.append(name)
        return name == names[0]

    remove, total = retention.choose_removals("deploy.20260105T000000Z.aaaaaaaa", names,
                                              lambda name: 60, live, cap=100)
    assert asked == names[:2]  # the live one, then the first misfit; the caller checks the rest as it removes
    assert remove == names[1:] and total == 60


def test_choose_removals_asks_sizes_only_until_the_first_misfit():
    sizes = {"deploy.20260105T000000Z.aaaaaaaa": 60, "deploy.20260104T000000Z.aaaaaaaa": 30,
             "deploy.20260103T000000Z.aaaaaaaa": 20, "deploy.20260102T000000Z.aaaaaaaa": 5}
    asked = []

    def size(name):
        asked.append(name)
        return sizes[name]

    remove, total = retention.choose_removals("deploy.20260105T000000Z.aaaaaaaa", list(sizes)[1:], size, cap=100)
    assert remove == ["deploy.20260103T000000Z.aaaaaaaa", "deploy.20260102T000000Z.aaaaaaaa"]
    assert total == 90 and "deploy.20260102T000000Z.aaaaaaaa" not in asked


# -- attempt creation -----------------------------------------------------------------


def test_attempt_is_created_fresh_private_and_live(tmp_path):
    attempt = allocation.create_attempt(str(tmp_path), "prog")
    try:
        path = Path(attempt.path)
        assert retention.ATTEMPT_RE.match(path.name)
        for level in (tmp_path / ".vq-admin", tmp_path / ".vq-admin" / "runtime-deploy", path.parent, path):
            assert oct(level.stat().st_mode & 0o777) == oct(0o700), level
        assert retention.is_live(attempt.program_fd, attempt.name)
    finally:
        attempt.close()
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert not retention.is_live(fd, path.name)
    finally:
        os.close(fd)


def test_an_existing_attempt_name_is_never_reused(tmp_path):
    name = "deploy.20260105T000000Z.0a0b0c0d"
    allocation.create_attempt(str(tmp_path), "prog", name).close()
    with pytest.raises(safedirs.UnsafePath, match="never reused"):
        allocation.create_attempt(str(tmp_path), "prog", name)


@pytest.mark.parametrize("bad", ["deploy.x", "../deploy.20260105T000000Z.0a0b0c0d", "deploy.20260105T000000Z.0A0B0C0D"])
def test_bad_attempt_names_are_refused(tmp_path, bad):
    with pytest.raises(safedirs.UnsafePath):
        allocation.create_attempt(str(tmp_path), "prog", bad)


@pytest.mark.parametrize("level", [".vq-admin", ".vq-admin/runtime-deploy", ".vq-admin/runtime-deploy/prog"])
def test_a_planted_symlink_is_refused_and_nothing_is_written_through_it(tmp_path, level):
    scratch = tmp_path / "scratch"
    target = plant_symlink(scratch / level, tmp_path)
    with pytest.raises(safedirs.UnsafePath, match="symlink"):
        allocation.create_attempt(str(scratch), "prog")
    assert list(target.iterdir()) == []
    # the agent verb refuses the same way, with exit status 4 and no job submitted
    done = subprocess.run([AGENT, "alloc-run", "--root", str(scratch), "--program", "prog", "--timeout", "5",
                           "--", "/bin/true"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PATH="/nonexistent"))
    assert done.returncode == 4, done.stderr
    assert "refused" in done.stderr and "symlink" in done.stderr and done.stdout == ""
    assert list(target.iterdir()) == []


def test_a_symlinked_attempt_name_is_refused(tmp_path):
    parent = program_dir(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir()
    name = "deploy.20260105T000000Z.0a0b0c0d"
    os.symlink(target, parent / name)
    with pytest.raises(safedirs.UnsafePath, match="never reused"):
        allocation.create_attempt(str(tmp_path), "prog", name)
    assert list(target.iterdir()) == []


def test_percent_in_scratch_root_is_refused(tmp_path):
    with pytest.raises(safedirs.UnsafePath, match="%"):
        allocation.create_attempt(str(tmp_path / "a%j"), "prog")


def test_program_lock_is_exclusive_and_never_follows_a_symlink(tmp_path):
    parent = program_dir(tmp_path)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with allocation.program_lock(fd):
            other = os.open(parent / ".lock", os.O_RDWR)
            try:
                with pytest.raises(BlockingIOError):
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(other)
        os.unlink(parent / ".lock")
        victim = tmp_path / "victim"
        victim.write_text("keep\n")
        os.symlink(victim, parent / ".lock")
        with pytest.raises(OSError):
            with allocation.program_lock(fd):
                pass
        assert victim.read_text() == "keep\n"
    finally:
        os.close(fd)


def test_reconcile_fences_a_missing_attempt(tmp_path):
    from vq_admin.core.frames import FrameWriter

    out_r, out_w = os.pipe()
    summary = allocation.reconcile(str(tmp_path), "prog", "deploy.20260105T000000Z.0a0b0c0d", 5.0, FrameWriter(out_w))
    os.close(out_w)
    os.close(out_r)
    assert summary["fenced"] and not summary["established"] and summary["job_id"] is None
    with pytest.raises(safedirs.UnsafePath, match="never reused"):
        allocation.create_attempt(str(tmp_path), "prog", "deploy.20260105T000000Z.0a0b0c0d")
