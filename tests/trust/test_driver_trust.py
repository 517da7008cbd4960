"""Trust boundaries on the driver (CONTRACT section 10): each attack run for real.

The administrator is this test process (root); the attacker is the
unprivileged local user ``nobody``, acting through ``setpriv``.  The attacks
use what another user of a shared machine really has: a directory they can
write (group/other-writable, not sticky) above or inside something vq-admin
reads, a state directory left loose by an earlier run, a FIFO, hostile
bytes.  Every test asserts the exact exit code, that the attacker's marker
file does not exist, that nothing under the state directory changed, and
that no traceback reached stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from support import AGENT, NOTHING_ACTIVE, VQ_ADMIN, GitRepo, run_vq, site_example_host, tree_digest, write_config
from vq_admin import bindings
from vq_admin.launcher import registry
from vq_admin.state.records import Verified
from vq_admin.config import ConfigError, parse_config
from vq_admin.context import stderr_narrator
from vq_admin.config.sbatch_args import sbatch_arg_problem

SHA = "a" * 40
OTHER = "b" * 40
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def as_nobody(*argv: str) -> None:
    """Run *argv* as the unprivileged user ``nobody`` (the attacker)."""
    subprocess.run([*NOBODY, *argv], check=True, timeout=60, stdin=subprocess.DEVNULL)


def nobody_sh(script: str) -> None:
    as_nobody("/bin/sh", "-c", script)


@pytest.fixture
def arena():
    """``base`` (root, 0711: others may traverse it, not write), ``private/`` (0711) for the
    administrator, and ``shared/`` (0777, not sticky): a directory every local user can write."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another local user")
    base = Path(tempfile.mkdtemp(prefix="vq-trust-", dir="/tmp"))
    base.chmod(0o711)
    (base / "private").mkdir()
    (base / "private").chmod(0o711)  # others may pass through, not list or write
    (base / "shared").mkdir()
    (base / "shared").chmod(0o777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def clean(result) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr


def one_line_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def local_config(path: Path, *, update: str = "/bin/true", verify: str = "/bin/true", extra: str = "",
                 host_extra: str = "", repo: str = "/nonexistent/src") -> Path:
    return write_config(path, f"""\
        {extra}
        [hosts.here]
        fleet_role = "managed"
        transport = "local"
        agent = "{AGENT}"
        {host_extra}
        [hosts.here.scheduler_runtime_deployments.vibeqc]
        update_command = "{update}"
        verify_command = "{verify}"
        source_repo = "{repo}"
        """)


def private_state(base: Path) -> Path:
    """A state directory holding one verified registry entry (made the legitimate way)."""
    state = base / "private" / "state"
    registry.record_verified(state, "cluster", "vibeqc", Verified(**{
        "sha": SHA, "tag": None, "launcher": f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python",
        "launcher_sha256": "e" * 64, "receipt": "r-1", "at": "2026-11-30T00:00:00Z"}))
    return state


def traversable(*levels: Path) -> None:
    """0711: others may pass through (as on a real system), not list or write."""
    for level in levels:
        level.chmod(0o711)


def launcher(state: Path, *args: str, config: Path | None = None):
    return run_vq("launcher", "vibeqc", "cluster", *args, state=state,
                  config=config or "/nonexistent/admin.toml", timeout=60)


# -- ssh_config --------------------------------------------------------------------------


def test_a_writable_ssh_config_with_match_exec_is_refused_before_ssh_runs(arena):
    marker = arena / "marker"
    ssh_config = arena / "shared" / "ssh_config"
    ssh_config.write_text("Host *\n  BatchMode yes\n")
    ssh_config.chmod(0o666)
    nobody_sh(f"printf 'Match exec \"touch {marker}\"\\n' >> {ssh_config}")  # the attacker's edit
    config = write_config(arena / "private" / "admin.toml", f"""\
        ssh_config = "{ssh_config}"
        [hosts.cluster]
        fleet_role = "managed"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/site/deploy"
        verify_command = "/site/verify"
        source_repo = "/srv/src/vibeqc"
        """)
    state = arena / "private" / "state"
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", SHA, "--json", config=config, state=state)
    clean(done)
    assert done.exit_code == 77, done.stderr
    assert done.json()["outcome"] == "refused"
    assert f"ssh_config: file {ssh_config} is group- and other-writable (owner root (uid 0), mode 0666)" in done.stderr
    assert "fix: make it owned by you or root and not writable by others" in done.stderr
    assert not marker.exists() and not state.exists()

    checked = run_vq("check", config=config, state=state)
    clean(checked)
    assert checked.exit_code == 77 and not marker.exists(), checked.stderr
    assert one_line_error(checked).startswith(f"vq-admin: refused: ssh_config: file {ssh_config} is group- and ")

    ssh_config.chmod(0o644)  # the file is fine now, but the directory holding it is not
    again = run_vq("check", config=config, state=state)
    assert again.exit_code == 77 and not marker.exists()
    assert (f"ssh_config {ssh_config}: directory {arena / 'shared'} is group- and other-writable without the sticky "
            "bit (owner root (uid 0), mode 0777)") in again.stderr


def test_a_configuration_file_others_can_change_stays_a_configuration_error(arena):
    config = local_config(arena / "shared" / "admin.toml")
    done = run_vq("check", config=config, state=arena / "private" / "state")
    clean(done)
    assert done.exit_code == 2
    assert one_line_error(done).startswith(f"vq-admin: usage: configuration file {config}: directory "
                                           f"{arena / 'shared'} is group- and other-writable")


# -- umask 000 -------------------------------------------------------------------------------


@pytest.mark.real
def test_state_is_created_owner_only_under_umask_000(arena):
    base = arena / "private"
    repo = GitRepo(base / "repo")
    sha = repo.commit("A")
    (base / "scratch").mkdir()
    config = write_config(base / "admin.toml", site_example_host(
        "cluster", root=base / "apps" / "vibeqc", repo=repo.path, scratch=base / "scratch"))
    state = base / "deep" / "er" / "state"  # every missing level is created, not only the leaf
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state))
    done = subprocess.run([VQ_ADMIN, "update", "vibeqc", "cluster", "--expected-sha", sha,
                           "--cluster-install", "--json"], env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for level in (base / "deep", base / "deep" / "er"):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    seen = {"dirs": 0, "files": 0}
    for dirpath, _dirnames, filenames in os.walk(state):
        assert stat.S_IMODE(os.lstat(dirpath).st_mode) == 0o700, dirpath
        seen["dirs"] += 1
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, (dirpath, name)
            seen["files"] += 1
    names = {p.name for p in state.iterdir()}
    assert {"receipts", "hosts", "registry", "locks", "admin.log"} <= names
    assert seen["files"] >= 6


# -- the registry: forged entries, symlinks, FIFOs -------------------------------------------


def forged_entry(evil: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``(entry, latest pointer)`` an attacker would write: OTHER's entry naming a launcher in *evil*."""
    forged = {"schema": registry.SCHEMA, "host": "cluster", "program": "vibeqc", "sha": OTHER,
              "launcher": f"{evil}/vibeqc-{OTHER}", "launcher_sha256": "f" * 64, "receipt": "r-evil",
              "verified_at": "2026-11-30T01:00:00Z"}
    return forged, {"schema": registry.POINTER_SCHEMA, "sha": OTHER, "receipt": "r-evil", "verified_at": "x"}


def test_a_forged_registry_entry_in_a_loose_directory_is_refused(arena):
    state = private_state(arena)
    lane = Path(registry.lane_dir(state, "cluster", "vibeqc"))
    traversable(state, state / "registry", state / "registry" / "cluster")
    lane.chmod(0o777)  # as an earlier run under umask 000 left it
    evil = arena / "shared" / "evil"
    forged, pointer = forged_entry(evil)
    nobody_sh(f"printf '%s' '{json.dumps(forged)}' > {lane}/{OTHER}.json && "
              f"printf '%s' '{json.dumps(pointer)}' > {lane}/.p && mv -f {lane}/.p {lane}/latest.json")
    before = tree_digest(state)
    for args in ((), ("--expected-sha", OTHER), ("--expected-sha", SHA)):
        done = launcher(state, *args)
        clean(done)
        assert (done.exit_code, done.stdout) == (77, ""), done.stderr
        assert "evil" not in done.stdout and "(evidence-corrupt)" in done.stderr
        assert f"directory {lane} is group- and other-writable without the sticky bit (owner root (uid 0), " \
               "mode 0777)" in done.stderr
    with pytest.raises(bindings.LauncherRefused) as refused:
        bindings.resolve_launcher("vibeqc", "cluster", state_dir=state)
    assert refused.value.code == "evidence-corrupt"
    assert tree_digest(state) == before


def test_a_forged_entry_owned_by_another_user_is_refused(arena):
    state = private_state(arena)
    entry = Path(registry.entry_path(state, "cluster", "vibeqc", SHA))
    os.chown(entry, 65534, 65534)  # what a forged file looks like, whoever placed it
    done = launcher(state, "--expected-sha", SHA)
    clean(done)
    assert done.exit_code == 77 and done.stdout == ""
    assert f"file {entry} is owned by nobody (uid 65534), not by you or root (mode 0600)" in done.stderr


def test_a_symlinked_registry_host_directory_is_refused(arena):
    state = private_state(arena)
    traversable(state)
    (state / "registry").chmod(0o777)  # loose, so the attacker can swap registry/cluster
    evil = arena / "shared" / "evil"
    forged, pointer = forged_entry(evil)
    nobody_sh(f"mkdir -p {evil}/cluster/vibeqc"
              f" && printf '%s' '{json.dumps(forged)}' > {evil}/cluster/vibeqc/{OTHER}.json"
              f" && printf '%s' '{json.dumps(pointer)}' > {evil}/cluster/vibeqc/latest.json"
              f" && mv {state}/registry/cluster {state}/registry/.old && ln -s {evil}/cluster {state}/registry/cluster")
    (state / "registry").chmod(0o700)  # even once the directory is private again, the link is not followed
    before = tree_digest(state)
    done = launcher(state)
    clean(done)
    assert (done.exit_code, done.stdout) == (77, ""), done.stderr
    assert f"{state}/registry/cluster is a symlink owned by nobody (uid 65534)" in done.stderr
    assert "never follows a symlink inside the state directory" in done.stderr
    with pytest.raises(bindings.LauncherRefused):
        bindings.resolve_launcher("vibeqc", "cluster", expected_sha=OTHER, state_dir=state)
    assert tree_digest(state) == before


@pytest.mark.parametrize("kind", ["fifo-entry", "fifo-latest", "dir-entry"])
def test_a_fifo_or_directory_in_the_registry_is_refused_without_blocking(arena, kind):
    state = private_state(arena)
    lane = Path(registry.lane_dir(state, "cluster", "vibeqc"))
    if kind == "fifo-entry":
        os.unlink(lane / f"{SHA}.json")
        os.mkfifo(lane / f"{SHA}.json", 0o600)
    elif kind == "fifo-latest":
        os.unlink(lane / "latest.json")
        os.mkfifo(lane / "latest.json", 0o600)
    else:
        os.unlink(lane / f"{SHA}.json")
        (lane / f"{SHA}.json").mkdir(mode=0o700)
    before = tree_digest(state)
    started = time.monotonic()
    done = launcher(state, "--expected-sha", SHA)
    assert time.monotonic() - started < 30
    clean(done)
    assert (done.exit_code, done.stdout) == (77, "")
    what = "FIFO" if kind.startswith("fifo") else "directory"
    assert f"is a {what}, not a regular file" in done.stderr
    assert tree_digest(state) == before


def test_a_state_directory_that_is_a_regular_file_is_refused(arena):
    state = arena / "private" / "state"
    state.write_bytes(b"not a directory\n")
    state.chmod(0o600)
    config = local_config(arena / "private" / "admin.toml")
    for done in (launcher(state, "--expected-sha", SHA),
                 run_vq("update", "vibeqc", "here", "--expected-sha", SHA, config=config, state=state),
                 run_vq("status", config=config, state=state)):
        clean(done)
        assert done.exit_code == 77, done.stderr
        assert f"state directory {state} is not a directory" in done.stderr
    assert state.read_bytes() == b"not a directory\n"


# -- the lane lock -----------------------------------------------------------------------------


def test_a_lock_holder_symlink_planted_by_another_user_overwrites_nothing(arena):
    victim = arena / "private" / "victim"
    victim.write_text("precious\n")
    state = arena / "private" / "state"
    locks = state / "locks"
    locks.mkdir(parents=True, mode=0o700)
    traversable(state)
    locks.chmod(0o777)  # left loose by an earlier run
    lock = "runtime.here.vibeqc.lock"
    nobody_sh(" && ".join(f"ln -s {victim} {locks}/{name}" for name in
                          [lock, lock + ".holder"] + [f"{lock}.holder.{pid}" for pid in range(2, 400)]))
    config = local_config(arena / "private" / "admin.toml")
    before = tree_digest(state)
    done = run_vq("update", "vibeqc", "here", "--expected-sha", SHA, "--json", config=config, state=state)
    clean(done)
    assert done.exit_code == 77, done.stderr
    assert f"directory {locks} is group- and other-writable without the sticky bit" in done.stderr
    assert victim.read_text() == "precious\n"
    assert tree_digest(state) == before

    locks.chmod(0o700)  # private again, but the symlinks are still there: never followed
    again = run_vq("update", "vibeqc", "here", "--expected-sha", SHA, "--json", config=config, state=state)
    clean(again)
    assert again.exit_code == 77 and f"{locks}/{lock} is a symlink owned by nobody" in again.stderr
    assert victim.read_text() == "precious\n"
    assert tree_digest(state) == before


# -- configured commands --------------------------------------------------------------------


def test_an_interpreter_prefixed_writable_script_is_refused(arena):
    marker = arena / "marker"
    script = arena / "shared" / "deploy.sh"
    nobody_sh(f"printf 'touch {marker}\\n' > {script}")
    verify = arena / "private" / "verify"
    verify.write_text("#!/bin/sh\necho '" + json.dumps(NOTHING_ACTIVE) + "'\n")  # nothing installed yet
    verify.chmod(0o755)
    repo = GitRepo(arena / "private" / "repo")
    sha = repo.commit("A")
    config = local_config(arena / "private" / "admin.toml", update=f"/bin/bash {script}", verify=str(verify),
                          repo=str(repo.path))
    state = arena / "private" / "state"
    done = run_vq("update", "vibeqc", "here", "--expected-sha", sha, "--json", config=config, state=state)
    clean(done)
    receipt = done.json()
    assert done.exit_code == 77 and receipt["outcome"] == "refused", done.stderr
    assert not marker.exists()
    error = receipt["errors"][0]
    assert error.startswith(f"deploy: command: file {script} is owned by nobody (uid 65534), not by you or root "
                            "(mode 0644)")
    assert error.endswith("refusing to run it")
    steps = {s["name"]: s["status"] for s in receipt["steps"]}
    assert steps["deploy"] == "failed" and steps["verify"] == "skipped"


def test_an_equals_sign_in_a_command_word_is_a_configuration_error(arena):
    config = local_config(arena / "private" / "admin.toml", update="/site/FOO=bar")
    done = run_vq("check", config=config, state=arena / "private" / "state")
    clean(done)
    assert done.exit_code == 2
    assert "hosts.here.scheduler_runtime_deployments.vibeqc.update_command: the command word '/site/FOO=bar' " \
           "contains '='" in done.stderr


# -- hostile input --------------------------------------------------------------------------


def test_a_toml_file_with_5000_nested_arrays_is_a_usage_error(arena):
    config = arena / "private" / "admin.toml"
    config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    config.chmod(0o600)
    done = run_vq("check", config=config, state=arena / "private" / "state")
    clean(done)
    assert done.exit_code == 2
    assert one_line_error(done) == f"vq-admin: usage: configuration file {config} is nested more than 64 levels deep"


def test_a_fifo_as_the_configuration_does_not_hang(arena):
    config = arena / "private" / "admin.toml"
    os.mkfifo(config, 0o600)
    started = time.monotonic()
    for verb in (["check"], ["update", "vibeqc", "here", "--expected-sha", SHA]):
        done = run_vq(*verb, config=config, state=arena / "private" / "state", timeout=30)
        clean(done)
        assert done.exit_code == 2
        assert one_line_error(done) == f"vq-admin: usage: configuration file {config} is a FIFO, not a regular file"
    assert time.monotonic() - started < 30
    assert not (arena / "private" / "state").exists()


def test_a_pin_with_50000_nested_arrays_is_refused(arena):
    state = private_state(arena)
    before = tree_digest(state)
    done = launcher(state, "--pin", "{\"a\": " + "[" * 50000 + "]" * 50000 + "}")
    clean(done)
    assert (done.exit_code, done.stdout) == (77, "")
    assert "(legacy-pin): the pin is larger than 65536 characters; it is not recognised" in done.stderr
    deep = launcher(state, "--pin", "{\"a\": " + "[" * 5000 + "]" * 5000 + "}")  # small enough, too deep
    clean(deep)
    assert (deep.exit_code, deep.stdout) == (77, "")
    assert "(legacy-pin): the pin is nested more than 64 levels deep; it is not recognised" in deep.stderr
    with pytest.raises(bindings.LauncherRefused):
        bindings.check_pin("[" * 50000 + "]" * 50000, program="vibeqc", host="cluster", state_dir=state)
    assert tree_digest(state) == before


def test_a_verify_receipt_with_a_5000_digit_integer_ends_failed(arena):
    repo = GitRepo(arena / "private" / "repo")
    sha = repo.commit("A")
    verify = arena / "private" / "verify"
    verify.write_text("#!/bin/sh\nprintf '{\"program\": \"vibeqc\", \"updater_pid\": %s}' "
                      + "9" * 5000 + "\n")
    verify.chmod(0o755)
    config = local_config(arena / "private" / "admin.toml", verify=str(verify), repo=str(repo.path))
    done = run_vq("update", "vibeqc", "here", "--expected-sha", sha, "--json", config=config,
                  state=arena / "private" / "state")
    clean(done)
    receipt = done.json()
    assert (done.exit_code, receipt["outcome"]) == (1, "failed"), done.stdout
    assert "traceback" not in receipt
    assert any("holds an integer of 5000 digits" in json.dumps(step) for step in receipt["steps"]) or \
        any("5000 digits" in e for e in receipt["errors"]), receipt["errors"]


def test_a_state_record_with_hostile_content_is_ignored_not_fatal(arena):
    state = private_state(arena)
    lane = state / "hosts" / "here" / "runtime" / "vibeqc"
    lane.mkdir(parents=True, mode=0o700)
    (lane / "last-ok.json").write_text("[" * 50000 + "]" * 50000)
    (lane / "last.json").write_text('{"exit_code": ' + "7" * 5000 + "}")
    for name in ("last-ok.json", "last.json"):
        (lane / name).chmod(0o600)
    done = run_vq("status", "--json", config=local_config(arena / "private" / "admin.toml"), state=state)
    clean(done)
    assert done.exit_code == 0, done.stderr
    assert done.json()["hosts"]["here"]["runtimes"]["vibeqc"]["last_ok"] is None


# -- smaller points ---------------------------------------------------------------------------


def test_narration_is_escaped(capsys):
    stderr_narrator(True)("deploy: exit 1: \x1b[2J\x1b]0;owned\x07 \u202e\nvq-admin: ok (exit 0)")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert err.count("\n") == 2 and "\n            vq-admin: ok" in err  # a continuation, not a line of its own


def test_verbose_narration_of_a_run_prints_no_raw_escape_sequence(arena):
    """A command word and remote stderr carrying terminal escapes reach --verbose narration escaped."""
    repo = GitRepo(arena / "private" / "repo")
    sha = repo.commit("A")
    deploy = arena / "private" / "deploy"
    deploy.write_text("#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2J' >&2\nexit 3\n")
    deploy.chmod(0o755)
    verify = arena / "private" / "verify"
    verify.write_text("#!/bin/sh\necho '" + json.dumps(NOTHING_ACTIVE) + "'\n")  # nothing installed yet
    verify.chmod(0o755)
    config = local_config(arena / "private" / "admin.toml", update=f"{deploy} \\u001b[31mred", verify=str(verify),
                          repo=str(repo.path))
    done = run_vq("update", "vibeqc", "here", "--expected-sha", sha, "--verbose", config=config,
                  state=arena / "private" / "state")
    clean(done)
    assert done.exit_code == 1, done.stderr
    assert "vq-admin: deploying vibeqc" in done.stderr and "\\x1b[31mred" in done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr


@pytest.mark.parametrize("arg, reason", [
    ("-o/tmp/x", "set by vq-admin itself"),
    ("--out=/tmp/x", "abbreviates --output"),
    ("--output=/tmp/x", "set by vq-admin itself"),
    ("-e/tmp/x", "set by vq-admin itself"),
    ("-kO", None),
    ("-ko/tmp/x", "clusters -o"),
    ("-Wo/tmp/x", "set by vq-admin itself"),
    ("--err=/tmp/x", "abbreviates --error"),
    ("--chdir=/tmp", "not an sbatch option vq-admin passes"),
    ("-D/tmp", "not an sbatch option vq-admin passes"),
    ("--uid=0", "not an sbatch option vq-admin passes"),
    ("--export=ALL,LD_PRELOAD=/tmp/x.so", "not an sbatch option vq-admin passes"),
    ("--input=/tmp/x", "not an sbatch option vq-admin passes"),
    ("--time", "needs its value attached"),
    ("-t", "needs its value attached"),
    ("--time=04:00:00", None),
    ("-t04:00:00", None),
    ("--cpus-per-task=8", None),
    ("--partition=debug", None),
    ("--exclusive", None),
])
def test_sbatch_args_are_read_the_way_sbatch_reads_them(arg, reason):
    problem = sbatch_arg_problem(arg)
    if reason is None:
        assert problem is None
    else:
        assert problem is not None and reason in problem
        table = {"hosts": {"c": {"fleet_role": "managed", "scratch_root": "/scratch/x",
                                 "scheduler_runtime_deployments": {"p": {
                                     "update_command": "/site/deploy", "verify_command": "/site/verify",
                                     "source_repo": "/srv/src", "update_allocation": {"sbatch_args": [arg]}}}}}}
        with pytest.raises(ConfigError) as error:
            parse_config(table)
        assert error.value.key == "hosts.c.scheduler_runtime_deployments.p.update_allocation.sbatch_args"


@pytest.mark.parametrize("mode", ["4755", "2755", "1755", "6755"])
def test_provider_install_refuses_setuid_setgid_and_sticky_modes(arena, mode):
    src = arena / "private" / "deploy"
    src.write_text("#!/bin/sh\nexit 0\n")
    config = local_config(arena / "private" / "admin.toml")
    dest = arena / "private" / "bin" / "deploy"
    done = run_vq("provider", "install", str(src), "--host", "here", "--dest", str(dest), "--mode", mode,
                  config=config, state=arena / "private" / "state")
    clean(done)
    assert done.exit_code == 2 and "setuid, setgid and sticky bits are refused" in done.stderr
    assert not dest.exists()


def test_provider_install_refuses_a_destination_directory_others_can_write(arena):
    src = arena / "private" / "deploy"
    src.write_text("#!/bin/sh\nexit 0\n")
    config = local_config(arena / "private" / "admin.toml")
    dest = arena / "shared" / "deploy"
    state = arena / "private" / "state"
    done = run_vq("provider", "install", str(src), "--host", "here", "--dest", str(dest), "--json",
                  config=config, state=state)
    clean(done)
    assert done.exit_code == 77, done.stderr
    assert f"directory {arena / 'shared'} is group- and other-writable" in done.stderr + done.stdout
    assert not dest.exists()
