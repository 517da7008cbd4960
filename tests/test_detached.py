"""The agent's detached fixed-host builds (``vq-admin-agent detach-run`` / ``detach-reconcile``), run for real
on this machine: the build outlives its agent, its files are owner-only, nothing is written through a symlink,
the bound ends the build, and a reconcile establishes the end without starting anything.

The driver side over a real sshd (dropped session, SIGTERM and SIGKILL of ``vq``, a second run while the
build runs) is in tests/test_chaos.py.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from realhosts.procs import pid_alive, wait_until

from vq_admin.core.frames import read_frames

AGENT = [sys.executable, "-m", "vq_admin.agent"]


def scratch(tmp_path: Path) -> Path:
    root = tmp_path / "scratch"
    root.mkdir(mode=0o700)
    return root


def frames(data: bytes) -> tuple[dict, dict]:
    records: dict = {}
    data_out: dict = {"stdout": b"", "stderr": b""}

    def on_data(name: str, chunk: bytes) -> None:
        data_out[name] += chunk

    read_frames(io.BytesIO(data), lambda kind, value: records.__setitem__(kind, value), on_data)
    return records, data_out


def agent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*AGENT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_args(root: Path, program: str, attempt: str, *command: str, timeout: str = "60") -> list[str]:
    return ["detach-run", "--root", str(root), "--program", program, "--attempt", attempt, "--timeout", timeout,
            "--", *command]


ATTEMPT = "deploy.20261130T000000Z.0badcafe"


def test_the_build_outlives_a_killed_agent_and_is_reconciled(tmp_path):
    root, marks = scratch(tmp_path), tmp_path / "marks"
    marks.mkdir()
    # the build runs until the test releases it (at most 60 s), so the first reconcile finds it running
    script = (f"touch {marks}/started; echo line 1; i=0; while [ ! -e {marks}/release ] && [ $i -lt 600 ]; "
              f"do sleep 0.1; i=$((i+1)); done; echo line 2; echo line 3; echo warn >&2; touch {marks}/done")
    proc = subprocess.Popen([*AGENT, *run_args(root, "p", ATTEMPT, "sh", "-c", script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert wait_until(lambda: (marks / "started").exists(), 30)
    proc.kill()  # as a dropped session or a killed driver would end the agent
    proc.communicate(timeout=30)
    attempt = root / ".vq-admin" / "runtime-deploy" / "p" / ATTEMPT
    # the supervisor writes its build record (atomically) once the build has started, and may still be
    # writing it when the build's first line already ran and the agent was killed
    assert wait_until(lambda: (attempt / "build").exists(), 30), "the supervisor never recorded the build"
    build = json.loads((attempt / "build").read_text())
    assert pid_alive(build["pid"]) and not (attempt / "exit").exists()

    early = agent("detach-reconcile", "--root", str(root), "--program", "p", "--attempt", ATTEMPT, "--timeout", "1")
    records, _ = frames(early.stdout)
    assert early.returncode == 0 and records["summary"]["job_state"] == "RUNNING"
    assert records["summary"]["established"] is False and records["summary"]["pid"] == build["pid"]
    (marks / "release").touch()

    assert wait_until(lambda: (marks / "done").exists() and (attempt / "exit").exists(), 30)
    done = agent("detach-reconcile", "--root", str(root), "--program", "p", "--attempt", ATTEMPT, "--timeout", "5")
    records, streams = frames(done.stdout)
    summary = records["summary"]
    assert summary["established"] is True and summary["exit_code"] == 0 and summary["reconciled"] is True
    assert summary["settle"]["settled"] is True and summary["settle"]["observations"] == 1  # one look: no settle
    assert streams["stdout"] == b"line 1\nline 2\nline 3\n" and streams["stderr"] == b"warn\n"
    assert records["end"]["sent"]["stdout"]["settled_digest"] == records["end"]["sent"]["stdout"]["digest"]
    assert not pid_alive(build["supervisor_pid"])


def test_the_attempt_is_owner_only_and_records_what_ran(tmp_path):
    root = scratch(tmp_path)
    done = agent(*run_args(root, "p", ATTEMPT, "sh", "-c", "echo out; exit 5"))
    records, streams = frames(done.stdout)
    assert done.returncode == 0, done.stderr
    assert records["summary"]["exit_code"] == 5 and records["summary"]["established"] is True
    assert streams["stdout"] == b"out\n"
    attempt = root / ".vq-admin" / "runtime-deploy" / "p" / ATTEMPT
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    for name in ("stdout", "stderr", "build", "exit", "argv.json", ".live"):
        st = (attempt / name).lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid(), name
    assert stat.S_IMODE((attempt / "job.py").stat().st_mode) == 0o700
    build = json.loads((attempt / "build").read_text())
    import hashlib

    assert build["argv_sha256"] == hashlib.sha256((attempt / "argv.json").read_bytes()).hexdigest()
    assert json.loads((attempt / "argv.json").read_text())["argv"] == ["sh", "-c", "echo out; exit 5"]
    assert json.loads((attempt / "exit").read_text())["exit_code"] == 5


def test_a_symlink_in_the_attempt_path_is_refused_and_nothing_is_written_through_it(tmp_path):
    root, elsewhere = scratch(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / ".vq-admin" / "runtime-deploy").mkdir(parents=True, mode=0o700)
    os.symlink(elsewhere, root / ".vq-admin" / "runtime-deploy" / "p")
    marker = tmp_path / "ran"
    done = agent(*run_args(root, "p", ATTEMPT, "touch", str(marker)))
    assert done.returncode == 4 and b"refused" in done.stderr, done.stderr
    assert list(elsewhere.iterdir()) == [] and not marker.exists()


def test_a_changed_archive_is_refused_before_anything_starts(tmp_path):
    root, stage = scratch(tmp_path), tmp_path / "stage"
    stage.mkdir(mode=0o700)
    (stage / "source.tar").write_bytes(b"staged")
    os.chmod(stage / "source.tar", 0o600)
    marker = tmp_path / "ran"
    done = agent("detach-run", "--root", str(root), "--program", "p", "--attempt", ATTEMPT, "--timeout", "60",
                 "--archive", str(stage / "source.tar"), "--archive-sha256", "0" * 64, "--", "touch", str(marker))
    assert done.returncode == 4 and b"changed after it was verified" in done.stderr, done.stderr
    assert not marker.exists() and not (root / ".vq-admin" / "runtime-deploy" / "p" / ATTEMPT).exists()


def test_the_bound_ends_the_build_and_says_so(tmp_path):
    root = scratch(tmp_path)
    started = time.monotonic()
    done = agent(*run_args(root, "p", ATTEMPT, "sh", "-c", "echo begun; exec sleep 60", timeout="2"))
    records, streams = frames(done.stdout)
    summary = records["summary"]
    assert time.monotonic() - started < 30
    assert summary["timed_out"] is True and summary["cancel"]["ok"] is True, summary
    assert summary["cancel"]["signals"] == ["SIGTERM"] and summary["exit_signal"] == signal.SIGTERM
    assert streams["stdout"] == b"begun\n"


def test_a_reconcile_of_an_attempt_that_never_existed_fences_it(tmp_path):
    root = scratch(tmp_path)
    (root / ".vq-admin" / "runtime-deploy" / "p").mkdir(parents=True, mode=0o700)
    done = agent("detach-reconcile", "--root", str(root), "--program", "p", "--attempt", ATTEMPT, "--timeout", "1")
    records, _ = frames(done.stdout)
    assert records["summary"]["fenced"] is True and records["summary"]["established"] is False
    late = agent(*run_args(root, "p", ATTEMPT, "true"))  # a delayed agent can no longer start under that name
    assert late.returncode == 4 and b"already exists" in late.stderr


def test_detach_run_works_on_the_oldest_supported_python(tmp_path):
    """The agent runs on login hosts with Python 3.8: the detached build too."""
    import pytest

    from test_agent_pythons import find_python

    python = find_python("3.8")
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    root = scratch(tmp_path)
    here = Path(__file__).resolve().parent.parent
    done = subprocess.run([python, "-m", "vq_admin.agent", *run_args(root, "p", ATTEMPT, "sh", "-c", "echo old")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(here)})
    records, streams = frames(done.stdout)
    assert done.returncode == 0, done.stderr
    assert records["summary"]["established"] is True and records["summary"]["exit_code"] == 0
    assert streams["stdout"] == b"old\n"


def test_a_normal_fixed_host_update_runs_detached_with_its_transcript_and_metrics(tmp_path, real_sshd):
    """Over a real sshd: the usual receipt (exit status, output, metrics), the transcript settled and
    copied next to the receipt, the attempt on the build host owner-only, and no record left to reconcile."""
    from test_chaos import World

    world = World(tmp_path, real_sshd.ssh_config, "detached-normal")
    world.set_deploy("echo building; echo 'VQ-DEPLOY-METRIC build_seconds=7'; echo 'a warning' >&2")
    done = world.run()
    receipt = done.receipt
    assert done.outcome == "ok" and world.active() == world.sha, done.stdout
    deploy = receipt["deploy"]
    assert deploy["detached"] is True and deploy["exit_code"] == 0 and deploy["established"] is True
    assert deploy["where"] == "cluster-build" and isinstance(deploy["pid"], int)
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["deploy"]["status"] == "ok" and steps["deploy"]["exit_code"] == 0
    assert "detach-run" in steps["deploy"]["argv"] and world.sha in steps["deploy"]["argv"]
    output = receipt["command_output"]
    assert output["complete"] is True and "building" in output["stdout"] and "a warning" in output["stderr"]
    assert receipt["metrics"] == {"build_seconds": 7} and receipt["metrics_complete"] is True
    assert output["log_dir"] == deploy["attempt_dir"]
    assert (Path(output["transcript"]) / "stdout").read_text() == output["stdout"]
    attempt = Path(deploy["attempt_dir"])
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    assert json.loads((attempt / "exit").read_text())["exit_code"] == 0
    assert not (world.state / "hosts" / "cluster" / "runtime" / world.program / "attempt.json").exists()
    again = world.run()
    assert again.outcome == "already-current" and "previous_attempt" not in again.receipt


def test_a_deploy_dropped_before_the_agent_started_fences_the_attempt_and_says_nothing_was_built(tmp_path, real_sshd):
    """A drop before ``detach-run`` ran: the reconcile fences the attempt, the receipt says no build was
    started (never that one keeps running), and the next run reconciles the fenced attempt and deploys."""
    from test_chaos import World

    world = World(tmp_path, real_sshd.ssh_config, "detached-fenced")
    log = tmp_path / "calls.jsonl"
    env = {**world.env(), "VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT_LOG": str(log)}
    clean = subprocess.run(world.argv(world.a), env=env, capture_output=True, text=True, timeout=300, check=False)
    assert json.loads(clean.stdout)["outcome"] == "ok", clean.stdout + clean.stderr
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    index = next(e["index"] for e in entries if "argv" in e and "detach-run" in e["argv"])
    (world.marks / "switched").unlink()
    done = subprocess.run(world.argv(), env={**world.env(), "VQ_ADMIN_TESTING": "1",
                                             "VQ_ADMIN_FAULT": f"call:{index}:drop-before"},
                          capture_output=True, text=True, timeout=300, check=False)
    receipt = json.loads(done.stdout)
    assert receipt["outcome"] == "unknown" and world.active() == world.a, done.stdout
    readback = receipt["readback"]
    assert readback["build"].startswith("no build was started on cluster-build") and "fenced" in readback["build"]
    attempt = Path(readback["attempt_dir"])
    assert attempt.is_dir() and not (attempt / "build").exists() and not (world.marks / "switched").exists()
    again = world.run()
    assert again.outcome == "ok" and world.active() == world.sha, again.stdout
    previous = again.receipt["previous_attempt"]
    assert previous["fenced"] is False and previous["kind"] == "detached"
