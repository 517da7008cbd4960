"""Issue 14, continued: the local ssh client SIGKILLed at each remote step of both lanes and the feed.

tests/test_chaos.py kills the ssh client at the fixed-host deploy, the
pre-verify and the final verify.  The cases here kill it (found through
vq-admin's process tree, as the OOM killer or a logout would kill it) at
every other remote step:

* the runtime lane on a fixed build host: the build host's command-file check,
  stage-create, the archive receive (mid-transfer), stage-verify, and the
  stage reclaim after a verified switch;
* the runtime lane in an allocation: the ssh client carrying the batch
  submission and the job's follow, while the job runs and while it is
  pending behind a blocking job (the job keeps running either way), and
  then the ssh client of the reconcile that follows the job instead;
* the helper lane (``vq admin update HOST``): the pre-identity (read in
  the run's first agent call, ``vq-admin-agent session``, whose answer is
  held), the stage steps, the helper command, the read-back and the stage
  reclaim;
* the source mirror feed: the probe, the symbolic-ref reads and the read before the push, the push
  (held by the mirror's own pre-receive hook) and the confirm read after a
  push that exited 0 (held by ``git`` and ``git-upload-pack`` wrappers on the
  mirror host's PATH; no test hook in vq-admin is involved), and the site
  preparer after a confirmed feed.

A kill lands at its step without sleep-and-hope: the remote side holds the
step (a wrapper around the agent, the helper command, a hook) and writes a
marker; the test waits (bounded) for the marker and for the ssh client whose
argv carries the step, kills that client, then releases the remote side.

Every case has ONE expected outcome and the checks of tests/test_chaos.py:
no false ``ok``; never ``failed`` while the requested identity is active and
verified; ``unknown`` names what it leaves behind and the next command; no
traceback; one JSON document on stdout; the next run converges with no
repair (and reclaims any stage the killed run left); no temp file or control
directory left after it.  Rows go to the "Real faults" table through
``VQ_ADMIN_CHAOS_TABLE`` like test_chaos.py's.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helper_world import FAST_REREADS, HELPER_UPDATE, bootstrap, helper_repo, helper_table, live_identity
from realhosts import RealCluster, SshdServer, remote_path
from realhosts.procs import wait_until
from support import AGENT, VQ_ADMIN, write_config
from test_chaos import (Done, World, _blocker, _job_gone, clean_after, converge, finish, kill_ssh_client,
                        no_false_ok, record)

pytestmark = pytest.mark.real

#: Bytes of the archive the receive lets through before it holds (the archive is larger).
RECEIVE_HOLD_AT = 1 << 20
#: Seconds a held remote step waits for its release at most (the test always releases it sooner).
HOLD_BOUND = 120


# -- holding a remote step ---------------------------------------------------------------------------


def hold_script(marks: Path, real: str, verb: str, *, receive: bool = False, only_if: str | None = None) -> str:
    """A /bin/sh agent wrapper (run by a Python script): the first call of *verb* runs for real, then holds
    until released.

    The answer is written but the call does not end, so the local ssh client is
    still waiting for it when the test kills that client.  With *receive* the
    archive is passed on only up to :data:`RECEIVE_HOLD_AT` bytes before the
    hold (the kill lands mid-transfer).  For ``session`` (a run's first call:
    lease, checks, pre-identity or pre-verify in one agent start, whose ssh
    client is the run's connection master) the agent does its parts and its
    answer line is held, so the kill lands before the driver has any of them.  *only_if* is a shell test that must
    also hold (e.g. "the helper was installed").  Every other call execs the
    real agent.
    """
    held, release = shlex.quote(str(marks / "held")), shlex.quote(str(marks / "release"))
    wait = (f"i=0; while [ ! -e {release} ] && [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; i=$((i+1)); done")
    cond = f'[ "$1" = {shlex.quote(verb)} ]' + (f" && {only_if}" if only_if else "") + f" && mkdir {held} 2>/dev/null"
    if verb == "session":  # the run's first call: its parts run, its answer line is held (stdin stays the agent's)
        hold_answer = shlex.quote(
            "import os, shutil, sys, time\n"
            f"at, release = {str(marks / 'held' / 'at')!r}, {str(marks / 'release')!r}\n"
            "line = sys.stdin.buffer.readline()\n"
            "open(at, 'w').close()\n"
            f"end = time.monotonic() + {HOLD_BOUND}\n"
            "while not os.path.exists(release) and time.monotonic() < end:\n"
            "    time.sleep(0.1)\n"
            "sys.stdout.buffer.write(line); sys.stdout.buffer.flush()\n"
            "shutil.copyfileobj(sys.stdin.buffer, sys.stdout.buffer)\n")
        body = f"{shlex.quote(real)} \"$@\" | {shlex.quote(sys.executable)} -c {hold_answer}; exit $?"
    elif receive:
        throttle = shlex.quote(
            "import os, sys, time\n"
            f"held, release, limit = {str(marks / 'held' / 'at')!r}, {str(marks / 'release')!r}, {RECEIVE_HOLD_AT}\n"
            "n = 0\n"
            "while True:\n"
            "    chunk = sys.stdin.buffer.read1(min(65536, limit - n) if n < limit else 65536)\n"
            "    if not chunk:\n"
            "        break\n"
            "    sys.stdout.buffer.write(chunk); sys.stdout.buffer.flush(); n += len(chunk)\n"
            "    if n >= limit and not os.path.exists(held):\n"
            "        open(held, 'w').write(str(n))\n"
            f"        end = time.monotonic() + {HOLD_BOUND}\n"
            "        while not os.path.exists(release) and time.monotonic() < end:\n"
            "            time.sleep(0.1)\n")
        body = f"{shlex.quote(sys.executable)} -c {throttle} | {shlex.quote(real)} \"$@\"; exit $?"
    else:
        body = f"{shlex.quote(real)} \"$@\"; rc=$?; : > {held}/at; {wait}; exit $rc"
    script = f"if {cond}; then\n  {body}\nfi\nexec {shlex.quote(real)} \"$@\"\n"
    # A Python script (the agent's first word must be Python: agentjudge) that becomes this shell script.
    shell = f"['/bin/sh', '-c', {script!r}, 'agent', *sys.argv[1:]]"
    return f"#!{sys.executable}\nimport os, sys\nos.execv('/bin/sh', {shell})\n"


def held(marks: Path) -> None:
    assert wait_until(lambda: (marks / "held" / "at").exists(), 120), "the step was never held"


def release(marks: Path) -> None:
    (marks / "release").touch()


def use_agent(config: Path, old: str, new: Path) -> None:
    text = config.read_text()
    assert f'agent = "{old}"' in text
    config.write_text(text.replace(f'agent = "{old}"', f'agent = "{new}"'))


def stages(scratch: Path, kind: str, name: str) -> dict[str, bool]:
    """Every stage of *kind*/*name* under *scratch*, and whether it is marked FAILED."""
    parent = scratch / ".vq-admin" / "stage" / kind / name
    if not parent.is_dir():
        return {}
    return {p.name: (p / "FAILED").exists() for p in parent.iterdir() if p.name.startswith("stage.")}


def no_unmarked_stage(scratch: Path, kind: str, name: str, named: str | None = None) -> None:
    """After the next run nothing of the killed run's stage is left unreclaimed.

    An ``already-current`` rerun stages nothing and so reclaims nothing: the one
    stage an ``unknown`` run left (and *named* in its receipt) stays until the
    next run of the lane that stages, whose reclaim marks it abandoned.
    """
    left = [s for s, failed in stages(scratch, kind, name).items() if not failed]
    allowed = [os.path.basename(named)] if named else []
    assert left == allowed or not left, f"stages nobody reclaims: {left} (named by the receipt: {named})"


# -- the runtime lane on a fixed build host ---------------------------------------------------------


def runtime_world(tmp_path: Path, ssh_config: str, program: str, verb: str, *, receive: bool = False) -> World:
    world = World(tmp_path, ssh_config, program)
    wrapper = tmp_path / "agent-wrapper"
    wrapper.write_text(hold_script(world.marks, AGENT, verb, receive=receive))
    wrapper.chmod(0o755)
    use_agent(world.config, AGENT, wrapper)
    return world


def kill_at(world: World, needle: str) -> Done:
    vq = world.start()
    try:
        held(world.marks)
        kill_ssh_client(vq, needle)
        return finish(vq)
    finally:
        release(world.marks)
        if vq.poll() is None:
            vq.kill()
            vq.wait()


def nothing_installed(world: World, done: Done, step: str) -> None:
    """A cut staging step: failed, said to be an interrupted transport, nothing installed, the stage named."""
    assert world.active() is None and not (world.marks / "switched").exists()
    interruption = done.receipt.get("interruption") or {}
    assert interruption.get("step") == step and interruption.get("installed") == "nothing", done.receipt
    assert "killed by SIGKILL" in interruption["transport"], interruption
    assert any("the transport was interrupted" in e and "nothing was installed" in e for e in done.receipt["errors"])


@pytest.mark.parametrize("verb, step", [("stage-create", "stage-create"), ("stage-verify", "stage-verify")])
def test_ssh_client_killed_at_a_staging_step(tmp_path: Path, real_sshd: SshdServer, verb: str, step: str) -> None:
    program = f"chaos-kill-{verb}"
    world = runtime_world(tmp_path, str(real_sshd.ssh_config), program, verb)
    done = kill_at(world, f" {verb} ")
    no_false_ok(world, done)
    nothing_installed(world, done, step)
    if verb == "stage-create":  # the stage was created, its path never arrived: the next run reclaims it
        assert "stage-create may have created a stage" in done.receipt["interruption"]["stage"]
        assert list(stages(world.scratch, "runtime", program).values()) == [False]
    else:  # this run knew its stage and marked it failed over a fresh connection
        assert done.receipt["interruption"]["reclaimed_now"] is True
        assert list(stages(world.scratch, "runtime", program).values()) == [True]
    record(f"SIGKILL of the ssh client at {step} (fixed-host runtime lane)", "failed", done.outcome)
    again = converge(world, "ok")
    no_unmarked_stage(world.scratch, "runtime", program)
    clean_after(world, done, again)


def test_ssh_client_killed_mid_transfer_of_the_archive(tmp_path: Path, real_sshd: SshdServer) -> None:
    program = "chaos-kill-receive"
    world = runtime_world(tmp_path, str(real_sshd.ssh_config), program, "stage-receive", receive=True)
    world.sha = world.repo.commit("generation C: an archive larger than the hold",
                                  {"payload.txt": "0123456789abcdef" * (RECEIVE_HOLD_AT // 4)})  # 4 MiB
    done = kill_at(world, " stage-receive ")
    at = int((world.marks / "held" / "at").read_text())
    assert at < 4 * RECEIVE_HOLD_AT, "the kill did not land mid-transfer"
    no_false_ok(world, done)
    nothing_installed(world, done, "stage-receive")
    assert done.receipt["interruption"]["reclaimed_now"] is True
    assert list(stages(world.scratch, "runtime", program).values()) == [True]  # kept, marked failed
    record("SIGKILL of the ssh client mid-transfer of the archive (stage-receive)", "failed", done.outcome)
    again = converge(world, "ok")
    no_unmarked_stage(world.scratch, "runtime", program)
    clean_after(world, done, again)


def test_ssh_client_killed_at_the_command_file_checks(tmp_path: Path, real_sshd: SshdServer) -> None:
    """The build host's own ``check-paths`` call (the login host's check is a part of the run's first
    agent call, ``vq-admin-agent session``; a kill there is the pre-verify case of test_chaos.py)."""
    world = runtime_world(tmp_path, str(real_sshd.ssh_config), "chaos-kill-check", "check-paths")
    done = kill_at(world, " check-paths ")
    no_false_ok(world, done)
    assert world.active() is None and not stages(world.scratch, "runtime", "chaos-kill-check"), "staged after the check"
    assert any("killed by SIGKILL" in e and "no configured command was run" in e for e in done.receipt["errors"])
    record("SIGKILL of the ssh client at the build host's command-file check (check-paths)", "failed", done.outcome)
    clean_after(world, done, converge(world, "ok"))


def test_ssh_client_killed_at_the_stage_reclaim_after_the_switch(tmp_path: Path, real_sshd: SshdServer) -> None:
    program = "chaos-kill-reclaim"
    world = runtime_world(tmp_path, str(real_sshd.ssh_config), program, "stage-reclaim")
    done = kill_at(world, " stage-reclaim ")
    no_false_ok(world, done)
    assert world.active() == world.sha
    # the reclaim ran on the host before its answer was lost: the receipt does not claim the stage was kept
    assert any(e.startswith("stage-reclaim:") and "may have been reclaimed or kept" in e
               for e in done.receipt["errors"]), done.receipt["errors"]
    record("SIGKILL of the ssh client at the stage reclaim after a verified switch", "ok", done.outcome)
    again = converge(world)
    no_unmarked_stage(world.scratch, "runtime", program)
    clean_after(world, done, again)


# -- the runtime lane in an allocation: the ssh client carrying the submission and the follow ----------


def _alloc_kill_case(tmp_path: Path, real_cluster: RealCluster, program: str, *, pending: bool,
                     reconcile_too: bool = False) -> Done:
    slurm = real_cluster.slurm
    world = World(tmp_path, str(real_cluster.sshd.ssh_config), program, allocation=True)
    if reconcile_too:  # the job holds until released, so the reconcile is still waiting when it is killed
        world.set_deploy(f"touch {world.marks}/running; i=0; while [ ! -e {world.marks}/release ] && "
                         f"[ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; i=$((i+1)); done")
    else:
        world.set_deploy(f"touch {world.marks}/running; sleep 3")
    blocker = _blocker(slurm) if pending else None
    try:
        vq = world.start()
        attempts = world.scratch / ".vq-admin" / "runtime-deploy" / program
        job_file = wait_until(lambda: next((p for p in attempts.glob("deploy.*/job") if p.read_text().strip()), None),
                              120)
        assert job_file, "the job was never submitted"
        job = job_file.read_text().strip()
        if pending:
            assert "PENDING" in slurm.run("scontrol", "show", "job", job).stdout
        else:
            world.mark("running")
        kill_ssh_client(vq, " alloc-run ")
        if reconcile_too:
            kill_ssh_client(vq, " alloc-reconcile ")
            release(world.marks)
        if blocker:  # the job keeps its place in the queue and runs once the blocker is gone
            slurm.run("scancel", blocker)
            blocker = None
        done = finish(vq)
    finally:
        if blocker:
            slurm.run("scancel", blocker)
        release(world.marks)
    no_false_ok(world, done)
    assert done.receipt["deploy"]["job_id"] == job and done.receipt["deploy"]["reconciled"], done.receipt["deploy"]
    steps = {s["name"]: s for s in done.receipt["steps"]}
    assert steps["deploy"]["status"] == "interrupted" and "killed by SIGKILL" in steps["deploy"]["detail"]
    if reconcile_too:
        assert steps["deploy-reconcile"]["status"] == "interrupted", steps["deploy-reconcile"]
        assert steps["deploy-reconcile-2"]["status"] == "ok", steps["deploy-reconcile-2"]
    else:
        assert steps["deploy-reconcile"]["status"] == "ok"
    assert wait_until(lambda: _job_gone(slurm, job), 60)
    clean_after(world, done, converge(world))
    return done


