"""Issue 15: cron's already-current ``update PROGRAM HOST --expected-sha SHA`` starts its one ssh
process before the command line is parsed (vq_admin.fastupdate), with the checks the full path
makes before its ssh starts; anything unusual starts nothing there, and the full path then
behaves exactly as it did.

The ssh here is a double (a script that logs its argv and what reached its stdin, and ends when
its stdin closes): these tests are about what the driver starts and when.  The same early start
over the real sshd is what every already-current run of tests/test_fast_paths.py,
tests/test_lease.py and tests/trust/ goes through (``vq_admin.entry.main``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import write_config
from vq_admin.fastupdate import parse_update

SHA = "a" * 40
UPDATE = ["vibeqc", "cluster", "--expected-sha", SHA]

#: All of vq-admin the early start may import before its ssh process starts.
EARLY_OWN = {"vq_admin", "vq_admin.fastupdate", "vq_admin.plainargs", "vq_admin.sshargv", "vq_admin.bounded",
             "vq_admin.agent",
             "vq_admin.agent.identifiers", "vq_admin.agent.paths", "vq_admin.agent.securepath",
             "vq_admin.agent.protocol",  # the protocol: the session verb, its probe words
             "vq_admin.spawned", "vq_admin.fastlookup", "vq_admin.launchers",  # posix_spawn; the note's reader
             "vq_admin.agent.spawn", "vq_admin.agent.verify_readback"}  # the spawn rules; the built-in SHA-256
#: ... and what it never imports there (the command line, the configuration's records, the transports;
#: typing is tomllib's own, in Python 3.11).
EARLY_NEVER = ("argparse", "dataclasses", "pathlib", "tempfile", "shutil", "inspect", "pluggy", "plumbum",
               "importlib.metadata", "vq_admin.cli", "vq_admin.config", "vq_admin.transport", "vq_admin.commands",
               "vq_admin.early_session", "vq_admin.output", "vq_admin.outcome")


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
    return [line for line in log.read_text().splitlines() if line.startswith("ssh ")] if log.exists() else []


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
from vq_admin import fastupdate
modules = {}
_real = None

def spy(*args, **kwargs):  # what is loaded when the ssh process starts
    modules.setdefault("at_ssh_start", sorted(set(sys.modules) - _before))
    modules.setdefault("how", "subprocess")
    return _real(*args, **kwargs)

_real_spawn = os.posix_spawnp

def spawn_spy(*args, **kwargs):  # the early start's own posix_spawn (vq_admin.spawned)
    modules.setdefault("at_ssh_start", sorted(set(sys.modules) - _before))
    modules["how"] = "posix_spawn"
    return _real_spawn(*args, **kwargs)

os.posix_spawnp = spawn_spy
import subprocess
_real, subprocess.Popen = subprocess.Popen, spy
fastupdate.start(sys.argv[1:])
subprocess.Popen, os.posix_spawnp = _real, _real_spawn
pending = fastupdate.PENDING
result = {"started": pending is not None, "modules": modules.get("at_ssh_start"), "how": modules.get("how")}
if pending is not None:
    result["argv"] = pending.argv
    # what the full path builds for the same host: the same ssh command line, the same control directory
    from vq_admin.config import load_config
    from vq_admin.agent import protocol
    from vq_admin.early_session import session_command
    from vq_admin.transport import Session
    config = load_config(None)
    host = config.hosts["cluster"]
    with Session(config.ssh_config) as session:
        transport = session.ssh(host.ssh)
        result["full_path_argv"] = session_command(transport, protocol.session(host.agent))
        result["same_dir"] = transport.control_dir == pending.control_dir
        result["dir"] = transport.control_dir
    result["pending_after_close"] = fastupdate.PENDING is not None
else:
    fastupdate.end_pending()
print(json.dumps(result))
"""


def probe(tmp_path: Path, words: list[str], config: Path | None) -> tuple[dict, list[str]]:
    wrap, log = fake_ssh(tmp_path)
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config or tmp_path / "absent"))
    done = subprocess.run([sys.executable, "-c", PROBE, *words], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), ssh_starts(log)


