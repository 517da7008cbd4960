"""The real-daemon fixtures behave like the login hosts vq-admin talks to."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from realhosts import SshdServer, remote_path
from realhosts.procs import descendants, kill_pids, wait_until

pytestmark = pytest.mark.real


def ssh(server, *remote: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``ssh -F CONFIG cluster -- REMOTE...`` and capture its output."""
    return subprocess.run(server.ssh_argv("cluster", *remote), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_true_exits_zero(real_sshd):
    assert ssh(real_sshd, "true").returncode == 0


@pytest.mark.parametrize("alias", ["cluster-login", "cluster-build", "cluster2"])
def test_every_alias_reaches_the_server(real_sshd, alias):
    done = subprocess.run(real_sshd.ssh_argv(alias, "true"), capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


def test_remote_exit_status_is_returned(real_sshd):
    assert ssh(real_sshd, "exit 7").returncode == 7


@pytest.mark.parametrize("word", ["a b'c", 'say "hi" $HOME `id` \\ *;|&', "  lead and trail  "])
def test_quoted_word_round_trips(real_sshd, word):
    done = ssh(real_sshd, "printf", "%s", shlex.quote(word))
    assert done.returncode == 0, done.stderr
    assert done.stdout == word


def test_remote_path_has_this_interpreters_scripts(real_sshd):
    done = ssh(real_sshd, "printenv", "PATH")
    assert os.path.dirname(sys.executable) in done.stdout.strip().split(":")


def test_remote_sessions_see_the_fixtures_path_not_the_accounts_bashrc(real_sshd: SshdServer) -> None:
    """The session's PATH is exactly :func:`remote_path` (``~/.bashrc`` is not read: see
    ``realhosts.sshd.SESSION_ENV``), whatever the account's dotfiles would prepend."""
    done = ssh(real_sshd, "printenv", "PATH")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == remote_path()


def test_killed_session_gives_255_promptly(real_sshd):
    client = subprocess.Popen(real_sshd.ssh_argv("cluster", "sleep", "30"), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sleepers: list[int] = []
    try:
        def remote_sleep():
            return [pid for pid, comm in descendants(real_sshd.pid) if comm == "sleep"]

        sleepers = wait_until(remote_sleep, 10.0) or []
        assert sleepers, "remote sleep never started"
        started = time.monotonic()
        assert real_sshd.kill_sessions()
        assert client.wait(timeout=5) == 255
        assert time.monotonic() - started < 3.0
    finally:
        client.kill()
        client.wait()
        kill_pids(sleepers, signal.SIGKILL)  # the remote command outlives the drop


def test_sbatch_wait_returns_job_exit_status(real_cluster):
    done = ssh(real_cluster, "sbatch", "--parsable", "--wait", "--output=/dev/null",
               "--wrap", shlex.quote("exit 3"))
    assert done.returncode == 3, done.stderr
    first_line = done.stdout.splitlines()[0]
    assert first_line.split(";")[0].isdigit(), done.stdout


def test_remote_env_has_slurm_conf(real_cluster):
    done = ssh(real_cluster, "printenv", "SLURM_CONF")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(real_cluster.slurm.conf)


def test_controller_can_be_stopped_and_restarted(real_slurm):
    real_slurm.stop_controller()
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", real_slurm.ctld_port), timeout=5).close()
    finally:
        real_slurm.start_controller()
    assert real_slurm.node_state() == "idle"
