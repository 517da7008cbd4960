"""Issue 14: a bounded chaos suite of real faults (real sshd, real Slurm, a real tmpfs).

The fault table (tests/test_fault_table.py) injects faults at vq-admin's own
command choke point; the cases here do what the world does: the local ssh
client SIGKILLed (found through vq-admin's process tree, as the OOM killer or
a logout would kill it), an sshd session dropped while a build runs, SIGTERM
of ``vq`` while an allocation job waits in the queue and while it runs,
``scancel`` of the build job before and after ``current`` moves, a build cut
off at ``timeout_seconds`` after it activated, a state directory on a small
tmpfs, a verifier that prints text around its JSON.

Every case has ONE expected outcome, and every case checks: no false ``ok``;
never ``failed`` when the requested identity is active and verified;
``unknown`` names what it leaves behind and the next command; no traceback;
stdout is one JSON document; the next run converges with no repair; no
temp file in the state directory and no control directory of a finished run
in /tmp afterwards.

With ``VQ_ADMIN_CHAOS_TABLE=PATH`` each case appends its row (case, expected,
observed) as a JSON line; scripts/reliability_table.py --chaos renders them
into docs/reliability.md ("Real faults").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realhosts.procs import descendants, wait_until
from support import SITE_EXAMPLE, VQ_ADMIN, GitRepo, command_host, flock_free, write_config
from vq_admin.report.outcome import READ_ONLY_RAN

pytestmark = pytest.mark.real

CHAOS_ENV = "VQ_ADMIN_CHAOS_TABLE"
RUN_TIMEOUT = 300.0


# -- the row of each case -----------------------------------------------------------------


def record(case: str, expected: str, observed: str) -> None:
    path = os.environ.get(CHAOS_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"case": case, "expected": expected, "observed": observed}) + "\n")
    assert observed == expected, f"{case}: expected {expected}, observed {observed}"


# -- a world: one program, a site_example root, wrappers around the provider ---------------


class World:
    def __init__(self, tmp: Path, ssh_config: str, program: str, *, allocation: bool = False,
                 timeout: int = 600, state: Path | None = None):
        self.tmp, self.program = tmp, program
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("generation A")
        self.sha = self.b = self.repo.commit("generation B")
        self.root = tmp / "apps"
        self.scratch = tmp / "scratch"
        self.scratch.mkdir()
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.state = state or tmp / "state"
        self.deploy = self._script("deploy-wrapper", "")
        self.verify = self._script("verify-wrapper", "")
        place = ('update_allocation = { sbatch_args = ["--time=5"] }' if allocation
                 else 'update_host = "cluster-build"')
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n\n' + command_host(
            program, scratch=self.scratch, repo=self.repo.path, update=str(self.deploy), install=str(self.deploy),
            verify=str(self.verify), timeout_seconds=timeout, extra_profile=place))
        self.set_deploy("")
        self.set_verify("")

    def _script(self, name: str, body: str) -> Path:
        path = self.tmp / name
        path.write_text(body)
        path.chmod(0o755)
        return path

    def set_deploy(self, before: str, after: str = "", *, say: bool = True) -> None:
        """The provider: ``before``, then site_example install (its output kept in ``deploy.log``), one
        line of output (unless not *say*), then ``after``.  The line keeps the transcript from being
        empty: an empty one never settles and costs the full ten observations (9 s) where output
        settles in three (2 s)."""
        line = "echo 'deploy-wrapper: installed'\n" if say else ""
        self._script("deploy-wrapper", f"#!/bin/sh\n{before}\n{SITE_EXAMPLE} install --root {self.root} \"$@\" "
                                       f">>{self.tmp}/deploy.log 2>&1 || exit $?\n{line}"
                                       f"touch {self.marks}/switched\n{after}\n")

    def set_verify(self, before: str) -> None:
        self._script("verify-wrapper", f"#!/bin/sh\n{before}\nexec {SITE_EXAMPLE} verify --root {self.root} \"$@\"\n")

    def argv(self, sha: str | None = None) -> list[str]:
        return [VQ_ADMIN, "update", self.program, "cluster", "--expected-sha",
                sha or self.sha, "--json"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "VQ_ADMIN_CONFIG": str(self.config), "VQ_ADMIN_STATE_DIR": str(self.state)}

    def start(self, sha: str | None = None) -> subprocess.Popen:
        return subprocess.Popen(self.argv(sha), env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)

    def run(self, sha: str | None = None) -> "Done":
        proc = self.start(sha)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
        return Done(proc.pid, proc.returncode, out, err)

    def mark(self, name: str, timeout: float = 120.0) -> Path:
        found = wait_until(lambda: (self.marks / name).exists(), timeout)
        assert found, f"{name} never appeared"
        return self.marks / name

    def active(self) -> str | None:
        try:
            return os.path.basename(os.readlink(self.root / "current"))
        except OSError:
            return None


class Done:
    def __init__(self, pid: int, code: int, stdout: str, stderr: str):
        self.pid, self.code, self.stdout, self.stderr = pid, code, stdout, stderr
        self.receipt = self.document()

    def document(self) -> dict:
        assert "Traceback" not in self.stderr, self.stderr
        receipt = json.loads(self.stdout)  # stdout is exactly one JSON document
        assert isinstance(receipt, dict) and receipt["exit_code"] == self.code, self.stdout
        return receipt

    @property
    def outcome(self) -> str:
        return self.receipt["outcome"]


def finish(proc: subprocess.Popen, timeout: float = RUN_TIMEOUT) -> Done:
    out, err = proc.communicate(timeout=timeout)
    return Done(proc.pid, proc.returncode, out, err)


def kill_ssh_client(vq: subprocess.Popen, needle: str, timeout: float = 60.0) -> int:
    """SIGKILL the local ssh client of *vq* whose command line contains *needle* (as the OOM killer would)."""
    def find():
        for pid, comm in descendants(vq.pid):
            if comm != "ssh":
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline:
                return pid
        return None

    pid = wait_until(find, timeout)
    assert pid, f"no ssh client running {needle}"
    os.kill(pid, signal.SIGKILL)
    return pid


def ssh_client_killed_at(world: World, mark: str, needle: str) -> Done:
    """Start *world*'s run, wait for its *mark*, SIGKILL the ssh client running *needle*, finish the
    run and check it claims no false ok (:func:`no_false_ok`)."""
    vq = world.start()
    world.mark(mark)
    kill_ssh_client(vq, needle)
    done = finish(vq)
    no_false_ok(world, done)
    return done


def no_false_ok(world: World, done: Done) -> None:
    """ok/already-current only when the requested SHA is active; failed never when it is active and verified."""
    receipt = done.receipt
    if done.outcome in ("ok", "already-current"):
        assert world.active() == world.sha, "FALSE SUCCESS"
    if done.outcome == "failed":
        assert world.active() != world.sha or not (receipt.get("verify") or {}).get("readback", {}).get("proven")
    if done.outcome == "unknown":
        readback = receipt["readback"]
        assert readback["next_command"].startswith("vq admin update ")
        assert readback.get("stage") and readback.get("build") or readback.get("job_id") or readback.get("read")


def clean_after(world: World, *runs: Done) -> None:
    """No temp file in the state directory; no control directory of these (finished) runs in /tmp."""
    left = [str(p.relative_to(world.state)) for p in world.state.rglob("*")
            if p.name.startswith(".tmp.") or ".holder." in p.name]
    assert not left, left
    for done in runs:
        assert not list(Path("/tmp").glob(f"vqssh-{done.pid}-*")), f"control directory of pid {done.pid} left"


def converge(world: World, expected: str = "already-current") -> Done:
    again = world.run()
    assert again.outcome == expected, again.stdout + again.stderr
    no_false_ok(world, again)
    return again


# -- the local ssh client killed ---------------------------------------------------------------


def test_ssh_client_killed_just_after_the_switch_is_resolved_by_readback(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-kill-deploy")
    # activated; the ssh session stays open while the provider lingers, until the test lets it go (at most 120 s)
    release = world.marks / "release"
    world.set_deploy("", f"i=0; while [ ! -e {release} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done")
    done = ssh_client_killed_at(world, "switched", "deploy-wrapper")
    assert any("killed by SIGKILL" in e for e in done.receipt["errors"]), done.receipt["errors"]
    record("SIGKILL of the ssh client just after the switch (fixed-host deploy)", "ok", done.outcome)
    # the provider still runs (it could still change the runtime): the host-side lease is its until it ends
    held = world.run()
    release.touch()
    assert held.code == 75 and "held by the build pid" in held.receipt["errors"][-1], held.stdout
    assert wait_until(lambda: work_free(real_sshd, world.program), 60)
    clean_after(world, done, converge(world))


def test_ssh_client_killed_during_the_final_verify_is_resolved_by_readback(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-kill-verify")
    flag = world.marks / "verify-slept"
    world.set_verify(f"if [ -e {world.marks}/switched ] && [ ! -e {flag} ]; then touch {flag}; sleep 30; fi")
    done = ssh_client_killed_at(world, "verify-slept", "verify-wrapper")
    record("SIGKILL of the ssh client during the final verify", "ok", done.outcome)
    clean_after(world, done, converge(world))


def test_ssh_client_killed_during_the_pre_verify_changes_nothing(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-kill-pre")
    flag = world.marks / "pre-slept"
    world.set_verify(f"if [ ! -e {flag} ]; then touch {flag}; sleep 30; fi")
    # the pre-verify runs in the run's first agent call
    done = ssh_client_killed_at(world, "pre-slept", "vq-admin-agent session")
    assert world.active() is None and "nothing was deployed or activated" in done.receipt["readback"]["reason"]
    record("SIGKILL of the ssh client during the pre-verify", "unknown", done.outcome)
    clean_after(world, done, converge(world, "ok"))


# -- a dropped session, SIGTERM or SIGKILL while a fixed-host build runs --------------------------
#
# The build runs detached under the agent on the build host (vq-admin-agent detach-run): it survives
# its connection, this run says what it leaves behind, and the next run reconciles from the attempt
# record (75 while the build still runs; its exit status and settled transcript as evidence after).


def attempt_record(world: World) -> Path:
    return world.state / "hosts" / "cluster" / "runtime" / world.program / "attempt.json"


def attempt_dirs(world: World) -> list[Path]:
    return sorted((world.scratch / ".vq-admin" / "runtime-deploy" / world.program).glob("deploy.*"))


def left_running(world: World, done: Done) -> dict:
    """The receipt names the attempt and the pid the build keeps running under."""
    readback = done.receipt["readback"]
    (attempt,) = attempt_dirs(world)
    build = json.loads((attempt / "build").read_text())
    assert readback["attempt_dir"] == str(attempt), readback
    assert readback["build"] == (f"the build keeps running on cluster-build under attempt {attempt} "
                                 f"(pid {build['pid']}); the next run reconciles it"), readback
    assert readback["next_command"].startswith("vq admin update "), readback
    assert attempt_record(world).exists()
    return build


def reconciled(world: World) -> tuple[Done, str]:
    """The next run after the build ended (no repair), and what it observed: "<outcome> by reconcile"
    when it reconciled the attempt record (the build's exit status and settled transcript as evidence)."""
    again = world.run()
    previous = again.receipt.get("previous_attempt") or {}
    by = (previous.get("kind") == "detached" and previous.get("established") is True
          and previous.get("exit_code") == 0 and (previous.get("settle") or {}).get("settled") is True
          and bool(((previous.get("transcript") or {}).get("stdout") or {}).get("settled_digest"))
          and not attempt_record(world).exists())
    no_false_ok(world, again)
    return again, again.outcome + (" by reconcile" if by else "")


def test_a_dropped_session_during_a_fixed_host_build_is_reconciled_by_the_next_run(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-drop-build")
    # the provider writes to its stdout and stderr all along: attached to the session, it would die
    # of SIGPIPE at its next write after the drop
    world.set_deploy(f"touch {tmp_path}/marks/building; for i in 1 2 3 4 5 6 7 8; do echo step $i; "
                     "echo progress $i >&2; sleep 1; done")
    vq = world.start()
    world.mark("building")
    assert real_sshd.kill_sessions(), "no ssh session to drop"
    done = finish(vq)
    no_false_ok(world, done)  # read back at once: not yet active -> unknown, naming the attempt
    left_running(world, done)
    world.mark("switched", 60)  # the build ran to completion without its connection
    again, after = reconciled(world)
    record("sshd session dropped during a fixed-host build (the build then completes)",
           "unknown; after the build: already-current by reconcile", f"{done.outcome}; after the build: {after}")
    (attempt,) = attempt_dirs(world)
    assert "step 8" in (attempt / "stdout").read_text() and "progress 8" in (attempt / "stderr").read_text()
    assert json.loads((attempt / "exit").read_text())["exit_code"] == 0
    clean_after(world, done, again)


def test_sigterm_during_a_fixed_host_deploy_ends_promptly_and_the_build_completes(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-term-fixed")
    world.set_deploy(f"touch {tmp_path}/marks/building; for i in $(seq 1 12); do echo step $i; sleep 1; done")
    vq = world.start()
    world.mark("building")
    sent = time.monotonic()
    vq.send_signal(signal.SIGTERM)
    done = finish(vq, 30)
    assert time.monotonic() - sent < 5.0
    no_false_ok(world, done)
    build = left_running(world, done)
    assert "stage" in done.receipt["readback"]["stage"], done.receipt["readback"]
    held = world.run()  # a second run while the detached build still runs: 75, naming the attempt
    assert held.code == 75 and held.outcome == "locked", held.stdout
    last_error = held.receipt["errors"][-1]
    assert str(attempt_dirs(world)[0]) in last_error and f"pid {build['pid']}" in last_error
    assert not (world.marks / "switched").exists(), "the build ended before the second run could see it running"
    world.mark("switched", 60)
    again, after = reconciled(world)
    record("SIGTERM of vq during a fixed-host deploy (the build then completes)",
           "unknown; next run while it builds: locked; after the build: already-current by reconcile",
           f"{done.outcome}; next run while it builds: {held.outcome}; after the build: {after}")
    clean_after(world, done, held, again)


def test_sigkill_of_vq_during_a_fixed_host_deploy_is_reconciled_by_the_next_run(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-kill-vq-fixed")
    world.set_deploy(f"touch {tmp_path}/marks/building; for i in $(seq 1 6); do echo step $i; sleep 1; done")
    vq = world.start()
    world.mark("building")
    vq.kill()
    out, _ = vq.communicate(timeout=30)
    assert vq.returncode == -signal.SIGKILL and out == ""
    assert attempt_record(world).exists()
    world.mark("switched", 60)  # the build ran to completion without its driver
    (attempt,) = attempt_dirs(world)
    assert wait_until(lambda: (attempt / "exit").exists(), 30)
    again, after = reconciled(world)
    record("SIGKILL of vq during a fixed-host deploy (the build then completes)",
           "killed; after the build: already-current by reconcile", f"killed; after the build: {after}")
    clean_after(world, again)


# -- SIGTERM of vq while an allocation job waits, and while it runs -------------------------------


def _blocker(slurm) -> str:
    done = slurm.run("sbatch", "--parsable", "--job-name=chaos-blocker", f"--cpus-per-task={slurm.cpus}",
                     "--output=/dev/null",
                     "--wrap", "sleep 300", check=True)
    job = done.stdout.strip().split(";")[0]
    assert wait_until(lambda: "RUNNING" in slurm.run("scontrol", "show", "job", job).stdout, 30), "blocker not running"
    return job


def _job_gone(slurm, job: str) -> bool:
    out = slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
    return out == "" or out in ("COMPLETED", "CANCELLED", "FAILED")


def _submitted_job(world: World, program: str) -> Path:
    """The ``job`` file of the run's allocation attempt, once it records the Slurm job id (bounded)."""
    job_file = wait_until(lambda: next((p for p in (world.scratch / ".vq-admin" / "runtime-deploy" / program)
                                        .glob("deploy.*/job") if p.read_text().strip()), None), 120)
    assert job_file, "the job was never submitted"
    return job_file


def _sigterm_case(tmp_path, real_cluster, program: str, pending: bool):
    slurm = real_cluster.slurm
    world = World(tmp_path, real_cluster.sshd.ssh_config, program, allocation=True)
    world.set_deploy(f"touch {tmp_path}/marks/running; sleep 5")
    blocker = _blocker(slurm) if pending else None
    try:
        vq = world.start()
        job_file = _submitted_job(world, program)
        job = job_file.read_text().strip()
        if not pending:
            world.mark("running")
        else:
            assert "PENDING" in slurm.run("scontrol", "show", "job", job).stdout
        sent = time.monotonic()
        vq.send_signal(signal.SIGTERM)
        done = finish(vq, 30)
        took = time.monotonic() - sent
        assert took < 5.0, f"vq took {took:.1f} s to end after SIGTERM"
        readback = done.receipt["readback"]
        # the job id as the agent reported it (the report may still have been in flight at the signal:
        # then the attempt directory, whose job file holds it, is what the receipt names)
        assert readback.get("job_id") in (job, None) and readback["attempt_dir"] == str(job_file.parent), readback
        assert "keeps running" in readback["build"], readback
        no_false_ok(world, done)
        observed = done.outcome
        if pending:  # the job keeps its place in the queue; the next run reconciles it first
            held = world.run()
            assert held.code == 75 and job in held.receipt["errors"][-1], held.stdout
            observed += f"; next run while pending: {held.outcome}"
            slurm.run("scancel", blocker)
            blocker = None
        # ... and the sbatch --wait that held the host-side lease for it has noticed
        assert wait_until(lambda: _job_gone(slurm, job) and work_free(real_cluster.sshd, program), 120), \
            "the job never ended"
        world.mark("switched", 30)
        again = converge(world)
        assert again.receipt["previous_attempt"]["job_id"] == job
        clean_after(world, done, again)
        return observed + f"; after the job: {again.outcome}"
    finally:
        if blocker:
            slurm.run("scancel", blocker)


def test_sigterm_while_the_allocation_job_is_pending(tmp_path, real_cluster):
    observed = _sigterm_case(tmp_path, real_cluster, "chaos-term-pending", pending=True)
    record("SIGTERM of vq while the allocation job is pending behind a blocking job",
           "unknown; next run while pending: locked; after the job: already-current", observed)


def test_sigkill_of_vq_while_the_allocation_job_runs_is_reconciled_by_the_next_run(tmp_path, real_cluster):
    slurm = real_cluster.slurm
    program = "chaos-kill-vq-alloc"
    world = World(tmp_path, real_cluster.sshd.ssh_config, program, allocation=True)
    world.set_deploy(f"touch {tmp_path}/marks/running; sleep 5")
    vq = world.start()
    world.mark("running")
    vq.kill()
    out, _ = vq.communicate(timeout=30)
    assert vq.returncode == -signal.SIGKILL and out == ""
    assert (world.state / "hosts" / "cluster" / "runtime" / program / "attempt.json").exists()
    job = next((world.scratch / ".vq-admin" / "runtime-deploy" / program).glob("deploy.*/job")).read_text().strip()
    assert wait_until(lambda: _job_gone(slurm, job) and work_free(real_cluster.sshd, program), 120), \
        "the job never ended"
    again = converge(world)
    assert again.receipt["previous_attempt"]["job_id"] == job
    assert not (world.state / "hosts" / "cluster" / "runtime" / program / "attempt.json").exists()
    record("SIGKILL of vq while the allocation job runs", "killed; after the job: already-current",
           f"killed; after the job: {again.outcome}")
    clean_after(world, again)
    assert not list(Path("/tmp").glob(f"vqssh-{vq.pid}-*")), "the killed run's control directory was left"


def test_sigterm_while_the_allocation_job_runs(tmp_path, real_cluster):
    observed = _sigterm_case(tmp_path, real_cluster, "chaos-term-running", pending=False)
    record("SIGTERM of vq while the allocation job runs", "unknown; after the job: already-current", observed)


# -- scancel of the build job; a build cut off at timeout_seconds ----------------------------------


def _scancel_case(tmp_path, real_cluster, program: str, *, before: str, after: str, when: str) -> Done:
    slurm = real_cluster.slurm
    world = World(tmp_path, real_cluster.sshd.ssh_config, program, allocation=True)
    world.set_deploy(before, after)
    vq = world.start()
    world.mark(when)
    job_file = next((world.scratch / ".vq-admin" / "runtime-deploy" / program).glob("deploy.*/job"))
    slurm.run("scancel", job_file.read_text().strip(), check=True)
    done = finish(vq)
    no_false_ok(world, done)
    return world, done


def test_scancel_after_the_switch_is_ok_by_readback(tmp_path, real_cluster):
    world, done = _scancel_case(tmp_path, real_cluster, "chaos-scancel-after", before="", after="sleep 60",
                                when="switched")
    assert (done.receipt["deploy"]["job_state"] or "").startswith("CANCELLED"), done.receipt["deploy"]
    record("scancel of the build job just after current moves", "ok", done.outcome)
    clean_after(world, done, converge(world))


def test_scancel_before_the_switch_is_unknown_with_the_job(tmp_path, real_cluster):
    # "|| exit": the test's Slurm tracks a job's processes by /proc (proctrack/linuxproc), so scancel's
    # SIGTERM can reach sleep before the wrapper's shell, which then went on to install (seen once in CI:
    # the read-back proved the build, ok); the build must not outlive the cancel here
    world, done = _scancel_case(tmp_path, real_cluster, "chaos-scancel-before",
                                before=f"[ -e {tmp_path}/marks/started ] || "
                                       f"{{ touch {tmp_path}/marks/started; sleep 60 || exit $?; }}",
                                after="", when="started")
    readback = done.receipt["readback"]
    assert readback["job_id"] and readback["log_dir"] and (readback["job_state"] or "").startswith("CANCELLED"), \
        (done.outcome, readback, done.receipt["errors"])
    record("scancel of the build job before current moves", "unknown", done.outcome)
    clean_after(world, done, converge(world, "ok"))


def test_a_build_cut_off_at_the_bound_after_it_activated_is_ok(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster.sshd.ssh_config, "chaos-bound", allocation=True, timeout=20)
    world.set_deploy("", "sleep 60")
    done = world.run()
    no_false_ok(world, done)
    assert done.receipt["deploy"]["timed_out"] is True
    record("allocation build activated, then cut off at timeout_seconds", "ok", done.outcome)
    clean_after(world, done, converge(world))


# -- the state directory on a small tmpfs ------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "statefs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(mount: Path, free_kib: int) -> Path:
    """Fill *mount* until about *free_kib* KiB are free (never below 0)."""
    filler = mount / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                st = os.statvfs(mount)
                left = st.f_bavail * st.f_frsize - free_kib * 1024
                if left <= 0:
                    break
                fh.write(b"\0" * min(left, 1 << 20))
                fh.flush()
        except OSError:
            pass
    return filler


@pytest.mark.parametrize("free_kib", [0, 8, 32])
def test_a_full_state_filesystem_refuses_before_any_mutation(tmp_path, real_sshd, small_tmpfs, free_kib):
    state = small_tmpfs / "state"
    world = World(tmp_path, real_sshd.ssh_config, f"chaos-full-{free_kib}", state=state)
    state.mkdir(mode=0o700)
    filler = fill(small_tmpfs, free_kib)
    done = world.run()
    assert world.active() is None and not (world.scratch / ".vq-admin").exists(), "a host was changed"
    assert "KiB free" in done.receipt["errors"][0] and READ_ONLY_RAN in done.receipt["errors"][0]
    assert not [p for p in state.rglob("*") if p.is_file() and p.stat().st_size == 0 and ".holder" in p.name]
    record(f"state directory on a tmpfs with {free_kib} KiB free", "refused", done.outcome)
    filler.unlink()
    clean_after(world, done, converge(world, "ok"))


def test_the_state_filesystem_filling_after_the_host_changed(tmp_path, real_sshd, small_tmpfs):
    """The deploy itself fills the state filesystem: the receipt is still printed and names what was not stored."""
    state = small_tmpfs / "state"
    world = World(tmp_path, real_sshd.ssh_config, "chaos-fills", state=state)
    # say=False: an empty transcript, as this case was recorded with (its copy next to the receipt
    # needs no room on the full state filesystem)
    world.set_deploy("", f"{sys.executable} -c 'import os\ntry:\n"
                         f"  open(\"{small_tmpfs}/filler\",\"wb\").write(b\"0\"*(4<<20))\n"
                         f"except OSError: pass'", say=False)
    done = world.run()
    assert world.active() == world.sha
    assert done.receipt.get("stored") is False and "the receipt" in done.receipt["not_stored"], done.stdout
    assert not (state / "receipts").exists() or not list((state / "receipts").glob("*.json"))
    assert not list(state.rglob("latest.json")) and not list(state.rglob("last-ok.json"))
    record("state filesystem filled by the build after the switch", "ok (receipt printed, not stored)",
           f"{done.outcome} (receipt printed, {'not stored' if done.receipt.get('stored') is False else 'stored'})")
    (small_tmpfs / "filler").unlink()
    clean_after(world, done, converge(world))


@pytest.mark.parametrize("mode", ["json", "cron"])
def test_a_success_whose_evidence_was_not_stored_says_so_on_stderr_in_every_mode(tmp_path, real_sshd, small_tmpfs,
                                                                                   mode):
    """Issue 31 item 9: a verified success the state filesystem could not record is never silent: with
    --json and off a terminal (cron mails stderr) it names what is not recorded and the rerun that records it."""
    state = small_tmpfs / "state"
    world = World(tmp_path, real_sshd.ssh_config, f"chaos-unstored-{mode}", state=state)
    world.set_deploy("", f"{sys.executable} -c 'import os\ntry:\n"
                         f"  open(\"{small_tmpfs}/filler\",\"wb\").write(b\"0\"*(4<<20))\n"
                         f"except OSError: pass'", say=False)
    argv = world.argv() if mode == "json" else [a for a in world.argv() if a != "--json"]
    proc = subprocess.Popen(argv, env=world.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    out, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 0 and world.active() == world.sha, out + err
    assert (json.loads(out)["outcome"] == "ok") if mode == "json" else out == ""
    warning = err.strip().splitlines()
    assert warning[0].startswith(f"vq-admin: warning: runtime {world.program} on cluster: ok (exit 0), but not "
                                 f"recorded in {state}: the receipt"), err
    assert "LAST OK" in warning[0] and "still name the previous generation" in warning[1], err
    assert warning[2].endswith(f"vq admin update {world.program} cluster --expected-sha {world.sha}"), err
    record(f"state filesystem filled after the switch ({mode})", "ok, named on stderr",
           "ok, named on stderr" if "but not recorded" in err else "ok, silent")
    (small_tmpfs / "filler").unlink()
    again = converge(world)  # the rerun the warning names records it
    assert not again.stderr and again.receipt.get("stored", True)
    assert json.loads(next(state.rglob("last-ok.json")).read_text())["sha"] == world.sha
    clean_after(world, again)


# -- a verifier that prints text around its JSON -------------------------------------------------------


def test_a_verifier_printing_text_around_its_json_refuses_before_any_mutation(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-chatty")
    world._script("verify-wrapper", f"#!/bin/sh\necho Checking...\n{SITE_EXAMPLE} verify --root {world.root} \"$@\"\n"
                                    "echo done\n")
    done = world.run()
    assert done.receipt["errors"][-1].startswith("pre-verify: the verifier's output is not a receipt (")
    assert world.active() is None and not (world.marks / "switched").exists()
    record("a verifier that prints text around its JSON", "failed", done.outcome)
    world.set_verify("")
    clean_after(world, done, converge(world, "ok"))


# -- issue 26: a lease as long as the work, every bound the configured one ----------------------------


def work_free(sshd, program: str) -> bool:
    """True when no build or job holds the host-side lease's work lock of *program* (the account of the
    alias ``cluster``, whose agent state directory the fixture gives)."""
    return flock_free(sshd.agent_state("cluster") / "vq-admin-agent" / "locks" / f"runtime.{program}.lock.work")


def other_administrator(world: World, state: Path, sha: str | None = None) -> Done:
    """A run of the same configuration from another state directory (so no attempt record of the first)."""
    proc = subprocess.Popen(world.argv(sha), env=dict(world.env(), VQ_ADMIN_STATE_DIR=str(state)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    return finish(proc)


def test_a_second_administrator_waits_for_an_allocation_job_whose_driver_was_killed(tmp_path, real_cluster):
    """A's driver SIGKILLed while its job runs; B (its own state directory) is 75 naming the job until the
    job has ended, then deploys its SHA; the host runs what B's receipt and LAST OK name."""
    slurm, program = real_cluster.slurm, "chaos-two-admins-alloc"
    world = World(tmp_path, real_cluster.sshd.ssh_config, program, allocation=True)
    world.set_deploy(f"touch {tmp_path}/marks/running; i=0; while [ ! -e {tmp_path}/marks/release ] && "
                     "[ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done")
    vq = world.start(world.a)
    world.mark("running")
    vq.kill()
    vq.communicate(timeout=30)
    bob = tmp_path / "state-bob"
    held = other_administrator(world, bob)
    job = next((world.scratch / ".vq-admin" / "runtime-deploy" / program).glob("deploy.*/job")).read_text().strip()
    message = held.receipt["errors"][-1]
    assert held.code == 75 and f"allocation job {job}" in message and "whose driver has ended" in message, message
    assert f"scancel {job}" in message, message
    (world.marks / "release").touch()
    assert wait_until(lambda: _job_gone(slurm, job) and work_free(real_cluster.sshd, program), 120)
    last = other_administrator(world, bob)
    record("two administrators: SIGKILL of A's driver while its allocation job runs",
           "B locked while the job runs; after it: ok",
           f"B {held.outcome} while the job runs; after it: {last.outcome}")
    assert world.active() == world.sha and last.receipt["source"]["sha"] == world.sha
    lane = json.loads((bob / "hosts" / "cluster" / "runtime" / program / "last.json").read_text())
    assert lane["outcome"] == "ok"


def test_the_state_filesystem_filling_during_the_build(tmp_path, real_sshd, small_tmpfs):
    """The build fills the state filesystem while its transcript streams into the driver's copy: the copy
    ends, the run goes on to its final verify and prints an ok receipt it could not store."""
    state = small_tmpfs / "state"
    world = World(tmp_path, real_sshd.ssh_config, "chaos-fills-mid", state=state)
    world.set_deploy(f"{sys.executable} -c 'import os\ntry:\n"
                     f"  open(\"{small_tmpfs}/filler\",\"wb\").write(b\"0\"*(4<<20))\n"
                     f"except OSError: pass'\nfor i in $(seq 1 200); do echo line $i of the build; done")
    done = world.run()
    assert world.active() == world.sha
    assert done.receipt.get("stored") is False and "the receipt" in done.receipt["not_stored"], done.stdout
    assert "line 200 of the build" in done.receipt["command_output"]["stdout"]
    assert any("transcripts could not be stored" in note for note in done.receipt["notes"]), done.receipt["notes"]
    assert done.receipt["verify"]["final"]["proven"] is True
    record("state filesystem filled by the build while its transcript streams", "ok (receipt printed, not stored)",
           f"{done.outcome} (receipt printed, {'not stored' if done.receipt.get('stored') is False else 'stored'})")
    (small_tmpfs / "filler").unlink()
    clean_after(world, done, converge(world))


def test_a_verifier_slower_than_the_lease_wait_is_bounded_by_verify_timeout_seconds(tmp_path, real_sshd,
                                                                                    monkeypatch):
    """The pre-verify runs under verify_timeout_seconds, not the lease's own (short) wait: a verifier
    slower than the lease wait (set to 2 s by the failpoint lease-wait) under a 60 s bound is ok."""
    monkeypatch.setenv("VQ_ADMIN_TESTING", "1")
    monkeypatch.setenv("VQ_ADMIN_LEASE_WAIT", "2")
    world = World(tmp_path, real_sshd.ssh_config, "chaos-slow-verify")
    world.set_verify("sleep 4")
    done = world.run()
    record("a verifier slower than the lease's wait, under a larger verify_timeout_seconds", "ok", done.outcome)
    no_false_ok(world, done)
    clean_after(world, done)


def test_a_hung_verifier_is_failed_with_the_true_reason_and_ended_on_the_host(tmp_path, real_sshd):
    world = World(tmp_path, real_sshd.ssh_config, "chaos-hung-verify")
    world.config.write_text(world.config.read_text().replace("verify_timeout_seconds = 60",
                                                             "verify_timeout_seconds = 3"))
    world.set_verify(f"echo $$ > {world.marks}/verifier; sleep 300 & echo $! > {world.marks}/child; wait")
    started = time.monotonic()
    done = world.run()
    took = time.monotonic() - started
    error = done.receipt["errors"][-1]
    assert "the verifier did not answer within 3 s" in error and READ_ONLY_RAN in error, error
    assert "ssh" not in error and took < 30, (error, took)
    assert world.active() is None and not (world.marks / "switched").exists()
    pids = [int((world.marks / name).read_text()) for name in ("verifier", "child")]
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not left, f"left running on the login host: {left}"
    record("a hung verifier under verify_timeout_seconds = 3", "failed", done.outcome)
    clean_after(world, done)


def test_a_frozen_connection_leaves_a_lease_that_says_so(tmp_path, real_sshd):
    """The sshd process serving a run's session is stopped (SIGSTOP) and its driver gone: the next run is
    75, naming the agent's pid, that its connection is frozen, and how the lease ends."""
    from realhosts.procs import pid_alive

    world = World(tmp_path, real_sshd.ssh_config, "chaos-frozen")
    world.set_deploy(f"touch {tmp_path}/marks/building; i=0; while [ ! -e {tmp_path}/marks/release ] && "
                     "[ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done")
    vq = world.start()
    world.mark("building")
    lock = real_sshd.agent_state("cluster") / "vq-admin-agent" / "locks" / f"runtime.{world.program}.lock"
    holder = json.loads(Path(f"{lock}.holder").read_text())
    sshd = holder["agent_ppid"]
    while Path(f"/proc/{sshd}/comm").read_text().strip() != "sshd":  # up from the shell that ran the agent
        sshd = int(Path(f"/proc/{sshd}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(sshd, signal.SIGSTOP)
    try:
        vq.kill()  # its driver is gone (as after ServerAlive gave up), its connection frozen
        vq.communicate(timeout=30)
        (world.marks / "release").touch()
        assert wait_until(lambda: (world.marks / "switched").exists() and work_free(real_sshd, world.program), 60)
        held = world.run()
        message = held.receipt["errors"][-1]
        assert held.code == 75 and f"the agent pid {holder['agent_pid']}" in message, message
        assert f"its connection is frozen (pid {sshd}" in message and f"(kill {sshd})" in message, message
        print(f"\nrerun behind a frozen connection: exit 75: {message}")
    finally:
        os.kill(sshd, signal.SIGCONT)
    assert wait_until(lambda: not pid_alive(holder["agent_pid"]), 30), "the lease outlived its continued sshd"
    again, after = reconciled(world)
    record("a frozen sshd session (SIGSTOP) holding the lease; rerun", "locked; after SIGCONT: already-current",
           f"{held.outcome}; after SIGCONT: {again.outcome}")
    clean_after(world, again)


def test_scancel_of_a_pending_job_is_failed_nothing_ran(tmp_path, real_cluster):
    slurm, program = real_cluster.slurm, "chaos-scancel-pending"
    world = World(tmp_path, real_cluster.sshd.ssh_config, program, allocation=True)
    blocker = _blocker(slurm)
    try:
        vq = world.start()
        job_file = _submitted_job(world, program)
        job = job_file.read_text().strip()
        assert "PENDING" in slurm.run("scontrol", "show", "job", job).stdout
        slurm.run("scancel", job, check=True)
        done = finish(vq)
    finally:
        slurm.run("scancel", blocker)
    no_false_ok(world, done)
    error = done.receipt["errors"][-1]
    assert "the job was cancelled before it started; nothing ran" in error and job in error, error
    assert world.active() is None and not (world.marks / "switched").exists()
    assert not attempt_record(world).exists()
    record("scancel of the build job while it is pending", "failed", done.outcome)
    assert wait_until(lambda: work_free(real_cluster.sshd, program), 60)
    clean_after(world, done, converge(world, "ok"))
