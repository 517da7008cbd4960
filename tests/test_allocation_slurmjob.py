"""Establishing a Slurm job's end from its records (no daemons: recorded text
and stand-in commands on PATH; the real cluster is in test_allocation_real)."""

from __future__ import annotations

import os

import pytest

from vq_admin.agent import slurmjob

JOBCOMP = (
    "JobId=7 UserId=root(0) GroupId=root(0) Name=vq-deploy-prog JobState=COMPLETED Partition=debug "
    "TimeLimit=UNLIMITED StartTime=2026-11-30T06:44:11 EndTime=2026-11-30T06:44:16 NodeList=vm NodeCnt=1 "
    "ProcCnt=1 WorkDir=/root ReservationName= Tres=cpu=1 Account= QOS= WcKey= Cluster=unknown "
    "SubmitTime=2026-11-30T06:44:10 EligibleTime=2026-11-30T06:44:10 DerivedExitCode=9:0 ExitCode=0:0 \n"
    "JobId=8 UserId=root(0) GroupId=root(0) Name=wrap JobState=FAILED Partition=debug DerivedExitCode=0:0 "
    "ExitCode=3:0 \n"
    "JobId=8 UserId=root(0) GroupId=root(0) Name=vq-deploy-prog JobState=FAILED Partition=debug "
    "DerivedExitCode=0:0 ExitCode=5:0 \n"
    "JobId=80 UserId=root(0) GroupId=root(0) Name=vq-deploy-prog JobState=CANCELLED DerivedExitCode=0:0 ExitCode=0:0 \n"
)


def test_parse_fields_does_not_take_derived_exit_code():
    fields = slurmjob.parse_fields(JOBCOMP.splitlines()[0])
    assert fields == {"JobId": "7", "JobState": "COMPLETED", "ExitCode": "0:0", "Name": "vq-deploy-prog",
                      "NodeList": "vm"}


def test_a_cancelled_job_without_a_node_never_started():
    ran = "JobId=9 JobState=CANCELLED ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm"
    pending = "JobId=9 JobState=CANCELLED ReqNodeList=(null) ExcNodeList=(null) NodeList= "
    assert slurmjob.never_started(slurmjob.parse_fields(pending))
    assert not slurmjob.never_started(slurmjob.parse_fields(ran))
    assert not slurmjob.never_started(slurmjob.parse_fields(pending.replace("CANCELLED", "FAILED")))


@pytest.mark.parametrize("state, status, signal, expected", [
    ("COMPLETED", 0, 0, 0), ("FAILED", 3, 0, 3), ("FAILED", 0, 9, 1), ("CANCELLED", 0, 15, 1),
    ("CANCELLED", 0, 0, 1), ("NODE_FAIL", 0, 0, 1), ("TIMEOUT", None, None, 1),
])
def test_wait_status_follows_sbatch_wait(state, status, signal, expected):
    assert slurmjob.wait_status(state, status, signal) == expected


def test_jobcomp_takes_the_record_of_this_job_and_name(tmp_path):
    log = tmp_path / "jobcomp.log"
    log.write_text(JOBCOMP)
    end = slurmjob.jobcomp_end("8", "vq-deploy-prog", str(log))
    assert (end.state, end.exit_code, end.raw_exit, end.source) == ("FAILED", 5, "5:0", "jobcomp")
    assert slurmjob.jobcomp_end("80", "vq-deploy-prog", str(log)).exit_code == 1  # cancelled is never 0
    assert slurmjob.jobcomp_end("9", "vq-deploy-prog", str(log)) is None
    assert slurmjob.jobcomp_end("8", "vq-deploy-prog", str(tmp_path / "missing")) is None


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def make(name: str, script: str) -> None:
        (bindir / name).write_text("#!/bin/sh\n" + script)
        (bindir / name).chmod(0o755)

    make("sacct", "exit 1\n")
    return make