def test_the_early_start_is_the_full_paths_ssh_process_and_imports_only_its_own_modules(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    result, started = probe(tmp_path, UPDATE, config)
    assert result["started"], result
    loaded = set(result["modules"])
    assert not [m for m in loaded if m in EARLY_NEVER or m.split(".")[0] in EARLY_NEVER], sorted(loaded)
    assert {m for m in loaded if m.startswith("vq_admin")} <= EARLY_OWN, sorted(loaded)
    # exactly the ssh argv the full path would start (its connection master, the probe words on the line)
    assert result["argv"] == result["full_path_argv"], result
    assert "ControlMaster=yes" in result["argv"] and result["argv"][-1].startswith(
        "/opt/vq/bin/vq-admin-agent session --probe "), result
    assert result["same_dir"] and not Path(result["dir"]).exists()  # the Session took the directory, and removed it
    assert not result["pending_after_close"]  # the Session's close ended it
    assert len(started) == 1
    assert (tmp_path / "ssh.log.stdin").read_bytes() == b""  # nothing asked: its stdin closed unused


def test_the_console_script_starts_ssh_before_the_command_line_is_imported(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    wrap, log = fake_ssh(tmp_path)
    code = ("import json, os, sys\nfrom vq_admin import fastupdate\n_start = fastupdate.start\n"
            "def start(words):\n    _start(words)\n"
            "    print(json.dumps({'started': fastupdate.PENDING is not None, 'cli': 'vq_admin.cli' in sys.modules,\n"
            "                      'argparse': 'argparse' in sys.modules}), flush=True)\n"
            "    fastupdate.end_pending()\n    os._exit(0)\n"
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
    code = ("import sys\nimport vq_admin.fastupdate as f\n" + ("" if early else "f.start = lambda words: None\n") +
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


def test_a_configuration_error_found_after_the_early_start_ends_it_with_nothing_asked(tmp_path):
    # a rule the early start does not read (an unknown key in another host) is the full path's to
    # report; the ssh process it started is ended with its stdin closed: nothing was asked
    text = config_text(tmp_path) + '[hosts.other]\nfleet_role = "managed"\nmisspelt = 1\n'
    config = write_config(tmp_path / "admin.toml", text)
    with_early = cli(tmp_path, [*UPDATE, "--json"], config, early=True)
    assert (tmp_path / "ssh.log.stdin").read_bytes() == b""
    without = cli(tmp_path, [*UPDATE, "--json"], config, early=False)
    assert with_early[0] == without[0] == 2, with_early
    assert (comparable(with_early[1]), with_early[2]) == (comparable(without[1]), without[2])
    assert len(with_early[3]) == 1 and without[3] == []
    control = [w for w in with_early[3][0].split() if w.startswith("ControlPath=")]
    assert control and not Path(control[0][len("ControlPath="):]).parent.exists()  # its control directory: removed


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
    assert len(starts) == 1 and "ControlMaster=yes" in starts[0], starts  # the early one, adopted: no second
    assert f" -- cluster {AGENT} session --probe " in starts[0], starts
    receipt = json.loads(done.stdout)
    assert receipt["lease"]["held"] is True and {s["name"]: s for s in receipt["steps"]}["pre-verify"]["status"] == "ok"


# -- the note: a configuration read once starts the next runs' ssh before re, tomllib or subprocess --

NOTE_PROBE = r"""
import os, sys
_before = set(sys.modules)
from vq_admin import fastupdate
seen = {}
_real = os.posix_spawnp

def spy(*args, **kwargs):
    seen.setdefault("modules", sorted(set(sys.modules) - _before))
    return _real(*args, **kwargs)

os.posix_spawnp = spy
fastupdate.start(sys.argv[1:])
os.posix_spawnp = _real
pending = fastupdate.PENDING
argv = None if pending is None else [w.replace(pending.control_dir, "CONTROL") for w in pending.argv]
fastupdate.end_pending()
import json
print(json.dumps({"started": pending is not None, "modules": seen.get("modules"), "argv": argv}))
"""

#: What the early start never loads when a note answers: the configuration's parser, the pattern
#: rules, the process runner and what they pull in.
NOTED_NEVER = {"re", "tomllib", "subprocess", "json", "enum", "locale", "typing", "shlex", "selectors",
               "threading", "vq_admin.bounded", "vq_admin.agent.identifiers", "vq_admin.process", "vq_admin.statefs"}


def note_probe(tmp_path: Path, config: Path, words: list[str] = UPDATE) -> dict:
    wrap, _log = fake_ssh(tmp_path)
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", VQ_ADMIN_CONFIG=str(config),
               VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
    done = subprocess.run([sys.executable, "-c", NOTE_PROBE, *words], capture_output=True, text=True, timeout=120,
                          env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def note_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "early-start" / "cluster+vibeqc.json"


def test_a_noted_configuration_starts_the_same_ssh_before_re_tomllib_or_subprocess_load(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    first = note_probe(tmp_path, config)
    assert first["started"] and "tomllib" in first["modules"], first  # read from the configuration
    note = note_path(tmp_path)
    assert (note.stat().st_mode & 0o777) == 0o600 and (note.parent.stat().st_mode & 0o777) == 0o700
    recorded = json.loads(note.read_text())
    assert recorded["destination"] == "cluster" and recorded["agent"] == "/opt/vq/bin/vq-admin-agent", recorded
    assert recorded["config"] == str(config) and recorded["ssh_config"] == str(tmp_path / "ssh_config"), recorded
    assert recorded["config_sha256"] == hashlib.sha256(config.read_bytes()).hexdigest(), recorded
    second = note_probe(tmp_path, config)
    assert second["started"], second
    assert not NOTED_NEVER & set(second["modules"]), sorted(NOTED_NEVER & set(second["modules"]))
    assert second["argv"] == first["argv"]  # the same ssh command line, the same words


def test_a_changed_configuration_is_read_again_and_noted_again(tmp_path):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    note_probe(tmp_path, config)
    before = json.loads(note_path(tmp_path).read_text())
    text = config.read_text().replace('agent = "/opt/vq/bin/vq-admin-agent"', 'agent = "/opt/vq2/bin/vq-admin-agent"')
    config.write_text(text)  # same size, same inode, perhaps the same timestamp tick: the bytes tell
    again = note_probe(tmp_path, config)
    assert "tomllib" in again["modules"] and again["argv"][-1].startswith("/opt/vq2/bin/vq-admin-agent session"), again
    after = json.loads(note_path(tmp_path).read_text())
    assert after["config_sha256"] != before["config_sha256"] and after["agent"] == "/opt/vq2/bin/vq-admin-agent"
    assert note_probe(tmp_path, config)["argv"] == again["argv"]


@pytest.mark.parametrize("spoil", ["loose directory", "loose file", "another host", "not an agent word",
                                   "an option as destination", "malformed", "another version"])
def test_a_note_that_cannot_be_trusted_is_no_note(tmp_path, spoil):
    config = write_config(tmp_path / "admin.toml", config_text(tmp_path))
    first = note_probe(tmp_path, config)
    note = note_path(tmp_path)
    recorded = json.loads(note.read_text())
    if spoil == "loose directory":
        note.parent.chmod(0o777)
    elif spoil == "loose file":
        note.chmod(0o666)
    elif spoil == "another host":
        recorded["host"] = "other"
    elif spoil == "not an agent word":
        recorded["agent"] = "/opt/vq/bin/vq-admin-agent;touch /tmp/x"
    elif spoil == "an option as destination":
        recorded["destination"] = "-oProxyCommand=x"
    elif spoil == "another version":
        recorded["version"] = "0.9"
    else:
        note.write_text("{" + note.read_text())
    if spoil in ("another host", "not an agent word", "an option as destination", "another version"):
        note.write_text(json.dumps(recorded))
    again = note_probe(tmp_path, config)
    assert again["started"] and "tomllib" in again["modules"], again  # the configuration decides
    assert again["argv"] == first["argv"]


@pytest.mark.parametrize("value", ["a" * 40, "A" * 64, "0123456789abcdefABCDEF" + "0" * 18, "a" * 39, "g" * 40,
                                   "a" * 41, "", "a" * 40 + "\n", "\u0661" * 40])
def test_the_early_rules_without_re_are_the_patterns(value):
    from vq_admin.agent.identifiers import DESTINATION_RE, FULL_SHA_RE
    from vq_admin.fastupdate import is_destination, is_full_sha

    assert is_full_sha(value) == bool(FULL_SHA_RE.match(value))
    assert is_destination(value) == bool(DESTINATION_RE.match(value))
