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
import io
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from fleet_world import Fleet, finish, kill, wait_for, wait_gone
from realhosts import SshdServer, remote_path
from support import AGENT
from vq_admin.agent import lease as agent_lease


def lease_proc(root: Path, pid: int = 111, host: str = "h") -> subprocess.Popen:
    argv = [AGENT, "lease", "--root", str(root), "--lane", "runtime", "--host", host, "--program", "p",
            "--driver-host", "admin-a", "--user", "alice", "--pid", str(pid), "--since", "2026-01-01T00:00:00Z",
            "--run-id", f"run-{pid}"]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def first_line(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


# -- the agent verb ------------------------------------------------------------------------


def test_agent_lease_is_exclusive_names_the_holder_and_ends_with_its_stdin(tmp_path):
    holder = lease_proc(tmp_path, pid=111)
    held = first_line(holder)
    assert held["held"] is True and held["lock"] == f"{tmp_path}/.vq-admin/locks/runtime.h.p.lock"
    assert held["holder"]["agent_pid"] == holder.pid
    assert os.stat(tmp_path / ".vq-admin" / "locks").st_mode & 0o777 == 0o700

    second = lease_proc(tmp_path, pid=222)
    out, err = second.communicate(timeout=30)  # never waits: answers at once
    assert second.returncode == 75, err
    answer = json.loads(out)
    assert answer["held"] is False
    assert answer["holder"]["pid"] == 111 and answer["holder"]["driver_host"] == "admin-a"
    assert "alice@admin-a pid 111 since 2026-01-01T00:00:00Z" in answer["message"]

    other_lane = lease_proc(tmp_path, pid=333, host="other")
    assert first_line(other_lane)["held"] is True  # another host's lane is not blocked
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


def test_agent_lease_refuses_an_unsafe_directory(tmp_path):
    (tmp_path / ".vq-admin").mkdir()
    os.chmod(tmp_path / ".vq-admin", 0o777)
    proc = lease_proc(tmp_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 4, err
    assert "refused" in err.decode() and ".vq-admin" in err.decode() and "other-writable" in err.decode()
    assert not (tmp_path / ".vq-admin" / "locks").exists()


def test_a_lock_that_cannot_be_taken_is_a_clear_error_not_held(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(agent_lease.fcntl, "flock", no_flock)
    with pytest.raises(agent_lease.LeaseError) as caught:
        agent_lease.hold(str(tmp_path / "locks"), "runtime.h.p.lock", {}, io.BytesIO(b""), io.StringIO())
    message = str(caught.value)
    assert "cannot take flock on" in message and "No locks available" in message
    assert "NFS" in message and "Lustre" in message


def test_agent_lease_never_follows_a_planted_symlink(tmp_path):
    locks = tmp_path / ".vq-admin" / "locks"
    locks.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / ".vq-admin", 0o700)
    target = tmp_path / "elsewhere"
    os.symlink(target, locks / "runtime.h.p.lock")
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
    return Fleet(tmp_path, str(sshd.ssh_config) if transport == "ssh" else None, {"cluster": spec})


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
    assert "locked (exit 75)" in err and f"pid {first.pid}" in err and "nothing was run" in err
    print(f"\nsecond administrator ({transport}), exit {code}:\n{err.strip()}")

    f.open_gate()
    code, out, err = finish(first)
    assert code == 0, out + err
    assert json.loads(out)["outcome"] == "ok"
    assert f.lease_free("cluster") and f.holder("cluster") is None


@pytest.mark.real
@pytest.mark.parametrize("transport", ["ssh", "local"])
def test_sigkill_of_the_driver_mid_build_frees_the_lease(tmp_path, sshd, transport):
    f = fleet(tmp_path, sshd, transport)
    first = start_first(f, tmp_path / "state-alice")
    agent_pid = f.holder("cluster")["agent_pid"]
    kill(first, signal.SIGKILL)
    wait_gone(agent_pid)  # the lease agent ends once the dead driver's pipe closes
    assert f.lease_free("cluster")
    f.open_gate()  # let the orphaned build finish (it keeps running, as on a real host)
    wait_for(lambda: f.done() == 1, "the orphaned build to end")

    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state-bob"), timeout=120)
    assert code != 75, out + err
    assert code == 0 and json.loads(out)["outcome"] == "already-current", out + err


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
# An agent from before the lease verb (and so before session): argparse's answer to an unknown verb.
if [ "$1" = lease ] || [ "$1" = session ]; then
    echo "usage: vq-admin-agent [-h] {{hash-file,stage-create}} ..." >&2
    echo "vq-admin-agent: error: argument verb: invalid choice: '$1' (choose from 'hash-file', 'stage-create')" >&2
    exit 2
fi
exec {agent} "$@"
"""


def test_an_agent_without_the_lease_verb(tmp_path):
    old = tmp_path / "old-agent"
    old.write_text(OLD_AGENT.format(agent=AGENT))
    old.chmod(0o755)
    f = Fleet(tmp_path, None, {"cluster": {"transport": "local", "agent": str(old)}})
    # the runtime lane refuses (nothing runs) and says what to do
    code, out, err = finish(f.update("cluster", f.a, state=tmp_path / "state"), timeout=120)
    assert code == 77, out + err
    receipt = json.loads(out)
    assert "has no lease verb" in receipt["errors"][-1] and "vq admin update HOST" in receipt["errors"][-1]
    assert not f.root("cluster").exists()

    # the helper lane is how that agent gets updated: it runs without a lease and says so
    from vq_admin.config import load_config
    from vq_admin.context import RunContext
    from vq_admin.lease import host_lease
    from vq_admin.receipt import Receipt
    from vq_admin.state import StateDir
    from vq_admin.transport import Session

    with Session(None) as session:
        ctx = RunContext(load_config(f.config), StateDir(tmp_path / "state"), session, None)  # type: ignore[arg-type]
        receipt = Receipt("helper", "cluster", None, None, None, "2026-01-01T00:00:00Z")
        with host_lease(ctx, receipt, "helper", "cluster", None) as lease:
            assert lease is None
    assert "runs without a lease" in receipt.notes[0]
