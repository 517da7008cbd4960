"""A command file another user could have replaced is refused before it runs
(the one secure-path rule in vq_admin/core/securepath.py, called by
vq_admin.plan.execute for local commands: every absolute word, interpreter
and script alike)."""

from __future__ import annotations

import os
import textwrap

import pytest

from support import AGENT, GitRepo, run_vq, write_config
from vq_admin.core.securepath import command_problem as words_problem


def command_problem(argv):
    """The rule on *argv* (a single string: one word, the command file itself)."""
    return words_problem([argv] if isinstance(argv, str) else argv)


def script(path, mode=0o755, text="#!/bin/sh\nexit 0\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_group_or_world_writable_command_file_is_named(tmp_path, mode):
    cmd = script(tmp_path / "bin" / "deploy", mode)
    who = {0o775: "group-writable", 0o757: "other-writable", 0o777: "group- and other-writable"}[mode]
    assert command_problem(str(cmd)) == (
        f"command: file {cmd} is {who} (owner root (uid 0), mode {mode:04o}); another user could change what "
        f"vq-admin reads or runs there; fix: make it owned by you or root and not writable by others "
        f"(chmod go-w {cmd})")


def test_a_writable_directory_above_it_is_named(tmp_path):
    cmd = script(tmp_path / "site" / "bin" / "deploy")
    (tmp_path / "site").chmod(0o777)
    problem = command_problem(str(cmd))
    assert problem.startswith(f"command {cmd}: directory {tmp_path / 'site'} is group- and other-writable without "
                              f"the sticky bit (owner root (uid 0), mode 0777); ")
    assert f"fix: use a private directory (owned by you, mode 0700) instead, or make {tmp_path / 'site'} " in problem


def test_every_absolute_word_is_checked_interpreter_and_script(tmp_path):
    """``/bin/bash /writable/deploy.sh``: the interpreter is fine, the script is not."""
    deploy = script(tmp_path / "site" / "deploy.sh", 0o757)
    problem = command_problem(["/bin/bash", str(deploy), "--flag", "relative/path"])
    assert problem is not None and problem.startswith(f"command: file {deploy} is other-writable")
    assert command_problem(["/bin/bash", str(script(tmp_path / "ok" / "deploy.sh"))]) is None


def test_a_sticky_directory_is_not_a_problem(tmp_path):
    cmd = script(tmp_path / "shared" / "deploy")
    (tmp_path / "shared").chmod(0o1777)  # like /tmp: others cannot rename or remove what they do not own
    assert command_problem(str(cmd)) is None


def test_another_owner_is_named(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file away")
    cmd = script(tmp_path / "deploy")
    os.chown(cmd, 4242, 4242)
    assert command_problem(str(cmd)).startswith(f"command: file {cmd} is owned by uid 4242, not by you or root "
                                                "(mode 0755)")


def test_a_symlink_is_judged_by_its_target_too(tmp_path):
    target = script(tmp_path / "real" / "deploy", 0o777)
    link = tmp_path / "bin" / "deploy"
    link.parent.mkdir()
    link.symlink_to(target)
    assert command_problem(str(link)).startswith(f"command {link}: file {target} is group- and other-writable "
                                                 "(owner root (uid 0), mode 0777)")


def test_safe_missing_and_relative_commands_pass(tmp_path):
    assert command_problem(str(script(tmp_path / "deploy", 0o755))) is None
    assert command_problem(str(tmp_path / "missing")) is None  # running it gives exit 127, as before
    assert command_problem("git") is None  # found in PATH; not a configured file


@pytest.mark.real
def test_the_runtime_lane_refuses_before_running_it(tmp_path):
    ran = tmp_path / "ran"
    verify = script(tmp_path / "site" / "verify", 0o775, f"#!/bin/sh\ntouch {ran}\necho '{{}}'\n")
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("A")
    config = write_config(tmp_path / "admin.toml", textwrap.dedent(f"""\
        [hosts.here]
        fleet_role = "managed"
        transport = "local"
        agent = "{AGENT}"
        [hosts.here.scheduler_runtime_deployments.vibeqc]
        update_command = "/bin/true"
        verify_command = "{verify}"
        source_repo = "{repo.path}"
        """))
    done = run_vq("update", "vibeqc", "here", "--expected-sha", sha, "--json", config=config, state=tmp_path / "state")
    receipt = done.json()
    assert done.exit_code == 77 and receipt["outcome"] == "refused", done.stdout + done.stderr
    assert receipt["errors"] == [f"pre-verify: command: file {verify} is group-writable (owner root (uid 0), "
                                 "mode 0775); "
                                 "another user could change what vq-admin reads or runs there; fix: make it owned by "
                                 f"you or root and not writable by others (chmod go-w {verify}); refusing to run it"]
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["pre-verify"]["status"] == "failed" and steps["deploy"]["status"] == "skipped"
    assert not ran.exists(), "the writable command ran"

    verify.chmod(0o755)  # fixed: it runs (and this verify's empty receipt is then a failed verify, not a refusal)
    again = run_vq("update", "vibeqc", "here", "--expected-sha", sha, "--json", config=config, state=tmp_path / "state")
    assert ran.exists() and again.json()["outcome"] != "refused", again.stdout


def test_a_missing_program_in_a_sticky_world_writable_directory_is_refused(tmp_path):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: anyone may create the name first
    problem = command_problem(str(sticky / "x"))
    assert problem is not None and f"{sticky / 'x'} does not exist and directory {sticky} (mode 1777) lets " \
        "other users create it" in problem
    from vq_admin.core.sshconfig import effective_problem

    problem, _ = effective_problem(f"proxycommand {sticky / 'x'} %h\n", "cluster")
    assert problem is not None and "lets other users create it" in problem


@pytest.mark.parametrize("line", ['Match Exec "{x} %h"', 'Match !exec "{x}"', "Match all exec {x}",
                                  'match host cluster exec "/bin/sh {x}"', 'MATCH host c EXEC "{x}"'])
def test_match_exec_is_judged_whatever_its_case_or_negation(tmp_path, line):
    from vq_admin.core.sshconfig import text_problem

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    x = script(shared / "x")
    config = tmp_path / "config"
    config.write_text(line.format(x=x) + "\n")
    config.chmod(0o600)
    problem = text_problem(str(config))
    assert problem is not None and f"directory {shared} is group-writable" in problem and "ssh would run it" in problem


def test_an_ssh_config_over_the_bound_is_refused_not_read_as_empty(tmp_path):
    from vq_admin.core.sshconfig import text_problem

    config = tmp_path / "config"
    config.write_text("# padding\n" * (1 << 17) + "ProxyCommand /nonexistent/proxy %h\n")  # just over 1 MiB
    config.chmod(0o600)
    assert text_problem(str(config)) == f"ssh_config {config} is not a regular file of at most 1 MiB"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert text_problem(str(fifo)) == f"ssh_config {fifo} is not a regular file of at most 1 MiB"


def test_a_destination_judged_in_a_thread_gets_the_answer_judged_in_place(tmp_path, monkeypatch):
    """The cron no-op starts a destination's judgement (its ssh -G) early, in a thread
    (vq_admin.ssh.effective.start): the run's own check then gets that answer, the same one."""
    from vq_admin.ssh import effective

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host cluster\n  HostName 127.0.0.1\n  PKCS11Provider {script(shared / 'p11.so')}\n")
    in_place = effective.problem(str(config), "cluster")
    assert in_place is not None and "p11.so" in in_place
    effective.start(str(config), "cluster")
    assert effective.problem(str(config), "cluster") == in_place
    assert not effective._started

    calls = []

    def judge(*args):  # the thread's judgement fails: the run's own call judges again, and its outcome counts
        calls.append(args)
        if len(calls) == 1:
            raise OSError("in the thread")
        return "judged in place"

    monkeypatch.setattr(effective, "_judge", judge)
    effective.start(str(config), "other")
    assert effective.problem(str(config), "other") == "judged in place" and len(calls) == 2