def test_ssh_client_of_the_allocation_killed_while_the_job_runs(tmp_path: Path, real_cluster: RealCluster) -> None:
    done = _alloc_kill_case(tmp_path, real_cluster, "chaos-kill-alloc-run", pending=False)
    record("SIGKILL of the ssh client following the allocation job while it runs", "ok", done.outcome)


def test_ssh_client_of_the_allocation_killed_while_the_job_is_pending(tmp_path: Path,
                                                                      real_cluster: RealCluster) -> None:
    done = _alloc_kill_case(tmp_path, real_cluster, "chaos-kill-alloc-pending", pending=True)
    record("SIGKILL of the ssh client that submitted the allocation job while it is pending", "ok", done.outcome)


def test_ssh_client_of_the_allocation_and_then_of_its_reconcile_killed(tmp_path: Path,
                                                                       real_cluster: RealCluster) -> None:
    done = _alloc_kill_case(tmp_path, real_cluster, "chaos-kill-alloc-reconcile", pending=False, reconcile_too=True)
    record("SIGKILL of the ssh client following the allocation job, then of its first deploy-reconcile", "ok",
           done.outcome)


def test_ssh_client_of_the_first_agent_call_of_an_allocation_profile_killed(tmp_path: Path,
                                                                            real_cluster: RealCluster) -> None:
    """An allocation profile's first call (``vq-admin-agent session``: the lease and the login host's
    command check; its pre-verify runs later, after any previous attempt is reconciled) killed after
    its parts ran, before its answer arrived: nothing was staged, submitted or built."""
    program = "chaos-kill-session-alloc"
    world = World(tmp_path, str(real_cluster.sshd.ssh_config), program, allocation=True)
    wrapper = tmp_path / "agent-wrapper"
    wrapper.write_text(hold_script(world.marks, AGENT, "session"))
    wrapper.chmod(0o755)
    use_agent(world.config, AGENT, wrapper)
    done = kill_at(world, "agent-wrapper session")
    no_false_ok(world, done)
    assert world.active() is None and not stages(world.scratch, "runtime", program)
    assert not (world.scratch / ".vq-admin" / "runtime-deploy" / program).exists(), "an attempt was started"
    assert any("killed by SIGKILL" in e and "changed nothing" in e for e in done.receipt["errors"]), done.receipt
    record("SIGKILL of the ssh client of the run's first agent call (allocation profile: lease and check)",
           "failed", done.outcome)
    clean_after(world, done, converge(world, "ok"))