def test_a_running_job_is_not_an_end(fake_bin):
    fake_bin("scontrol", "echo 'JobId=12 JobName=vq-deploy-prog JobState=RUNNING Reason=None ExitCode=0:0'\n")
    end, state, note = slurmjob.find_end("12", "vq-deploy-prog", [])
    assert end is None and state == "RUNNING" and note is None


def test_scontrol_record_gives_the_end(fake_bin):
    fake_bin("scontrol", "echo 'JobId=12 JobName=vq-deploy-prog JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0'\n")
    end, _state, _note = slurmjob.find_end("12", "vq-deploy-prog", [])
    assert (end.exit_code, end.source) == (3, "scontrol")


def test_an_aged_out_record_falls_back_to_the_job_completion_log(fake_bin, tmp_path):
    log = tmp_path / "jobcomp.log"
    log.write_text(JOBCOMP)
    fake_bin("scontrol", f"""case "$2" in
  job) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;
  config) echo 'JobCompLoc              = {log}'; echo 'JobCompType             = jobcomp/filetxt';;
esac
""")
    search = slurmjob.wait_for_end("8", "vq-deploy-prog", 10.0, clock=lambda: 0.0, sleep=lambda s: None)
    assert search.end.source == "jobcomp" and search.end.exit_code == 5


def test_an_unreachable_controller_never_gives_an_end(fake_bin):
    fake_bin("scontrol", "echo 'Unable to contact slurm controller (connect failure)' >&2; exit 1\n")
    now = [0.0]
    search = slurmjob.wait_for_end("8", "vq-deploy-prog", 5.0, poll=2.0, clock=lambda: now[0],
                                   sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert search.end is None and now[0] == pytest.approx(5.0)
    assert search.notes == ["scontrol: Unable to contact slurm controller (connect failure)"]


def test_a_job_gone_everywhere_is_not_an_end(fake_bin):
    fake_bin("scontrol", """case "$2" in
  job) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;
  config) echo 'JobCompType             = jobcomp/none';;
esac
""")
    search = slurmjob.wait_for_end("8", "vq-deploy-prog", 0.0, clock=lambda: 0.0, sleep=lambda s: None)
    assert search.end is None and "no completion record" in search.notes[0]


def test_submit_records_the_job_id_before_sbatch_returns(fake_bin, tmp_path):
    marker = tmp_path / "seen"
    fake_bin("sbatch", f"echo 31; while [ ! -e {marker} ]; do sleep 0.01; done; exit 4\n")
    seen = []

    def on_job_id(job_id, sbatch_pid):
        seen.append(job_id)
        marker.write_text(job_id)  # sbatch ends only once the id was recorded
        assert os.path.exists(f"/proc/{sbatch_pid}")  # the sbatch that waits (it holds the lease's work lock)

    result = slurmjob.submit_and_wait(["sbatch"], 60.0, on_job_id)
    assert seen == ["31"] and result.job_id == "31" and result.sbatch_exit_code == 4 and not result.timed_out


def test_the_bound_cancels_the_submitted_job(fake_bin, tmp_path):
    cancelled, pid = tmp_path / "cancelled", tmp_path / "pid"
    fake_bin("sbatch", f"echo $$ > {pid}; echo 32; exec sleep 60\n")
    # like sbatch --wait noticing the cancelled job: it exits 1
    fake_bin("scancel", f"echo \"$@\" > {cancelled}; kill $(cat {pid})\n")
    result = slurmjob.submit_and_wait(["sbatch"], 0.5, lambda job_id, pid: None)
    assert result.timed_out and result.cancel["ok"] and cancelled.read_text() == "32\n"
    assert result.job_id == "32" and result.sbatch_exit_code == -15


def test_a_bound_without_a_job_id_has_nothing_to_cancel(fake_bin):
    fake_bin("sbatch", "exec sleep 60\n")
    result = slurmjob.submit_and_wait(["sbatch"], 0.3, lambda job_id, pid: None)
    assert result.timed_out and result.job_id is None and not result.cancel["ok"]
    assert "nothing to cancel" in result.cancel["message"] and result.sbatch_exit_code is None
