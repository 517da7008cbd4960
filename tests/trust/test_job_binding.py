"""The allocation job's content binding, run directly (no scheduler): what it
refuses, with which exit status and which line, and that it runs nothing then.
The same job under the real Slurm is attacked in test_host_trust.py."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
from pathlib import Path

import pytest

from vq_admin.agent import allocation
from vq_admin.core import exits


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def job(tmp_path):
    attempt = tmp_path / "attempt"
    stage = tmp_path / "stage"
    attempt.mkdir(mode=0o700)
    stage.mkdir(mode=0o700)
    marker = tmp_path / "ran"
    spec = attempt / "argv.json"
    spec.write_text(json.dumps({"argv": ["/usr/bin/touch", str(marker)], "env": {}}))
    spec.chmod(0o600)
    archive = stage / "source.tar"
    archive.write_bytes(b"tar bytes")
    archive.chmod(0o600)
    script = attempt / "job.py"
    script.write_bytes(allocation.job_script())
    script.chmod(0o700)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60)

    return run, spec, archive, marker


def assert_refused(done: subprocess.CompletedProcess, marker: Path, *words: str) -> None:
    assert done.returncode == exits.JOB_TAMPERED == 86, done.stderr
    assert done.stderr.startswith(allocation.JOB_TAMPERED_MARK) and "the provider was not run" in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()


def test_unchanged_argv_and_archive_run(job):
    run, spec, archive, marker = job
    done = run(str(spec), sha256(spec), str(archive), sha256(archive))
    assert done.returncode == 0, done.stderr
    assert marker.exists()


def test_a_changed_argv_is_not_run(job):
    run, spec, archive, marker = job
    want = sha256(spec)
    spec.write_text(json.dumps({"argv": ["/usr/bin/touch", str(marker)], "env": {"X": "1"}}))
    assert_refused(run(str(spec), want, str(archive), sha256(archive)), marker, "changed after the run prepared it",
                   f"expected {want}")


def test_bytes_appended_to_the_archive_are_not_run(job):
    run, spec, archive, marker = job
    want = sha256(archive)
    with open(archive, "ab") as fh:
        fh.write(b"more")
    assert_refused(run(str(spec), sha256(spec), str(archive), want), marker, str(archive), f"expected {want}")


def test_an_argv_file_that_is_a_symlink_is_not_followed(job, tmp_path):
    run, spec, archive, marker = job
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(spec.read_bytes())
    want = sha256(spec)
    spec.unlink()
    spec.symlink_to(elsewhere)
    assert_refused(run(str(spec), want), marker, "without following symlinks")


def test_a_loosened_mode_is_not_run(job):
    run, spec, archive, marker = job
    spec.chmod(0o666)
    assert_refused(run(str(spec), sha256(spec)), marker, "writable by nobody else (mode 0666)")


def test_a_loose_attempt_directory_is_not_run(job):
    run, spec, archive, marker = job
    spec.parent.chmod(0o777)
    before = sorted(p.name for p in spec.parent.iterdir())
    assert_refused(run(str(spec), sha256(spec)), marker, f"directory {spec.parent} is group- and other-writable")
    assert sorted(p.name for p in spec.parent.iterdir()) == before  # no transcript opened in a loose directory


def test_the_job_creates_its_own_transcripts_owner_only(job):
    run, spec, archive, marker = job
    done = run(str(spec), sha256(spec), str(archive), sha256(archive))
    assert done.returncode == 0 and marker.exists()
    for name in ("stdout", "stderr"):
        st = (spec.parent / name).lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


@pytest.mark.parametrize("name", ["stdout", "stderr"])
def test_a_symlink_planted_at_a_transcript_name_is_not_written_through(name, job, tmp_path):
    run, spec, archive, marker = job
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (spec.parent / name).symlink_to(victim)
    assert_refused(run(str(spec), sha256(spec), str(archive), sha256(archive)), marker,
                   f"{spec.parent}/{name}")
    assert victim.read_text() == "precious\n"


def test_wrong_arguments_run_nothing(job):
    run, spec, archive, marker = job
    assert_refused(run(str(spec)), marker, "called with 1 arguments")


def test_the_agent_refuses_an_archive_that_changed_before_it_submits(tmp_path):
    stage = tmp_path / ".vq-admin" / "stage" / "runtime" / "p" / "stage.20261130T000000Z.00000000"
    stage.mkdir(parents=True, mode=0o700)
    archive = stage / "source.tar"
    archive.write_bytes(b"staged")
    want = sha256(archive)
    assert allocation.bind(b"{}", str(archive), want).archive_sha256 == want
    with open(archive, "ab") as fh:
        fh.write(b"!")
    with pytest.raises(allocation.safedirs.UnsafePath, match="changed after it was verified"):
        allocation.bind(b"{}", str(archive), want)
