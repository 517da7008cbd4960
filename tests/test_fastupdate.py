"""Cron's already-current ``update PROGRAM HOST --expected-sha SHA`` starts its one ssh process
right after the configuration is read, before the command line is parsed (vq_admin.ssh.early_start);
anything unusual starts nothing there, and the full path then behaves exactly as it did.

The ssh here is a double (a script that logs its argv and what reached its stdin, and ends when
its stdin closes): these tests are about what the driver starts and when.  The same early start
over the real sshd is what every already-current run of tests/test_fast_paths.py,
tests/test_lease.py and tests/trust/ goes through (``vq_admin.entry.main``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import write_config
from vq_admin.core.agentjudge import JUDGE_PYTHON
from vq_admin.ssh.early_start import parse_update

SHA = "a" * 40
UPDATE = ["vibeqc", "cluster", "--expected-sha", SHA]

#: What the early start never imports before its ssh process starts (the command line, the providers).
EARLY_NEVER = ("argparse", "pluggy", "plumbum", "importlib.metadata", "vq_admin.cli", "vq_admin.commands",
               "vq_admin.lanes", "vq_admin.plugins")


def fake_ssh(tmp_path: Path) -> tuple[Path, Path]:
    """(PATH directory, log): an ``ssh`` that logs its argv and its stdin, then ends at end-of-file."""
    wrap, log = tmp_path / "wrap", tmp_path / "ssh.log"
    wrap.mkdir(exist_ok=True)
    script = wrap / "ssh"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "ssh $*" >> {log}\ncat > {log}.stdin\n')
    script.chmod(0o755)
    return wrap, log


def ssh_starts(log: Path) -> list[str]:
    """The ssh processes the double logged (one line each; the probe's newline word continues a line)."""
    # An ``ssh -G`` (the configuration judgement, vq_admin.ssh.effective, before any ssh connects)
    # connects nowhere and is not one of the run's ssh processes: left out here, on purpose.
    return [line for line in log.read_text().splitlines()
            if line.startswith("ssh ") and not line.startswith("ssh -G ")] if log.exists() else []


def config_text(tmp_path: Path, *, host: str = "", profile: str = "", ssh_config: bool = True) -> str:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host cluster\n  HostName 127.0.0.1\n")
    cfg.chmod(0o600)
    head = f'ssh_config = "{cfg}"\n' if ssh_config else ""
    return (head + f'[hosts.cluster]\nfleet_role = "managed"\nssh = "cluster"\nagent = "/opt/vq/bin/vq-admin-agent"\n'
            f'{host}\n[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nupdate_command = "/opt/u"\n'
            f'verify_command = "/opt/v"\nsource_repo = "{tmp_path}/src"\n{profile}\n')


PROBE = r"""
import json, os, sys
_before = set(sys.modules)
from vq_admin.ssh import early_start as fastupdate
seen = {}
import subprocess
_real = subprocess.Popen

def spy(argv, *args, **kwargs):  # what is loaded when the ssh process starts
    if list(argv)[1:2] == ["-G"]:  # the configuration judgement (vq_admin.ssh.effective): connects nowhere
        seen.setdefault("judged", list(argv))
        return _real(argv, *args, **kwargs)
    seen.setdefault("judged_first", "judged" in seen)
    seen.setdefault("modules", sorted(set(sys.modules) - _before))
    seen.setdefault("argv", list(argv))
    return _real(argv, *args, **kwargs)

subprocess.Popen = spy
early = fastupdate.start(sys.argv[1:])
subprocess.Popen = _real
result = {"started": "argv" in seen, "modules": seen.get("modules"), "argv": seen.get("argv"),
          "judged_first": seen.get("judged_first")}
if early is not None:
    transport = early.session.ssh(early.config.hosts["cluster"].ssh)
    result["dir"] = transport.control_dir
    early.close()
print(json.dumps(result))
"""


def probe(tmp_path: Path, words: list[str], config: Path | None) -> tuple[dict, list[str]]:
    wrap, log = fake_ssh(tmp_path)
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config or tmp_path / "absent"))
    done = subprocess.run([sys.executable, "-c", PROBE, *words], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), ssh_starts(log)