# -- the helper lane ---------------------------------------------------------------------------------


class HelperWorld:
    """A helper root bootstrapped at commit A, commit B requested, stages on cluster-build."""

    def __init__(self, tmp: Path, ssh_config: str, verb: str, *, only_if: str | None = None,
                 command: str | None = None, receive: bool = False):
        self.tmp = tmp
        repo, self.a = helper_repo(tmp / "repo")
        self.root = tmp / "helper"
        bootstrap(self.root, repo.path, self.a, tmp)
        payload = {"payload.txt": "0123456789abcdef" * (RECEIVE_HOLD_AT // 4)} if receive else {}  # 4 MiB
        self.sha = repo.commit("helper B", {"HELPER-NOTE": "B\n", **payload})
        self.scratch, self.marks, self.state = tmp / "scratch", tmp / "marks", tmp / "state"
        self.scratch.mkdir()
        self.marks.mkdir()
        self.installed = self.marks / "installed"
        real = str(self.root / "bin" / "vq-admin-agent")
        wrapper = tmp / "agent-wrapper"
        wrapper.write_text(hold_script(self.marks, real, verb, only_if=only_if, receive=receive))
        wrapper.chmod(0o755)
        updater = tmp / "helper-command"
        updater.write_text(f"#!/bin/sh\n{HELPER_UPDATE} --root {self.root} || exit $?\n: > {self.installed}\n"
                           + (command or ""))
        updater.chmod(0o755)
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n\n' + helper_table(
            "cluster", root=self.root, repo=repo.path, scratch=self.scratch, transport="ssh", ssh="cluster-login",
            update_host="cluster-build", agent=str(wrapper), command=str(updater)))

    def start(self) -> subprocess.Popen[str]:
        env = {**os.environ, **FAST_REREADS, "VQ_ADMIN_CONFIG": str(self.config), "VQ_ADMIN_STATE_DIR": str(self.state)}
        return subprocess.Popen([VQ_ADMIN, "update", "cluster", "--expected-sha", self.sha,
                                 "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    def run(self) -> Done:
        return finish(self.start())

    def live(self) -> str | None:
        return live_identity(self.root).get("source_sha")

    def check(self, done: Done) -> None:
        """No false ok; never failed while B is live and bound; unknown names the rerun."""
        if done.outcome in ("ok", "already-current"):
            assert self.live() == self.sha, "FALSE SUCCESS"
        if done.outcome == "failed":
            assert self.live() != self.sha
        if done.outcome == "unknown":
            readback = done.receipt["readback"]
            assert readback["next_command"] == f"vq admin update cluster --expected-sha {self.sha}"
            assert readback.get("read") and readback.get("reason")


HELPER_CASES = [
    # (case, the verb held, the needle of the ssh client, expected, hold only if)
    # the pre-identity is read in the run's first agent call (vq-admin-agent session, with the lease); killed
    # before a word of its answer arrived, the host was not reached: failed, nothing changed
    ("pre-identity", "session", "agent-wrapper session", "failed", None),
    ("stage-create", "stage-create", " stage-create ", "failed", None),
    ("stage-receive (mid-transfer)", "stage-receive", " stage-receive ", "failed", None),
    ("stage-verify", "stage-verify", " stage-verify ", "failed", None),
    ("the helper command (after it installed)", None, "helper-command", "ok", None),
    ("the read-back", "identity", " identity ", "unknown", "installed"),
    ("stage-reclaim (after the read-back matched)", "stage-reclaim", " stage-reclaim ", "ok", None),
]


@pytest.mark.parametrize("case, verb, needle, expected, only_if", HELPER_CASES,
                         ids=["pre-identity", "stage-create", "stage-receive", "stage-verify", "helper-command",
                              "read-back",
                              "stage-reclaim"])
def test_helper_lane_ssh_client_killed(tmp_path: Path, real_sshd: SshdServer, case: str, verb: str | None, needle: str,
                                       expected: str, only_if: str | None) -> None:
    marks = tmp_path / "marks"
    hold = f"[ -e {shlex.quote(str(marks / only_if))} ]" if only_if else None
    held_cmd = None
    if verb is None:  # hold the helper command itself once it has installed
        held_cmd = (f"mkdir {marks}/held && : > {marks}/held/at && i=0 && while [ ! -e {marks}/release ] "
                    f"&& [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; i=$((i+1)); done\n")
    world = HelperWorld(tmp_path, str(real_sshd.ssh_config), verb or "(none)", only_if=hold, command=held_cmd,
                        receive=verb == "stage-receive")
    vq = world.start()
    try:
        held(marks)
        kill_ssh_client(vq, needle)
        done = finish(vq)
    finally:
        release(marks)
        if vq.poll() is None:
            vq.kill()
            vq.wait()
    world.check(done)
    if expected == "failed":
        assert world.live() == world.a and not (marks / "installed").exists()
    if expected == "failed" and verb != "session":  # a stage step: the receipt says what the transport cut
        assert done.receipt["interruption"]["installed"] == "nothing", done.receipt
    if case == "pre-identity":
        assert "changed nothing" in done.receipt["readback"]["reason"] and not (marks / "installed").exists()
    record(f"SIGKILL of the ssh client at {case} (helper lane)", expected, done.outcome)
    installed = (marks / "installed").exists()
    again = world.run()
    world.check(again)
    assert again.outcome == ("already-current" if installed else "ok"), again.stdout
    assert world.live() == world.sha
    no_unmarked_stage(world.scratch, "helper", "helper",
                      (done.receipt.get("readback") or {}).get("stage") if again.outcome == "already-current" else None)
    left = [p for p in world.state.rglob("*") if p.name.startswith(".tmp.") or ".holder." in p.name]
    assert not left, left
    for run in (done, again):
        assert not list(Path("/tmp").glob(f"vqssh-{run.pid}-*"))


# -- the source mirror feed ------------------------------------------------------------------------


UPLOAD_PACK_WRAPPER = f"""#!/bin/sh
# git-upload-pack on the mirror host, first on PATH: when <mirror>.hold names a ref the mirror
# already holds (the push has landed), or <mirror>.holdread exists, the first such read is held
# until <mirror>.release exists.
repo="$1"
if {{ [ -e "$repo.holdread" ] || {{ [ -e "$repo.hold" ] && /usr/bin/git --git-dir="$repo" rev-parse -q --verify \\
     "$(cat "$repo.hold")" >/dev/null; }}; }} && mkdir "$repo.held" 2>/dev/null; then
  i=0; while [ ! -e "$repo.release" ] && [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; i=$((i+1)); done
fi
exec /usr/bin/git-upload-pack "$@"
"""

GIT_WRAPPER = f"""#!/bin/sh
# git on the mirror host, first on PATH: the probe (git -C MIRROR rev-parse --is-bare-repository)
# of a mirror with <mirror>.holdprobe, or the first symbolic-ref read of one with <mirror>.holdsymref,
# answers, then holds until <mirror>.release exists.  The feed's receive-pack (hooks off, as vq-admin
# runs it) of a mirror with <mirror>.holdpush runs with the hooks of the directory that file names
# instead: a receive slowed between the pack and the refs, as a slow or busy mirror is.
if [ "$1" = -c ] && [ "$2" = core.hooksPath=/dev/null ] && [ "$3" = receive-pack ] && [ -e "$4.holdpush" ]; then
  exec /usr/bin/git -c "core.hooksPath=$(cat "$4.holdpush")" receive-pack "$4"
fi
if {{ {{ [ "$1" = -C ] && [ "$3" = rev-parse ] && [ "$4" = --is-bare-repository ] && [ -e "$2.holdprobe" ]; }} \\
     || {{ [ "$1" = -C ] && [ "$3" = symbolic-ref ] && [ -e "$2.holdsymref" ]; }}; }} \\
   && mkdir "$2.held" 2>/dev/null; then
  /usr/bin/git "$@"; rc=$?
  i=0; while [ ! -e "$2.release" ] && [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; i=$((i+1)); done
  exit $rc
fi
exec /usr/bin/git "$@"
"""


@pytest.fixture(scope="module")
def mirror_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    """A private sshd whose sessions find the wrapper above before git's own git-upload-pack."""
    if not os.access("/usr/sbin/sshd", os.X_OK):
        pytest.skip("not installed: /usr/sbin/sshd")
    base = tmp_path_factory.mktemp("mirror-sshd")
    bindir = base / "bin"
    bindir.mkdir()
    for name, text in (("git-upload-pack", UPLOAD_PACK_WRAPPER), ("git", GIT_WRAPPER)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    server = SshdServer(base / "sshd", env={"PATH": f"{bindir}:{remote_path()}"})
    server.start()
    yield server
    server.stop()


def mirror_world(tmp_path: Path, sshd: SshdServer, program: str) -> tuple[World, Path]:
    world = World(tmp_path, str(sshd.ssh_config), program)
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    text = world.config.read_text()
    world.config.write_text(text.replace("verify_timeout_seconds = 60\n",
                                         f'verify_timeout_seconds = 60\nfeed_source_mirror = "{mirror}"\n'
                                         'lane = "release"\n'))
    return world, mirror


def refs(mirror: Path) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), "for-each-ref", "--format=%(objectname) %(refname)"],
                          capture_output=True, text=True, check=True).stdout


