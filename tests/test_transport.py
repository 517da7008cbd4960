"""The transport: argv quoted word by word; a transport failure is not a command failure."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from vq_admin.ssh.transport import LocalTransport, RunResult, Session, SshTransport


def test_ssh_argv_quotes_each_word_and_never_uses_a_local_shell():
    t = SshTransport("cluster", "/etc/vq/ssh_config", "/tmp/vqssh-x")
    argv = t.describe_argv(["/site/deploy", "two words", "it's", "$(rm -rf /)", "a;b"], {"VQ_HELPER_STAGE": "/s t"})
    assert argv[:3] == ["ssh", "-F", "/etc/vq/ssh_config"]
    assert "BatchMode=yes" in argv and "ServerAliveInterval=15" in argv and "ControlMaster=auto" in argv
    assert argv[-3:-1] == ["--", "cluster"]
    assert shlex.split(argv[-1]) == ["env", "--", "VQ_HELPER_STAGE=/s t", "/site/deploy", "two words", "it's",
                                      "$(rm -rf /)", "a;b"]


def test_a_destination_that_looks_like_an_option_is_rejected():
    with pytest.raises(ValueError):
        SshTransport("-oProxyCommand=evil", None, None)


def faked_ssh_run(fp, argv: list[str], **answer: object) -> RunResult:
    """*argv* run on ``cluster`` through an :class:`SshTransport` whose ssh client is faked by *fp*,
    answering with *answer* (``returncode``, ``stderr``); the login-shell probe is taken as done
    (it is tested for real in tests/trust/)."""
    fp.register(["/usr/bin/ssh", fp.any()], **answer)
    t = SshTransport("cluster", None, None)
    t.shell_checked = True
    return t.run(argv, timeout=10)


def test_ssh_exit_255_is_a_transport_interruption(fp):
    result = faked_ssh_run(fp, ["/site/verify"], returncode=255,
                           stderr="ssh: connect to host cluster port 22: Connection refused")
    assert result.interrupted == "transport" and result.exit_code == 255
    assert not result.ok and "interrupted" in result.describe()


def test_a_remote_failure_is_the_commands_exit_status(fp):
    result = faked_ssh_run(fp, ["/site/deploy"], returncode=3)
    assert result.interrupted is None and result.exit_code == 3


def test_a_timeout_kills_the_command_and_says_so():
    result = LocalTransport().run(["sleep", "30"], timeout=0.3)
    assert result.interrupted == "timeout" and result.exit_code is None
    assert result.seconds < 10


def test_local_commands_get_their_env_and_stdin():
    result = LocalTransport().run(["sh", "-c", 'printf "%s:" "$FOO"; cat'], timeout=10, env={"FOO": "bar baz"},
                                  stdin=b"in")
    assert result.ok and result.stdout == b"bar baz:in"


def test_a_missing_program_is_exit_127():
    result = LocalTransport().run(["/nonexistent/program"], timeout=10)
    assert result.exit_code == 127 and result.interrupted is None


def test_session_shares_one_control_directory_and_removes_it():
    with Session("/etc/ssh_config") as session:
        a, b = session.ssh("cluster"), session.ssh("cluster-build")
        assert a.control_dir == b.control_dir and a.control_dir.startswith("/tmp/vqssh-")
        control = a.control_dir
    import os

    assert not os.path.exists(control)


def test_an_ssh_client_killed_by_a_signal_is_an_interrupted_transport(fp):
    """The OOM killer, a logout or a SIGKILL ends the ssh client: -9 is not the remote command's status."""
    result = faked_ssh_run(fp, ["/site/deploy"], returncode=-9)
    assert result.interrupted == "transport" and result.exit_code == -9
    assert "killed by SIGKILL" in result.describe() and not result.ok


def test_a_local_command_killed_by_a_signal_did_not_choose_its_status():
    result = LocalTransport().run(["sh", "-c", "kill -KILL $$"], timeout=10)
    assert result.interrupted == "transport" and result.exit_code == -9
    assert "killed by SIGKILL" in result.describe()


def test_a_remote_exit_status_of_137_stays_the_commands_own(fp):
    result = faked_ssh_run(fp, ["/site/deploy"], returncode=137)
    assert result.interrupted is None and result.exit_code == 137


def test_the_streamed_call_of_a_killed_ssh_client_is_interrupted():
    from vq_admin.lanes.allocation_stream import stream_call

    call = stream_call(LocalTransport(), ["sh", "-c", "kill -KILL $$"], timeout=10, sinks={})
    assert call.interrupted == "transport" and call.exit_code == -9 and "killed by SIGKILL" in call.describe()


def test_control_directories_of_dead_runs_are_removed_and_live_ones_kept(tmp_path):
    import os

    from vq_admin.ssh.transport import sweep_control_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"vqssh-{dead.pid}-abc").mkdir()
    (tmp_path / f"vqssh-{dead.pid}-abc" / "sock").write_text("")
    (tmp_path / f"vqssh-{os.getppid()}-live").mkdir()
    (tmp_path / "vqssh-legacy-fresh").mkdir()
    (tmp_path / "other").mkdir()
    removed = sweep_control_dirs(str(tmp_path))
    assert removed == [str(tmp_path / f"vqssh-{dead.pid}-abc")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"vqssh-{os.getppid()}-live", "vqssh-legacy-fresh",
                                                                "other"])


def test_temp_files_of_killed_runs_are_swept_from_the_state_directory(tmp_path):
    import os

    from vq_admin.state.records import StateDir

    dead = subprocess.Popen(["true"])
    dead.wait()
    transcript = tmp_path / "receipts" / "r1.transcript"
    transcript.mkdir(parents=True)
    (transcript / f".tmp.stdout.{dead.pid}.ab12").write_text("partial")
    (transcript / f".tmp.stderr.{os.getppid()}.cd34").write_text("a live run's")
    (transcript / "stdout").write_text("kept")
    (tmp_path / "locks").mkdir()
    (tmp_path / "locks" / f"runtime.h.p.lock.holder.{dead.pid}").write_text("")
    removed = StateDir(tmp_path).sweep_leftovers()
    assert sorted(removed) == sorted([f"receipts/r1.transcript/.tmp.stdout.{dead.pid}.ab12",
                                      f"locks/runtime.h.p.lock.holder.{dead.pid}"])
    assert sorted(p.name for p in transcript.iterdir()) == sorted(["stdout", f".tmp.stderr.{os.getppid()}.cd34"])