def test_the_early_start_is_the_sessions_ssh_process_and_imports_no_command_line(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    result, started = probe(tmp_path, UPDATE, config)
    assert result["started"] and result["judged_first"], result  # ssh -G judged the destination first
    loaded = set(result["modules"])
    assert not [m for m in loaded if m in EARLY_NEVER or m.split(".")[0] in EARLY_NEVER], sorted(loaded)
    # the run's connection master, the agent judged (vq_admin.core.agentjudge) with the probe words on
    # the line, in the session's control directory
    assert "ControlMaster=yes" in result["argv"] and result["argv"][-1].startswith(f"{JUDGE_PYTHON} '-I' '-S' "), result
    assert " 1 /opt/vq/bin/vq-admin-agent session --probe " in result["argv"][-1], result
    assert f"ControlPath={result['dir']}/%C" in result["argv"], result
    assert not Path(result["dir"]).exists()  # closed: the session removed its directory
    assert len(started) == 1
    assert (tmp_path / "ssh.log.stdin").read_bytes() == b""  # nothing asked: its stdin closed unused


def test_the_console_script_starts_ssh_before_the_command_line_is_imported(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    wrap, log = fake_ssh(tmp_path)
    code = ("import json, os, sys\nfrom vq_admin.ssh import early_start as fastupdate\n_start = fastupdate.start\n"
            "def start(words):\n    early = _start(words)\n"
            "    print(json.dumps({'started': early is not None, 'cli': 'vq_admin.cli' in sys.modules,\n"
            "                      'argparse': 'argparse' in sys.modules}), flush=True)\n"
            "    early.close()\n    os._exit(0)\n"
            "fastupdate.start = start\n"
            "sys.argv = ['vq', 'admin', 'update', *sys.argv[1:]]\nfrom vq_admin.entry import main\nmain()\n")
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-c", code, *UPDATE], capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)
    assert json.loads(done.stdout) == {"started": True, "cli": False, "argparse": False}, done.stdout + done.stderr
    assert len(ssh_starts(log)) == 1


@pytest.mark.parametrize("words", [
    ["vibeqc", "cluster"],  # no --expected-sha: the full parser's usage error
    ["vibeqc", "cluster", "--expected-sha", SHA, "--dry-run"],
    ["vibeqc", "cluster", "--expected", SHA],  # an abbreviation argparse would take
    ["vibeqc", "cluster", "--expected-sha", SHA, "--expected-sha", SHA],
    ["vibeqc", "cluster", "--expected-sha", "--json"],
    ["vibeqc", "cluster", "--expected-sha=", "--json"],
    ["vibeqc", "cluster", "--expected-sha", SHA, "--json=1"],
    ["vibeqc", "cluster", "--", "--expected-sha", SHA],
    ["vibeqc", "--expected-sha", SHA],
    ["vibeqc", "cluster", "x", "--expected-sha", SHA],
    ["vibeqc", "cluster", "--expected-sha", SHA, "--all"],
    ["vibeqc", "cluster", "--expected-sha", SHA, "-vv"],
    ["vibeqc", "cluster", "--expected-sha", SHA, "--force"],
    ["vibeqc", "cluster", "--expected-sha", SHA, "--help"],
    ["vibeqc", "--json", "cluster", "--expected-sha", SHA],  # argparse's PROGRAM HOST is one run of words
])
def test_an_unusual_command_line_is_left_to_the_full_parser(words):
    assert parse_update(words) is None


def test_the_usual_command_lines():
    assert parse_update(UPDATE) == {"program": "vibeqc", "host": "cluster", "expected_sha": SHA}
    assert parse_update(["--json", f"--expected-sha={SHA}", "vibeqc", "cluster", "-v", "--tag", "v1",
                         "--config", "/c.toml", "--state-dir=/s", "--verbose"]) == {
        "program": "vibeqc", "host": "cluster", "expected_sha": SHA, "tag": "v1", "config": "/c.toml",
        "state_dir": "/s"}


UNUSUAL = {
    "short sha": (["vibeqc", "cluster", "--expected-sha", "abc123"], {}),
    "bad program": (["vi/beqc", "cluster", "--expected-sha", SHA], {}),
    "bad tag": ([*UPDATE, "--tag", "a..b"], {}),
    "alias host": (UPDATE, {"host": 'canonical_host = "other"', "replace": ('"managed"', '"alias"'),
                            "extra": '[hosts.other]\nfleet_role = "managed"\n'}),
    "helper-only": (UPDATE, {"replace": ('"managed"', '"helper-only"')}),
    "local transport": (UPDATE, {"host": 'transport = "local"'}),
    "no profile": (["other", "cluster", "--expected-sha", SHA], {}),
    "unknown host": (["vibeqc", "elsewhere", "--expected-sha", SHA], {}),
    "agent not literal": (UPDATE, {"replace": ('agent = "/opt/vq/bin/vq-admin-agent"', 'agent = "\'/opt/a b\' x"')}),
    "writable ssh_config": (UPDATE, {"ssh_config_mode": 0o666}),
    "writable configuration": (UPDATE, {"config_mode": 0o666}),
    "not TOML": (UPDATE, {"replace": ("[hosts.cluster]", "[hosts.cluster")}),
    "missing configuration": (UPDATE, {"absent": True}),
}


def unusual_config(tmp_path: Path, how: dict) -> Path:
    """The configuration of an :data:`UNUSUAL` case (written, with its and the ssh_config's modes)."""
    text = config_text(tmp_path, host=how.get("host", ""))
    if "replace" in how:
        text = text.replace(*how["replace"], 1)
    text += how.get("extra", "")
    config = write_config(tmp_path / "admin.toml", text)
    config.chmod(how.get("config_mode", 0o600))
    (tmp_path / "ssh_config").chmod(how.get("ssh_config_mode", 0o600))
    return config


@pytest.mark.parametrize("case", sorted(UNUSUAL))
def test_anything_unusual_starts_nothing_early(tmp_path, case):
    words, how = UNUSUAL[case]
    config = unusual_config(tmp_path, how)
    result, started = probe(tmp_path, words, None if how.get("absent") else config)
    assert not result["started"] and started == [], (result, started)


def cli(tmp_path: Path, words: list[str], config: Path, early: bool) -> tuple[int, str, str, list[str]]:
    """``vq-admin update WORDS`` (the full command line), with or without the early start."""
    wrap, log = fake_ssh(tmp_path)
    log.unlink(missing_ok=True)
    code = ("import sys\nimport vq_admin.ssh.early_start as f\n" + ("" if early else "f.start = lambda words: None\n") +
            "from vq_admin.entry import main\nsys.exit(main())\n")
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config),
               VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
    done = subprocess.run([sys.executable, "-c", code, "update", *words], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    return done.returncode, done.stdout, done.stderr, ssh_starts(log)


def comparable(stdout: str) -> dict:
    document = json.loads(stdout)
    return {k: document.get(k) for k in ("outcome", "exit_code", "errors", "lane", "host", "program")}


@pytest.mark.parametrize("case", ["writable ssh_config", "alias host", "local transport"])
def test_a_refusal_the_early_start_left_alone_is_what_the_full_path_says(tmp_path, case):
    words, how = UNUSUAL[case]
    config = unusual_config(tmp_path, how)
    with_early = cli(tmp_path, [*words, "--json"], config, early=True)
    without = cli(tmp_path, [*words, "--json"], config, early=False)
    assert (with_early[0], comparable(with_early[1]), with_early[2]) == (without[0], comparable(without[1]),
                                                                         without[2])
    if case != "local transport":  # refused before any ssh (77): a writable ssh_config's Match exec never runs
        assert with_early[0] == 77 and with_early[3] == [] and without[3] == [], with_early


def test_a_configuration_error_starts_nothing_early_and_is_what_the_full_path_says(tmp_path):
    # the early start reads the configuration as the full path does (vq_admin.config): any rule
    # it breaks, even in another host, starts nothing
    text = config_text(tmp_path) + '[hosts.other]\nfleet_role = "managed"\nmisspelt = 1\n'
    config = write_config(tmp_path / "admin.toml", text)
    with_early = cli(tmp_path, [*UPDATE, "--json"], config, early=True)
    without = cli(tmp_path, [*UPDATE, "--json"], config, early=False)
    assert with_early[0] == without[0] == 2, with_early
    assert (comparable(with_early[1]), with_early[2]) == (comparable(without[1]), without[2])
    assert with_early[3] == without[3] == []


@pytest.mark.real
def test_through_the_console_script_an_already_current_run_is_its_early_ssh_process(tmp_path, real_sshd):
    from support import AGENT, GitRepo, run_vq, site_example_host

    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("A")
    (tmp_path / "scratch").mkdir()
    host = site_example_host("cluster", root=tmp_path / "apps", repo=repo.path, scratch=tmp_path / "scratch",
                             transport="ssh", ssh="cluster")
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n' + host)
    first = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", "--json",
                   config=config, state=tmp_path / "state")
    assert first.exit_code == 0, first.stdout + first.stderr
    wrap, log = tmp_path / "wrap", tmp_path / "ssh.log"
    wrap.mkdir()
    (wrap / "ssh").write_text(f'#!/bin/sh\nprintf "%s\\n" "ssh $*" >> {log}\nexec /usr/bin/ssh "$@"\n')
    (wrap / "ssh").chmod(0o755)
    code = ("import sys\nsys.argv = ['vq', 'admin', 'update', *sys.argv[1:]]\n"
            "from vq_admin.entry import main\nsys.exit(main())\n")
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config),
               VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
    done = subprocess.run([sys.executable, "-c", code, "vibeqc", "cluster", "--expected-sha", sha, "--json"],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and json.loads(done.stdout)["outcome"] == "already-current", done.stdout + done.stderr
    starts = ssh_starts(log)
    assert len(starts) == 1 and "ControlMaster=yes" in starts[0], starts  # the early one, taken over: no second
    judged = [line for line in log.read_text().splitlines() if line.startswith("ssh -G ")]
    assert judged == [f"ssh -G -F {real_sshd.ssh_config} -- cluster"], judged  # once, early, for the whole run
    assert f" -- cluster {JUDGE_PYTHON} " in starts[0] and f" 1 {AGENT} session --probe " in starts[0], starts
    receipt = json.loads(done.stdout)
    assert receipt["lease"]["held"] is True and {s["name"]: s for s in receipt["steps"]}["pre-verify"]["status"] == "ok"