def killed_while_held(world: World, mirror: Path, needle: str, what: str) -> Done:
    """Start *world*'s run, wait (bounded) until the mirror holds its command, SIGKILL the ssh
    client whose command line holds *needle*, and finish the run; whatever happens, the mirror is
    released and the run ended."""
    vq = world.start()
    try:
        assert wait_until(lambda: Path(f"{mirror}.held").exists(), 120), f"{what} was never held"
        kill_ssh_client(vq, needle)
        return finish(vq)
    finally:
        Path(f"{mirror}.release").touch()
        if vq.poll() is None:
            vq.kill()
            vq.wait()


def test_ssh_client_of_the_push_killed_while_the_mirror_receives(tmp_path: Path, mirror_sshd: SshdServer) -> None:
    """The mirror's receive is held between the pack and the refs (a pre-receive hook the test's git
    wrapper puts in: the feed runs the mirror's own hooks off); its ssh client is killed; the read-back
    then shows nothing applied *yet*.  Released after vq-admin has reported, the mirror's receive goes on
    and applies the push: ``failed`` ("nothing changed") would have been false, so the feed is ``unknown``."""
    world, mirror = mirror_world(tmp_path, mirror_sshd, "chaos-kill-push")
    (tmp_path / "hooks").mkdir()
    Path(f"{mirror}.holdpush").write_text(str(tmp_path / "hooks"))
    hook = tmp_path / "hooks" / "pre-receive"
    hold = tmp_path / "hold-push"
    hook.write_text(f"#!/bin/sh\n[ -e {hold} ] || exit 0\nmkdir {world.marks}/held && : > {world.marks}/held/at\n"
                    f"i=0; while [ ! -e {world.marks}/release ] && [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; "
                    "i=$((i+1)); done\nexit 0\n")
    hook.chmod(0o755)
    hold.touch()
    before = refs(mirror)
    done = kill_at(world, "receive-pack")  # releases the hook only after vq-admin has ended
    no_false_ok(world, done)
    assert world.active() is None
    steps = {s["name"]: s for s in done.receipt["steps"]}
    assert steps["mirror-confirm"]["status"] == "ok", steps["mirror-confirm"]  # it read the refs unchanged
    readback = done.receipt["readback"]
    assert "may still be running" in readback["reason"] and "Re-check with: git -C" in readback["reason"], readback
    assert readback["build"] == "no build was started" and readback["next_command"].startswith("vq admin update ")
    # the receive the killed client left on the mirror applies the push after all
    pin = f"refs/vq/pins/{world.sha}"
    assert wait_until(lambda: pin in refs(mirror), 60), f"the mirror never applied the push: {before!r}"
    record("SIGKILL of the ssh client during the mirror push (the mirror's hook holds it, then accepts)", "unknown",
           done.outcome)
    hold.unlink()
    Path(f"{mirror}.holdpush").unlink()
    again = converge(world, "ok")
    clean_after(world, done, again)


