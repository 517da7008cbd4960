"""Issue 15: the two paths that run most stay near their floor, and cannot creep back.

* An already-current ``vq admin update`` over the real sshd costs one ssh
  connection and one ssh process (no ``-O exit``), two git processes and, on
  the login host, one agent process (``session``) that runs the provider's
  verify once (counted by PATH
  wrappers that log every exec, and by sshd's own log of accepted sessions).
* ``vq admin launcher`` (the console scripts' hand-parsed entry) answers its
  plain success importing nothing a bare interpreter has not, but its own
  few modules (no ``re``, ``json`` or ``enum``); its other cases, a bare
  ``resolve_launcher`` and the agent's ``verify-readback`` import a pinned
  set of modules: nothing beyond what ``import json`` brings, plus their own (the agent's:
  no verb table).
* The agent's ``session`` (an already-current run's one agent start)
  imports exactly its pinned own modules and no verb table.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import AGENT, SITE_EXAMPLE, GitRepo, run_vq, site_example_host, write_config
from vq_admin.core import protocol
from vq_admin.launcher import registry
from vq_admin.state.records import Verified

SHA = "a" * 40
#: What the launcher path may import of vq-admin itself.
#: The registry reader's trust checks (section 10): the private state tree, bounded parsing and the
#: secure-path rule, all standard library only.
TRUST_OWN = {"vq_admin.state", "vq_admin.state.tree", "vq_admin.core", "vq_admin.core.bounds",
             "vq_admin.core.securepath", "vq_admin.core.names",
             # the one home of identifiers, default paths and exit statuses
             "vq_admin.core.identifiers", "vq_admin.core.default_paths", "vq_admin.core.exits",
             # the one atomic write and the one escaping rule (standard library only, no re)
             "vq_admin.core.atomic", "vq_admin.core.escape"}
#: Every lookup records its use and checks a launcher visible here (CONTRACT 12, 14).
RECORD_OWN = {"vq_admin.launcher.uses", "vq_admin.launcher.present", "vq_admin.core.stamps"}
#: The C modules of the standard library the use record needs (its lock and its user name).
RECORD_C = {"fcntl", "pwd"}
#: The immutable records a full lookup returns (a registry entry, a binding): standard library only.
RECORDS_OWN = {"vq_admin.core.plainrecord"}
LAUNCHER_OWN = {"vq_admin", "vq_admin.entry", "vq_admin.core.plainargs", "vq_admin.commands",
                "vq_admin.commands.launcher", "vq_admin.bindings", "vq_admin.launcher", "vq_admin.launcher.registry",
                "vq_admin.launcher.immutable", "vq_admin.report", "vq_admin.report.outcome",
                "vq_admin.launcher.plain_lookup"} | TRUST_OWN | RECORD_OWN | RECORDS_OWN
BINDINGS_OWN = {"vq_admin", "vq_admin.bindings", "vq_admin.launcher", "vq_admin.launcher.registry",
                "vq_admin.launcher.immutable", "vq_admin.report", "vq_admin.report.outcome",
                "vq_admin.launcher.plain_lookup"} | TRUST_OWN | RECORD_OWN | RECORDS_OWN
#: The launcher's plain success (vq_admin.launcher.plain_lookup): these and nothing a bare interpreter has not
#: already imported (no re, json, enum), but the ``__future__`` its modules name.
PLAIN_OWN = {"vq_admin", "vq_admin.entry", "vq_admin.core", "vq_admin.core.plainargs", "vq_admin.launcher",
             "vq_admin.launcher.plain_lookup", "vq_admin.launcher.immutable", "vq_admin.core.names",
             "vq_admin.core.default_paths", "vq_admin.core.securepath", "vq_admin.core.escape"} | RECORD_OWN
AGENT_OWN = {"vq_admin", "vq_admin.agent", "vq_admin.agent.entry", "vq_admin.agent.verify_readback",
             "vq_admin.core", "vq_admin.core.protocol", "vq_admin.agent.spawn",
             "vq_admin.core.securepath",  # the launcher's path is checked before it is hashed
             "vq_admin.core.filehash",  # ... by the one SHA-256-of-a-file rule
             "vq_admin.core.exits", "vq_admin.core.bounds"}  # the one table of exit statuses, the one JSON reader
#: The agent's own modules its ``session`` (an already-current run's one agent start) imports.
SESSION_OWN = {"vq_admin", "vq_admin.agent", "vq_admin.agent.entry", "vq_admin.core", "vq_admin.core.protocol",
               "vq_admin.agent.session", "vq_admin.agent.lease", "vq_admin.core.default_paths", "vq_admin.core.procs",
               "vq_admin.core.securepath", "vq_admin.core.names", "vq_admin.agent.checkpaths",
               "vq_admin.agent.verify_readback", "vq_admin.agent.spawn", "vq_admin.core.exits", "vq_admin.core.bounds",
               "vq_admin.core.atomic", "vq_admin.core.filehash"}
NEVER = ("argparse", "typing", "shutil", "dataclasses", "pathlib", "tomllib", "importlib.metadata", "pluggy",
         "plumbum", "filelock", "vq_admin_hookspecs", "vq_admin.config", "vq_admin.cli", "tarfile", "email",
         "vq_admin.core.failpoints")


def imported_by(code: str, *, env: dict[str, str] | None = None) -> tuple[set[str], set[str]]:
    """(modules *code* imported, modules ``import json`` imports) in one fresh interpreter each."""
    probe = ("import sys\n_before = set(sys.modules)\n" + code +
             "\nsys.stderr.write('\\nMODULES ' + repr(sorted(set(sys.modules) - _before)) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})), stdin=subprocess.DEVNULL)
    line = [ln for ln in done.stderr.splitlines() if ln.startswith("MODULES ")]
    assert line, done.stdout + done.stderr
    base = subprocess.run([sys.executable, "-c", "import sys\n_b = set(sys.modules)\nimport json\n"
                           "print(repr(sorted(set(sys.modules) - _b)))"], capture_output=True, text=True, timeout=120)
    return set(ast.literal_eval(line[-1][len("MODULES "):])), set(ast.literal_eval(base.stdout))


def registered_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    registry.record_verified(state, "cluster", "vibeqc", Verified(**{
        "sha": SHA, "tag": None, "launcher": f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python",
        "launcher_sha256": "e" * 64, "receipt": "r-1", "at": "2026-11-30T00:00:00Z"}))
    return state


def check_import_set(found: set[str], json_set: set[str], own: set[str]) -> None:
    assert not [m for m in found if m in NEVER or m.split(".")[0] in NEVER], sorted(found)
    extra = {m for m in found - json_set if not m.startswith("vq_admin")} - {"__future__"} - RECORD_C
    assert not extra, f"imports beyond json's: {sorted(extra)}"
    assert {m for m in found if m.startswith("vq_admin")} <= own, sorted(found)


@pytest.mark.parametrize("words", [["--expected-sha", SHA], []], ids=["expected-sha", "latest"])
def test_the_launcher_entry_imports_only_its_own_modules(tmp_path, words):
    state = registered_state(tmp_path)
    code = ("sys.argv = ['vq', 'admin', 'launcher', 'vibeqc', 'cluster', *%r]\n"
            "from vq_admin.entry import main\ncode = main()\nassert code == 0, code\n" % (words,))
    found, json_set = imported_by(code, env={"VQ_ADMIN_STATE_DIR": str(state),
                                             "VQ_ADMIN_CONFIG": str(tmp_path / "absent.toml")})
    check_import_set(found, json_set, PLAIN_OWN)
    assert found - {"__future__"} - RECORD_C == PLAIN_OWN  # nothing beyond a bare interpreter's: no re, json, enum


@pytest.mark.parametrize("words", [["--expected-sha", "b" * 40], ["--json"], ["--path", "/x"]],
                         ids=["refused", "json", "path"])
def test_everything_but_the_plain_success_runs_the_full_verb(tmp_path, words):
    state = registered_state(tmp_path)
    code = ("sys.argv = ['vq', 'admin', 'launcher', 'vibeqc', 'cluster', *%r]\n"
            "from vq_admin.entry import main\ncode = main()\nassert code in (0, 77), code\n" % (words,))
    found, json_set = imported_by(code, env={"VQ_ADMIN_STATE_DIR": str(state),
                                             "VQ_ADMIN_CONFIG": str(tmp_path / "absent.toml")})
    # vq_admin.report.output: the refusal; vq_admin.report.envelope: the JSON document
    check_import_set(found, json_set, LAUNCHER_OWN | {"vq_admin.report.output", "vq_admin.report.envelope"})
    assert "vq_admin.commands.launcher" in found  # the verb ran, through the hand-parsed entry


def test_resolve_launcher_imports_no_more_than_the_entry(tmp_path):
    state = registered_state(tmp_path)
    code = ("from vq_admin.bindings import resolve_launcher\n"
            "b = resolve_launcher('vibeqc', 'cluster', expected_sha=%r, state_dir=%r)\n"
            "assert b.sha == %r\n" % (SHA, str(state), SHA))
    found, json_set = imported_by(code)
    check_import_set(found, json_set, BINDINGS_OWN)


@pytest.mark.parametrize("with_receipt", [True, False], ids=["receipt", "no-receipt"])
def test_the_agent_verify_readback_imports_no_verb_table(tmp_path, with_receipt):
    launcher = tmp_path / "python"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = '{"active_path": "%s"}' % launcher  # a receipt naming a small launcher, as a real verify prints
    verify = ['printf', '%s', receipt] if with_receipt else ['true']
    code = ("from vq_admin.agent.entry import main\n"
            "code = main(['verify-readback', '--', *%r])\nassert code == 0, code\n" % (verify,))
    found, json_set = imported_by(code)
    assert not [m for m in found if m.split(".")[0] in NEVER or m in NEVER], sorted(found)
    assert "vq_admin.agent.cli" not in found and "argparse" not in found
    assert {m for m in found if m.startswith("vq_admin")} <= AGENT_OWN, sorted(found)


def bare_modules() -> set[str]:
    """The modules a bare start of this interpreter has loaded (``python -c pass``)."""
    done = subprocess.run([sys.executable, "-c", "import sys; print(repr(sorted(sys.modules)))"], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    return set(ast.literal_eval(done.stdout))


def test_the_agent_session_imports_exactly_its_pinned_set(tmp_path):
    """An already-current run's one agent start: the probe on the command line, the lease, the command-file
    check and the verify with its launcher read-back, on one request line."""
    import json

    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    launcher = tmp_path / "python"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps({"active_path": str(launcher)}))
    request = {"protocol": 1, "shell_probe": {"argv": True, "expected": "a|b c|"},
               "lease": {"lane": "runtime", "host": "cluster", "program": "vibeqc",
                         "holder": {"driver_host": "d", "user": "u", "pid": 1, "since": "s", "run_id": "r"}},
               "check_paths": ["/bin/cat", str(receipt)],
               "verify": {"argv": ["cat", str(receipt)], "env": {"X": "1"}, "timeout": 60}}
    probe = ("import sys\n_before = set(sys.modules)\nfrom vq_admin.agent.entry import main\n"
             "code = main(['session', '--probe', 'a', 'b c'])\nassert code == 0, code\n"
             "sys.stderr.write('\\nMODULES ' + repr(sorted(set(sys.modules) - _before)) + '\\n')\n")
    done = subprocess.run([sys.executable, "-c", probe], input=json.dumps(request).encode() + b"\n",
                          capture_output=True, timeout=120)
    line = [ln for ln in done.stderr.decode().splitlines() if ln.startswith("MODULES ")]
    assert line, done.stdout + done.stderr
    first, rest = done.stdout.splitlines()
    answer = {**json.loads(first), **json.loads(rest)}
    assert answer["shell"]["posix"] is True and answer["lease"]["held"] is True
    assert answer["check_paths"]["refused"] == [] and answer["verify"]["readback_exit"] == 0
    found = set(ast.literal_eval(line[-1][len("MODULES "):]))
    assert not [m for m in found if m.split(".")[0] in NEVER or m in NEVER], sorted(found)
    assert {m for m in found if m.startswith("vq_admin")} == SESSION_OWN - bare_modules(), sorted(found)


def test_hand_parsed_launcher_words_fall_back_to_the_full_parser():
    from vq_admin.entry import parse_launcher

    parsed = parse_launcher(["vibeqc", "--json", "cluster", "--expected-sha", SHA, "--path=-p", "--check-on-host"])
    assert (parsed.program, parsed.host, parsed.expected_sha, parsed.path, parsed.json, parsed.check_on_host) == \
        ("vibeqc", "cluster", SHA, "-p", True, True)
    for words in (["vibeqc"], ["a", "b", "c"], ["a", "b", "--help"], ["a", "b", "--expected", SHA],
                  ["a", "b", "--path", "-x"], ["a", "b", "--json=1"], ["a", "b", "--pin"], ["-a", "b"],
                  ["a", "b", "--path=--"], ["a", "b", "--path="], ["a", "b", "--pin", SHA, "--pin", SHA]):
        assert parse_launcher(words) is None, words


def wrapper(path: Path, real: str, log: Path) -> str:
    path.write_text(f"#!{sys.executable}\nimport os, sys\n"  # Python: the agent's first word must be (agentjudge)
                    f"with open({str(log)!r}, 'a') as fh:\n    fh.write(' '.join([os.path.basename(sys.argv[0])]"
                    f" + sys.argv[1:]) + '\\n')\nos.execv({real!r}, [{real!r}] + sys.argv[1:])\n")
    path.chmod(0o755)
    return str(path)


def accepted_sessions(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines() if "Accepted publickey" in line)


@pytest.mark.real
def test_an_already_current_run_is_one_ssh_connection(tmp_path, real_sshd):
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("A")
    wrap, log = tmp_path / "wrap", tmp_path / "execs.log"
    wrap.mkdir()
    wrapper(wrap / "ssh", "/usr/bin/ssh", log)
    wrapper(wrap / "git", "/usr/bin/git", log)
    agent = wrapper(wrap / "vq-admin-agent", AGENT, log)
    site = wrapper(wrap / "vq-site-example", SITE_EXAMPLE, log)
    (tmp_path / "scratch").mkdir()
    host = site_example_host("cluster", root=tmp_path / "apps", repo=repo.path, scratch=tmp_path / "scratch",
                             transport="ssh", ssh="cluster")
    host = host.replace(f'agent = "{AGENT}"', f'agent = "{agent}"').replace(f'command = "{SITE_EXAMPLE}"',
                                                                            f'command = "{site}"')
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n' + host)
    env = {"PATH": f"{wrap}:{os.environ['PATH']}"}
    first = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", "--json",
                   config=config, state=tmp_path / "state", env=env)
    assert first.exit_code == 0 and first.json()["outcome"] == "ok", first.stdout + first.stderr
    log.unlink()
    sessions = accepted_sessions(real_sshd.log)

    again = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", config=config,
                   state=tmp_path / "state", env=env)
    assert again.exit_code == 0 and again.json()["outcome"] == "already-current", again.stdout + again.stderr
    execs = log.read_text().splitlines()
    by_program: dict[str, list[str]] = {}
    for line in execs:
        by_program.setdefault(line.split(" ", 1)[0], []).append(line)
    # One ssh client process (the run's connection master, ControlMaster=yes without ControlPersist,
    # so it ends with its own session: no "-O exit"), one sshd connection and one agent start on the
    # login host ("session": the login-shell probe of section 10, the host-side lease of section 9,
    # the command-file check of section 10 and the verify with the launcher read-back), whose
    # command line is only words every shell reads literally.
    ssh = [line for line in by_program.get("ssh", []) if " -G " not in line]
    assert len(ssh) == 1, execs
    # and one ssh -G: what ssh will load for the destination, judged before it connects (no connection)
    assert len(by_program["ssh"]) == 2 and " -G " in by_program["ssh"][0], execs
    assert "ControlMaster=yes" in ssh[0] and "ControlPersist=no" in ssh[0] and " -O " not in ssh[0], ssh
    # the login-shell probe rides on the session's own command line: no second shell on the host
    assert f" 1 {agent} session --probe " in ssh[0], ssh  # judged, then run isolated (core/agentjudge)
    assert len(by_program.get("git", [])) == 2, execs  # cat-file --batch and tag --points-at
    verbs = [line.split()[1] for line in by_program.get("vq-admin-agent", [])]
    assert verbs == ["session"], execs
    assert len(by_program.get("vq-site-example", [])) == 1 and " verify " in by_program["vq-site-example"][0]
    assert accepted_sessions(real_sshd.log) - sessions == 1  # sshd's own count: one connection

    receipt = again.json()
    steps = {s["name"]: s for s in receipt["steps"]}
    assert protocol.agent_words(steps["pre-verify"]["argv"], "verify-readback") == [agent]  # what the session ran
    assert steps["pre-verify"]["status"] == "ok" and "vq-admin-agent session" in steps["pre-verify"]["purpose"]
    assert steps["pre-verify-readback"]["status"] == "ok" and steps["pre-verify-readback"]["where"] == "cluster"
    assert steps["check-commands"]["status"] == "ok" and steps["check-commands"]["where"] == "cluster"
    assert receipt["lease"]["held"] is True and receipt["lease"]["argv"] == protocol.session([agent])
    assert not list(Path(receipt["lease"]["lock"]).parent.glob("*.holder"))  # released: the record is gone


def processes_naming(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.mark.real
def test_a_run_refused_before_its_request_leaves_nothing_on_the_host_and_no_process(tmp_path, real_sshd):
    # The first call's ssh process starts as soon as the host is known; a run that ends before
    # sending the request (here: the commit is not in the source repository) closes its stdin.
    repo = GitRepo(tmp_path / "src")
    repo.commit("A")
    wrap, log = tmp_path / "wrap", tmp_path / "execs.log"
    wrap.mkdir()
    agent = wrapper(wrap / "vq-admin-agent", AGENT, log)
    (tmp_path / "scratch").mkdir()
    host = site_example_host("cluster", root=tmp_path / "apps", repo=repo.path, scratch=tmp_path / "scratch",
                             transport="ssh", ssh="cluster").replace(f'agent = "{AGENT}"', f'agent = "{agent}"')
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n' + host)
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", "f" * 40, "--json", config=config,
                  state=tmp_path / "state")
    assert done.exit_code != 0 and done.json()["outcome"] != "ok", done.stdout + done.stderr
    assert not processes_naming(str(real_sshd.ssh_config)) and not processes_naming(agent)  # none left behind
    assert not list((tmp_path / "scratch").iterdir())  # no lease directory, no holder record: nothing asked
    assert not (tmp_path / "apps").exists()
    # the session started early did reach the host (ssh runs it even after its stdin closed): "session" only
    starts = [line.split()[1] for line in log.read_text().splitlines() if line.startswith("vq-admin-agent")]
    assert starts == ["session"], log.read_text()


# -- the agent's verify-readback, and a login host whose agent predates it -------------


def agent_answer(*argv: str) -> dict:
    import json

    done = subprocess.run([AGENT, "verify-readback", "--", *argv], capture_output=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_verify_readback_hashes_the_launcher_the_receipt_names(tmp_path):
    import hashlib
    import json

    launcher = tmp_path / f"vibeqc-{SHA}"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = json.dumps({"active_path": str(launcher), "note": "caf\u00e9"})
    answer = agent_answer("sh", "-c", f"printf '%s\\n' '{receipt}'; printf 'warn\\377\\n' >&2; exit 3")
    assert answer["verify"]["exit_code"] == 3 and json.loads(answer["verify"]["stdout"])["active_path"] == str(launcher)
    assert answer["verify"]["stderr"].encode("utf-8", "surrogateescape") == b"warn\xff\n"  # bytes survive
    assert answer["readback"]["sha256"] == hashlib.sha256(b"#!/bin/sh\n").hexdigest()
    assert answer["readback"]["path"] == str(launcher) and answer["readback_exit"] == 0


def test_verify_readback_reads_nothing_back_without_an_absolute_active_path(tmp_path):
    for out in ("not json", '{"active_path": "relative/python"}', "[1, 2]"):
        answer = agent_answer("printf", "%s", out)
        assert answer["readback"] is None and answer["verify"]["stdout"] == out
    missing = agent_answer(str(tmp_path / "no-such-verify"))
    assert missing["verify"]["exit_code"] == 127 and missing["readback"] is None
    gone = agent_answer("printf", '{"active_path": "%s"}' % (tmp_path / "gone"))
    assert gone["readback"]["exists"] is False and gone["readback_exit"] == 1
