"""The host-side lease: one run per lane on the login host, whatever driver runs it.

The agent verb with real processes and real flock; then whole runs over a
real loopback sshd (and ``transport = "local"``): a second administrator
(another state directory) gets 75 naming the first and runs nothing; the
lease ends with its run however the run ends (SIGKILL of the driver, a
dropped ssh connection).  Builds are held at a gate the test opens, and every
wait is on a condition with a bound.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_world import Fleet, finish, kill, wait_for, wait_gone
from realhosts import SshdServer, remote_path
from support import AGENT, VQ_ADMIN
from vq_admin.agent import cli as agent_cli
from vq_admin.agent import lease as agent_lease
from vq_admin.core import procs, securepath
from vq_admin.lanes import allocation_step
from vq_admin.lanes.allocation_stream import StreamCall
from vq_admin.report.outcome import Locked, Refused, VqAdminError
from vq_admin.report.outcome import READ_ONLY_RAN


def lease_proc(root: Path, pid: int = 111, host: str = "h", program: str = "p") -> subprocess.Popen:
    """``vq-admin-agent lease`` of an account whose state directory is *root*."""
    argv = [AGENT, "lease", "--lane", "runtime", "--host", host, "--program", program,
            "--driver-host", "admin-a", "--user", "alice", "--pid", str(pid), "--since", "2026-01-01T00:00:00Z",
            "--run-id", f"run-{pid}"]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, XDG_STATE_HOME=str(root)))


def first_line(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


# -- the agent verb ------------------------------------------------------------------------


def test_agent_lease_is_exclusive_names_the_holder_and_ends_with_its_stdin(tmp_path):
    holder = lease_proc(tmp_path, pid=111)
    held = first_line(holder)
    assert held["held"] is True and held["lock"] == f"{tmp_path}/vq-admin-agent/locks/runtime.p.lock"
    assert held["holder"]["agent_pid"] == holder.pid
    assert os.stat(tmp_path / "vq-admin-agent" / "locks").st_mode & 0o777 == 0o700

    second = lease_proc(tmp_path, pid=222)
    out, err = second.communicate(timeout=30)  # never waits: answers at once
    assert second.returncode == 75, err
    answer = json.loads(out)
    assert answer["held"] is False
    assert answer["holder"]["pid"] == 111 and answer["holder"]["driver_host"] == "admin-a"
    assert "alice@admin-a pid 111, since 2026-01-01T00:00:00Z" in answer["message"]
    assert f"the agent pid {holder.pid}" in answer["message"] and "its run is under way" in answer["message"]

    also = lease_proc(tmp_path, pid=222, host="other-name")  # however the driver names the host: same lease
    assert also.wait(timeout=30) == 75

    other_lane = lease_proc(tmp_path, pid=333, program="q")
    assert first_line(other_lane)["held"] is True  # another program's lane is not blocked
    other_lane.stdin.close()
    assert other_lane.wait(timeout=30) == 0

    holder.stdin.close()  # the run ended: the lease ends with it
    assert holder.wait(timeout=30) == 0
    assert not Path(held["lock"] + ".holder").exists()
    third = lease_proc(tmp_path, pid=444)
    assert first_line(third)["held"] is True
    third.kill()  # SIGKILL frees it too
    third.wait(timeout=30)
    fourth = lease_proc(tmp_path, pid=555)
    assert first_line(fourth)["held"] is True
    fourth.stdin.close()
    assert fourth.wait(timeout=30) == 0


FLOCK_HOLDER = """import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("lock", ["runtime.p.lock", "runtime.p.lock.work"], ids=["session", "work"])
def test_a_lease_whose_holder_record_is_missing_names_its_pid_or_is_taken_once_free(tmp_path, lock):
    """Issue 31 item 9: a lease (or its work lock) held by a process whose record is not written (yet, or
    any more) is asked for again for a few seconds: once it frees the lease is taken; still held, the
    answer names the process from /proc/locks (pid, command, start), never only "record is missing"."""
    first = lease_proc(tmp_path, pid=100)  # creates the lease directory, then frees it
    first.stdin.close()
    assert first.wait(timeout=30) == 0
    path = tmp_path / "vq-admin-agent" / "locks" / lock
    holder = subprocess.Popen([sys.executable, "-c", FLOCK_HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        out, err = lease_proc(tmp_path, pid=222).communicate(timeout=60)
        answer = json.loads(out)
        assert answer["held"] is False and answer["exit"] == 75, err
        assert "record is missing" in answer["message"] and f"held by pid {holder.pid} (" in answer["message"]
        assert sys.executable in answer["message"]  # its command
        assert re.search(r"started 20\d\d-\d\d-\d\dT", answer["message"]), answer["message"]

        contender = lease_proc(tmp_path, pid=333)
        if lock.endswith(".work"):  # at the work lock the contender holds the lease itself: seen waiting there
            main = str(tmp_path / "vq-admin-agent" / "locks" / "runtime.p.lock")
            wait_for(lambda: contender.poll() is not None or contender.pid in [h["pid"] for h in
                                                                               procs.flock_holders(main)],
                     "the contender to find the work lock held")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert first_line(contender)["held"] is True  # the lock freed within the agent's settle: taken
    contender.stdin.close()
    assert contender.wait(timeout=30) == 0


def test_agent_lease_refuses_an_unsafe_directory(tmp_path):
    (tmp_path / "vq-admin-agent").mkdir()
    os.chmod(tmp_path / "vq-admin-agent", 0o777)
    proc = lease_proc(tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert "refused" in err.decode() and "vq-admin-agent" in err.decode() and "other-writable" in err.decode()
    assert not (tmp_path / "vq-admin-agent" / "locks").exists()


def test_a_lock_that_cannot_be_taken_is_a_clear_error_not_held(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(agent_lease.fcntl, "flock", no_flock)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    answer, fd = agent_lease.take({"lane": "runtime", "program": "p", "holder": {}})
    assert fd is None and answer["exit"] == 1
    message = answer["error"]
    assert "cannot take flock on" in message and "No locks available" in message
    assert "NFS" in message and "Lustre" in message


def test_agent_lease_never_follows_a_planted_symlink(tmp_path):
    locks = tmp_path / "vq-admin-agent" / "locks"
    locks.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "vq-admin-agent", 0o700)
    target = tmp_path / "elsewhere"
    os.symlink(target, locks / "runtime.p.lock")
    proc = lease_proc(tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "symbolic link" in err.decode()
    assert not target.exists()


# -- whole runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshdServer(tmp_path_factory.mktemp("lease-sshd"), env={"PATH": remote_path()},
                        aliases=("login-a", "login-b"))
    server.start()
    yield server
    server.stop()


def fleet(tmp_path, sshd, transport="ssh") -> Fleet:
    spec = {"ssh": "login-a", "gated": True, "transport": transport}
    return Fleet(tmp_path, str(sshd.ssh_config) if transport == "ssh" else None, {"cluster": spec}, sshd=sshd)


def start_first(f: Fleet, state: Path) -> subprocess.Popen:
    first = f.update("cluster", f.a, state=state)
    wait_for(lambda: f.started() == 1 or first.poll() is not None, "the first run's build to start")
    assert first.poll() is None, first.communicate()
    return first


@pytest.mark.real
@pytest.mark.parametrize("transport", ["ssh", "local"])
def test_a_second_administrator_gets_75_naming_the_first_and_runs_nothing(tmp_path, sshd, transport):
    f = fleet(tmp_path, sshd, transport)
    first = start_first(f, tmp_path / "state-alice")
    holder = f.holder("cluster")
    assert holder["pid"] == first.pid

    bob = f.start("update", f.program, "cluster", "--expected-sha", f.b, state=tmp_path / "state-bob")
    code, out, err = finish(bob, timeout=120)
    assert code == 75, out + err
    [receipt] = f.receipts(tmp_path / "state-bob")
    assert receipt["outcome"] == "locked"
    message = receipt["errors"][-1]
    assert f"pid {first.pid}" in message and holder["since"] in message and holder["run_id"] in message
    assert f"@{os.uname().nodename}" in message
    assert all(step["status"] == "skipped" for step in receipt["steps"]), "the second run ran a step"
    assert f.started() == 1, "the second run started a build"
    assert "locked (exit 75)" in err and f"pid {first.pid}" in err and READ_ONLY_RAN in err
    print(f"\nsecond administrator ({transport}), exit {code}:\n{err.strip()}")

    f.open_gate()
    code, out, err = finish(first)
    assert code == 0, out + err
    assert json.loads(out)["outcome"] == "ok"
    assert f.lease_free("cluster") and f.holder("cluster") is None


@pytest.mark.real
def test_wait_lock_waits_for_the_lane_lock_and_the_lease_then_gives_up_with_75(tmp_path, sshd):
    """Issue 31 item 3: --wait-lock SECONDS waits for a held lease (another driver) and lane lock (the
    same state directory), then runs; a bound that runs out is 75 as before, saying it waited."""
    f = fleet(tmp_path, sshd)
    first = start_first(f, tmp_path / "state-alice")
    code, out, err = finish(f.update("cluster", f.b, "--wait-lock", "1", state=tmp_path / "state-bob"), timeout=120)
    assert code == 75, out + err
    message = json.loads(out)["errors"][-1]
    assert message.splitlines()[0].endswith(f"pid {first.pid}); {READ_ONLY_RAN}"), message
    assert re.search(r"\(waited \d+ s: --wait-lock 1\)$", message), message
    assert f.started() == 1, "the run that gave up started a build"

    waiting = {}
    for name, sha in (("bob", f.b), ("carol", f.a)):  # carol shares alice's state directory: her lane lock
        with (tmp_path / f"{name}.err").open("w") as stderr:
            waiting[name] = subprocess.Popen(
                [VQ_ADMIN, "update", f.program, "cluster", "--expected-sha", sha, "--json", "-v", "--wait-lock", "300"],
                env=f.env(tmp_path / ("state-bob" if name == "bob" else "state-alice")), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=stderr, text=True)
    wait_for(lambda: all(proc.poll() is not None or "waiting up to 300 s (--wait-lock)" in
                         (tmp_path / f"{name}.err").read_text() for name, proc in waiting.items()),
             "both runs to wait (bob for the lease, carol for the lane lock)")
    assert all(proc.poll() is None for proc in waiting.values()), {n: p.communicate() for n, p in waiting.items()}
    assert "another runtime update of cluster vibeqc is running" in (tmp_path / "carol.err").read_text()
    f.open_gate()
    code, out, err = finish(first)
    assert code == 0, out + err
    for name, proc in waiting.items():
        code, out, _ = finish(proc, timeout=300)
        err = (tmp_path / f"{name}.err").read_text()
        receipt = json.loads(out)
        assert code == 0 and receipt["outcome"] in ("ok", "already-current"), (name, out + err)
        assert receipt["lease"]["waited"]["seconds"] > 0 and receipt["lease"]["waited"]["wait_lock"] == 300
    assert f.active_sha("cluster") in (f.a, f.b) and f.lease_free("cluster")


@pytest.mark.real
def test_rollback_waits_for_the_lease_with_wait_lock(tmp_path, sshd):
    """--wait-lock on rollback (which takes the lease before its body, not in a first call): a bound that
    runs out is 75 saying it waited; a longer one waits for the other administrator, then rolls back."""
    f = fleet(tmp_path, sshd)
    f.open_gate()
    bob_state = tmp_path / "state-bob"
    for sha in (f.a, f.b):  # bob's own evidence: LAST GOOD a, LAST OK b
        code, out, err = finish(f.update("cluster", sha, state=bob_state))
        assert code == 0, out + err
    (f.gate / "open").unlink()
    started = f.started()
    first = f.update("cluster", f.a, state=tmp_path / "state-alice")  # alice deploys a: her build waits
    wait_for(lambda: f.started() > started or first.poll() is not None, "alice's build to start")
    assert first.poll() is None, first.communicate()
    code, out, err = finish(f.start("rollback", f.program, "cluster", "--json", "--wait-lock", "1", state=bob_state))
    assert code == 75 and re.search(r"\(waited \d+ s: --wait-lock 1\)$", json.loads(out)["errors"][-1]), out + err
    with (tmp_path / "bob.err").open("w") as stderr:
        bob = subprocess.Popen([VQ_ADMIN, "rollback", f.program, "cluster", "--json", "-v", "--wait-lock", "300"],
                               env=f.env(bob_state), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                               text=True)
    wait_for(lambda: bob.poll() is not None or "waiting up to 300 s" in (tmp_path / "bob.err").read_text(),
             "the rollback to wait for the lease")
    f.open_gate()
    assert finish(first)[0] == 0
    code, out, _ = finish(bob, timeout=300)
    receipt = json.loads(out)
    assert code == 0 and receipt["outcome"] == "already-current" and receipt["rollback"]["to"] == f.a, out
    assert receipt["lease"]["waited"]["seconds"] > 0 and f.active_sha("cluster") == f.a


@pytest.mark.real
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_driver_killed_mid_build_leaves_the_lease_to_its_build(tmp_path, sshd, sig):
    """Issue 26: A's driver dies while its detached build runs; B (another state directory, so no attempt
    record) is 75 naming that build until it ends, then deploys; the host agrees with the last ok."""
    f = fleet(tmp_path, sshd)
    first = start_first(f, tmp_path / "state-alice")
    agent_pid = f.holder("cluster")["agent_pid"]
    kill(first, sig)
    wait_gone(agent_pid)  # the driver's own session ended with it ...
    assert f.lease_free("cluster") and not f.lease_free("cluster", ".work")  # ... its build holds on

    code, out, err = finish(f.update("cluster", f.b, state=tmp_path / "state-bob"), timeout=120)
    assert code == 75, out + err
    message = json.loads(out)["errors"][-1]
    assert "held by the build pid" in message and "/runtime-deploy/vibeqc/deploy." in message, message
    assert f"pid {first.pid}" in message and "whose driver has ended" in message, message
    assert "it ends when the build ends" in message, message
    assert f.started() == 1, "the second run started a build"
    print(f"\nsecond administrator after {signal.Signals(sig).name} of the first: exit 75: {message}")

    f.open_gate()  # A's build finishes (A's SHA goes live), then its supervisor frees the work lock
    wait_for(lambda: f.done() == 1 and f.lease_free("cluster", ".work"), "the orphaned build to end")
    code, out, err = finish(f.update("cluster", f.b, state=tmp_path / "state-bob"), timeout=180)
    assert code == 0 and json.loads(out)["outcome"] == "ok", out + err
    assert f.active_sha("cluster") == f.b == json.loads(out)["source"]["sha"]


@pytest.mark.real
def test_sigkill_of_a_local_driver_frees_its_lease(tmp_path, sshd):
    """``transport = "local"``: the lease's agent is the driver's child and ends with it."""
    f = fleet(tmp_path, sshd, "local")
    first = start_first(f, tmp_path / "state-alice")
    agent_pid = f.holder("cluster")["agent_pid"]
    kill(first, signal.SIGKILL)
    wait_gone(agent_pid)
    assert f.lease_free("cluster")
    f.open_gate()
    wait_for(lambda: f.done() == 1, "the orphaned build to end")
    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state-bob"), timeout=120)
    assert code == 0 and json.loads(out)["outcome"] == "already-current", out + err


@pytest.mark.real
def test_two_configurations_naming_one_login_host_differently_exclude_each_other(tmp_path, sshd):
    """Issue 25: the lease belongs to the login host's account and the program: a configuration that calls
    the host ``elsewhere``, reaches it through another alias and has another scratch_root is 75 while the
    first one builds."""
    f = fleet(tmp_path / "alice", sshd)
    first = start_first(f, tmp_path / "state-alice")
    other = Fleet(tmp_path / "bob", str(sshd.ssh_config), {"elsewhere": {"ssh": "login-b"}}, sshd=sshd)
    assert other.scratch("elsewhere") != f.scratch("cluster")
    code, out, err = finish(other.update("elsewhere", other.b, state=tmp_path / "state-bob"), timeout=120)
    assert code == 75, out + err
    assert f"pid {first.pid}" in json.loads(out)["errors"][-1]
    assert not other.root("elsewhere").exists(), "the second configuration deployed"
    f.open_gate()
    code, out, err = finish(first)
    assert code == 0, out + err


@pytest.mark.real
def test_a_dropped_ssh_connection_frees_the_lease(tmp_path, sshd):
    f = fleet(tmp_path, sshd)
    first = start_first(f, tmp_path / "state-alice")
    agent_pid = f.holder("cluster")["agent_pid"]
    sshd.kill_sessions()  # every connection of this sshd drops; remote commands keep running
    wait_gone(agent_pid)
    assert f.lease_free("cluster")
    code, out, err = finish(first)
    assert code == 3, out + err  # the build's end could not be read back: unknown, not failed
    receipt = json.loads(out)
    assert receipt["lease"]["held"] is True

    f.open_gate()
    wait_for(lambda: f.done() == 1, "the orphaned build to end")  # (its output pipe is gone: it may fail)
    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state-bob"), timeout=120)
    assert code == 0 and json.loads(out)["outcome"] in ("ok", "already-current"), out + err


def test_a_provider_exiting_75_is_locked_and_its_stage_reclaimed(tmp_path):
    busy = tmp_path / "busy.sh"
    busy.write_text("#!/bin/sh\necho 'deploy lock held by pid 4242' >&2\nexit 75\n")
    busy.chmod(0o755)
    f = Fleet(tmp_path, None, {"cluster": {"transport": "local", "update": str(busy)}})
    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state"), timeout=120)
    assert code == 75, out + err
    receipt = json.loads(out)
    assert receipt["outcome"] == "locked" and receipt["deploy"]["exit_code"] == 75
    assert "EX_TEMPFAIL" in receipt["errors"][-1]
    stages = f.scratch("cluster") / ".vq-admin" / "stage" / "runtime" / "vibeqc"
    assert not list(stages.glob("stage.*")), "the stage was kept as failed"
    # a locked run did nothing: the lane's last outcome is not overwritten
    assert not (tmp_path / "state" / "hosts" / "cluster" / "runtime" / "vibeqc" / "last.json").exists()


OLD_AGENT = """\
#!/bin/sh
# An agent of another version: its session verb does not know this request (argparse's answer to a verb it
# lacks), or answers in another protocol version.
if [ "$1" = session ] && [ -n "$VQ_TEST_OTHER_VERSION" ]; then
    read -r request; echo '{{"protocol": 7}}'; exit 0
fi
if [ "$1" = lease ] || [ "$1" = session ]; then
    echo "usage: vq-admin-agent [-h] {{hash-file,stage-create}} ..." >&2
    echo "vq-admin-agent: error: argument verb: invalid choice: '$1' (choose from 'hash-file', 'stage-create')" >&2
    exit 2
fi
exec {agent} "$@"
"""


@pytest.mark.parametrize("version", ["", "7"], ids=["without-session", "protocol-7"])
def test_an_agent_of_another_version_is_refused_once_with_the_update_command(tmp_path, monkeypatch, version):
    old = tmp_path / "old-agent"
    shell = ["/bin/sh", "-c", OLD_AGENT.format(agent=AGENT), "old-agent"]  # run by a Python script (the judge's rule)
    old.write_text(f"#!{sys.executable}\nimport os, sys\nos.execv('/bin/sh', {shell!r} + sys.argv[1:])\n")
    old.chmod(0o755)
    monkeypatch.setenv("VQ_TEST_OTHER_VERSION", version)
    f = Fleet(tmp_path, None, {"cluster": {"transport": "local", "agent": str(old)}})
    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state"), timeout=120)
    assert code == 77, out + err
    receipt = json.loads(out)
    message = receipt["errors"][-1]
    assert f"speaks session protocol {version or 'none (an older helper)'}, this vq-admin 1" in message, message
    assert "update the helper first (vq admin update cluster --expected-sha SHA)" in message
    assert not f.root("cluster").exists() and all(s["status"] == "skipped" for s in receipt["steps"])


@pytest.mark.parametrize("raised, code", [
    (agent_lease.WorkHeld("the host-side lease /l is held by the build pid 7; nothing was started"), 75),
    (securepath.Untrusted("directory /s is group-writable", "/s"), 4),
    (agent_lease.LeaseError("flock does not work on /l"), 1),
])
def test_a_build_verb_that_cannot_take_the_work_lock_says_why_in_its_exit(raised, code, capsys):
    """detach-run and alloc-run take the lease's work lock before anything starts: a lock held by an
    earlier run's build is 75, an unsafe lease directory 4, a lock that does not work 1; never a
    traceback."""
    def body(_frames):
        raise raised
    assert agent_cli._alloc_verb(body) == code
    assert capsys.readouterr().err == f"vq-admin-agent: {'refused: ' if code == 4 else ''}{raised}\n"


def test_the_driver_reads_a_held_work_lock_as_locked_and_an_unsafe_path_as_refused():
    def refused(code, stderr, **more):
        call = StreamCall(["agent"], "h", exit_code=code, stderr=stderr, **more)
        return allocation_step.refused_before_submit(call, "deploy: the helper on h refused before submitting")

    held = refused(75, "held\n")
    assert isinstance(held, Locked) and "work lock is held" in str(held) and str(held).endswith(": held")
    assert isinstance(refused(4, "unsafe"), Refused)
    other = refused(2, "usage")
    assert not isinstance(other, (Locked, Refused)) and isinstance(other, VqAdminError)
    assert refused(1, "failed") is None, "not a refusal before anything started"
    assert refused(75, "", records={"job": {"job_id": "7"}}) is None, "a job was submitted: not refused before"
    assert refused(75, "", interrupted="transport") is None, "cut: its end is asked for, not refused"


def test_the_end_of_a_session_reads_to_the_close_past_an_empty_line_a_logout_file_prints():
    """The driver waits for the agent's stdout to close (the lease released on the host), not for the
    first empty line: a login shell's logout files may print one after the agent's last."""
    from vq_admin.lease import Lease
    from vq_admin.ssh.transport import LocalTransport

    lease = Lease(LocalTransport(), ["true"])
    lease.proc = subprocess.Popen(["sh", "-c", 'echo "{}"; echo; read _; echo released'],  # type: ignore[assignment]
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        lease.proc.stdin.write(b"go\n")
        lease.proc.stdin.flush()
        lease._drain(60)
        fd = lease.proc.stdout.fileno()
        assert os.read(fd, 1) == b"", "stopped before the agent's stdout closed"
    finally:
        lease.proc.kill()
        lease.proc.wait(30)