def test_ssh_client_of_the_mirror_confirm_killed_after_the_push_exited_0(tmp_path: Path,
                                                                         mirror_sshd: SshdServer) -> None:
    world, mirror = mirror_world(tmp_path, mirror_sshd, "chaos-kill-confirm")
    Path(f"{mirror}.hold").write_text(f"refs/vq/pins/{world.sha}\n")
    done = killed_while_held(world, mirror, "git-upload-pack", "the confirm read")
    no_false_ok(world, done)
    steps = {s["name"]: s for s in done.receipt["steps"]}
    assert steps["mirror-feed"]["status"] == "ok" and steps["mirror-feed"]["exit_code"] == 0
    assert steps["mirror-confirm"]["status"] != "ok"
    assert f"refs/vq/pins/{world.sha}" in refs(mirror)  # the push did apply
    readback = done.receipt["readback"]
    assert "ls-remote" in readback["read"] and "Re-check with: git -C" in readback["reason"], readback
    assert readback["build"] == "no build was started" and world.active() is None
    record("SIGKILL of the ssh client of mirror-confirm after a push that exited 0", "unknown", done.outcome)
    Path(f"{mirror}.hold").unlink()
    again = converge(world, "ok")
    clean_after(world, done, again)



@pytest.mark.parametrize("step, hold, needle", [("mirror-probe", "holdprobe", "is-bare-repository"),
                                                ("mirror-symrefs", "holdsymref", " symbolic-ref "),
                                                ("mirror-read", "holdread", "git-upload-pack")])
def test_ssh_client_of_a_mirror_read_killed_before_the_push(tmp_path: Path, mirror_sshd: SshdServer, step: str,
                                                           hold: str, needle: str) -> None:
    world, mirror = mirror_world(tmp_path, mirror_sshd, f"chaos-kill-{step}")
    Path(f"{mirror}.{hold}").touch()
    before = refs(mirror)
    done = killed_while_held(world, mirror, needle, step)
    no_false_ok(world, done)
    assert refs(mirror) == before and world.active() is None
    steps = {s["name"]: s for s in done.receipt["steps"]}
    assert steps["mirror-feed"]["status"] == "skipped" and not stages(world.scratch, "runtime", f"chaos-kill-{step}")
    assert "nothing was pushed" in done.receipt["errors"][-1], done.receipt["errors"]
    if step != "mirror-read":  # vq-admin's own ssh client: the receipt says the transport was interrupted
        interruption = done.receipt["interruption"]
        assert interruption["step"] == step and "killed by SIGKILL" in interruption["transport"], interruption
    else:  # git's ssh client: git exits 128 ("Could not read from remote repository"), as for a refused login
        assert steps[step]["exit_code"] == 128 and "cannot read the mirror" in done.receipt["errors"][-1]
    record(f"SIGKILL of the ssh client of {step} (before the push)", "failed", done.outcome)
    Path(f"{mirror}.{hold}").unlink()
    clean_after(world, done, converge(world, "ok"))


def test_ssh_client_of_the_preparer_killed_after_the_feed(tmp_path: Path, mirror_sshd: SshdServer) -> None:
    """The site preparer (on the login host, after a confirmed feed) holds; its ssh client is killed: the
    preparer may still be running, nothing was staged or built -> ``unknown``, naming the preparer."""
    world, mirror = mirror_world(tmp_path, mirror_sshd, "chaos-kill-prepare")
    prepare = tmp_path / "prepare-hold"
    prepare.write_text(f"#!/bin/sh\nmkdir {world.marks}/held 2>/dev/null || exit 0\n: > {world.marks}/held/at\n"
                       f"i=0; while [ ! -e {world.marks}/release ] && [ $i -lt {HOLD_BOUND * 10} ]; do sleep 0.1; "
                       "i=$((i+1)); done\n")
    prepare.chmod(0o755)
    text = world.config.read_text()
    world.config.write_text(text.replace('lane = "release"\n', f'lane = "release"\nprepare_command = "{prepare}"\n'))
    done = kill_at(world, "prepare-hold")
    no_false_ok(world, done)
    assert world.active() is None and f"refs/vq/pins/{world.sha}" in refs(mirror)
    readback = done.receipt["readback"]
    assert "may still be running" in readback["preparer"] and readback["build"] == "no build was started", readback
    record("SIGKILL of the ssh client of the site preparer (after a confirmed feed)", "unknown", done.outcome)
    clean_after(world, done, converge(world, "ok"))
