"""The vq.admin Ansible collection (ansible/): built with ``ansible-galaxy collection build`` and
installed, each module rendered by ``ansible-doc``, ``ansible-test sanity`` (the tests that run
without downloads, and validate-modules), and real ``ansible-playbook`` runs against three login
hosts, each an alias of one real loopback sshd (as in the fleet tests).

The playbook scenarios share one world and run in order in one test: a check-mode run on fresh
hosts, a first host whose build fails (the play stops, the others untouched), a ``serial: 1`` /
``max_fail_percentage: 0`` rollout and its rerun (``changed=0``), a check-mode run after one host
was moved behind the play's back, and a held lease (``locked``, retried with ``until``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_world import Fleet, finish, wait_for
from realhosts import SshdServer, remote_path
from support import SITE_EXAMPLE, run_vq, tree_digest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODULES = ("runtime", "helper", "facts")
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
#: ansible-test sanity tests that need nothing installed beyond ansible-core (``--local``).
OFFLINE_SANITY = ("action-plugin-docs", "compile", "empty-init", "ignores", "line-endings", "no-assert",
                  "no-get-exception", "no-illegal-filenames", "no-smart-quotes", "replace-urlopen", "shebang",
                  "symlinks", "use-argspec-type-path", "use-compat-six")
#: ansible-test bootstraps pip in its venvs with a get-pip.py it downloads from a host that is not a
#: package registry (unreachable here); this stand-in takes pip from the venv's own ensurepip, then
#: installs ansible-test's pinned requirements from the package index as usual.
GET_PIP = '''import subprocess, sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install"]
                         + [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]))
'''
FAILSWITCH = """#!/bin/sh
# failswitch FLAG WORDS...: fail the build while FLAG exists, else run WORDS.
flag="$1"; shift
if [ -e "$flag" ]; then echo "failswitch: the build fails ($flag exists)" >&2; exit 1; fi
exec "$@"
"""
PLAYBOOK = """\
- hosts: login_hosts
  gather_facts: false
  serial: 1
  max_fail_percentage: 0
  tasks:
    - name: deploy vibeqc
      vq.admin.runtime:
        program: vibeqc
        expected_sha: "{{ sha }}"
        config: "{{ vq_config }}"
        state_dir: "{{ vq_state }}"
        wait_lock: "{{ wait_lock | default(omit) }}"
      delegate_to: localhost
      register: deployed
      until: deployed.outcome | default('') != 'locked'
      retries: "{{ lock_retries | default(0) }}"
      delay: 1
"""


def run(argv: list[str | Path], env: dict[str, str] | None = None, cwd: Path | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert not check or done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collection built from ansible/ and installed: the ``collections`` directory holding it."""
    out = tmp_path_factory.mktemp("collection")
    env = ansible_env(out / "collections", out / "home")
    run([BIN / "ansible-galaxy", "collection", "build", ROOT / "ansible", "--output-path", out], env)
    run([BIN / "ansible-galaxy", "collection", "install", out / "vq-admin-1.0.0.tar.gz", "-p", out / "collections"],
        env)
    return out / "collections"


def ansible_env(collections: Path, home: Path) -> dict[str, str]:
    home.mkdir(exist_ok=True)
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", ANSIBLE_HOME=str(home),
                ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_NOCOLOR="1",
                ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_STDOUT_CALLBACK="default")


def test_each_module_renders_with_ansible_doc(collections: Path, tmp_path: Path) -> None:
    env = ansible_env(collections, tmp_path / "home")
    names = [f"vq.admin.{module}" for module in MODULES]
    pages = re.split(r"^> MODULE ", run([BIN / "ansible-doc", *names], env).stdout, flags=re.M)[1:]
    assert [page.split()[0] for page in pages] == names
    for page in pages:
        for heading in ("OPTIONS", "EXAMPLES", "RETURN VALUES", "config", "state_dir", "host", "delegate_to"):
            assert heading in page, f"{heading} not rendered\n{page}"
    docs = json.loads(run([BIN / "ansible-doc", "--json", *names], env).stdout)
    assert all(docs[name]["doc"]["options"]["vq"]["default"] == "vq" for name in names)


def test_a_missing_or_old_vq_fails_in_one_line(collections: Path, tmp_path: Path) -> None:
    env = ansible_env(collections, tmp_path / "home")
    old = tmp_path / "old-vq"
    old.write_text("#!/bin/sh\necho \"vq admin: usage: argument verb: invalid choice: 'verify'\" >&2\nexit 2\n")
    old.chmod(0o755)
    for vq, expected in (("/no/such/vq", "vq is not installed on the driver (/no/such/vq not found or not "
                          "executable): install vq-admin there, or give its path as vq"),
                         (str(old), f"{old} is too old for this collection or is not vq-admin: 'vq admin verify "
                          "--json' printed no vq-admin JSON document (exit 2: vq admin: usage: argument verb: "
                          "invalid choice: 'verify')")):
        done = run([BIN / "ansible", "localhost", "--check", "-m", "vq.admin.runtime", "-a",
                    f"program=vibeqc host=alpha expected_sha={'a' * 40} vq={vq}"], env, check=False)
        assert done.returncode == 2, done.stdout + done.stderr
        assert json.loads(done.stdout.split("FAILED! => ", 1)[1])["msg"] == expected


@pytest.mark.parametrize("host", ["--all", "-oProxyCommand=touch /tmp/x", "a b"])
def test_an_option_shaped_host_name_fails_the_module_before_vq_runs(collections: Path, tmp_path: Path,
                                                                      host: str) -> None:
    """An inventory host named ``--all`` would have made the runtime module's call a fleet rollout."""
    env = ansible_env(collections, tmp_path / "home")
    marker = tmp_path / "ran"
    spy = tmp_path / "vq"
    spy.write_text(f"#!/bin/sh\ntouch {marker}\nexit 2\n")
    spy.chmod(0o755)
    for module, args in (("runtime", f"program=vibeqc expected_sha={'a' * 40}"), ("helper", ""), ("facts", "")):
        done = run([BIN / "ansible", "localhost", "-m", f"vq.admin.{module}", "-a",
                    json.dumps(dict(item.split("=", 1) for item in args.split()) | {"host": host, "vq": str(spy)})],
                   env, check=False)
        assert done.returncode == 2, done.stdout + done.stderr
        msg = json.loads(done.stdout.split("FAILED! => ", 1)[1])["msg"]
        assert msg == f"host {host!r} is not a name ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}}); nothing was run", msg
        assert not marker.exists()


def test_the_collections_name_rule_is_vq_admins() -> None:
    from vq_admin.core.identifiers import NAME_RULE

    text = (ROOT / "ansible" / "plugins" / "module_utils" / "vq_admin.py").read_text()
    assert f'NAME_RULE = "{NAME_RULE}"' in text


def test_ansible_test_sanity(collections: Path) -> None:
    """The sanity tests that need no downloads, then validate-modules (documentation against the argument
    specs), whose venv is cached in .venv between runs."""
    where = collections / "ansible_collections" / "vq" / "admin"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    tests = [word for name in OFFLINE_SANITY for word in ("--test", name)]
    run([BIN / "ansible-test", "sanity", "--local", "--python", PYTHON, *tests], env, cwd=where)
    home = BIN.parent / "ansible-test-home"
    get_pip = home / ".ansible" / "test" / "cache" / "get_pip_24_2.py"
    get_pip.parent.mkdir(parents=True, exist_ok=True)
    get_pip.write_text(GET_PIP)
    run([BIN / "ansible-test", "sanity", "--python", PYTHON, "--test", "validate-modules"], dict(env, HOME=str(home)),
        cwd=where)


# -- ansible-playbook against the loopback sshd ----------------------------------------------------------


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    server = SshdServer(tmp_path_factory.mktemp("ansible-sshd"), env={"PATH": remote_path()},
                        aliases=("login-a", "login-b", "login-c"), separate_accounts=True)
    server.start()
    yield server
    server.stop()


def recap(output: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP: host -> {ok, changed, failed, ...}."""
    tail = output.split("PLAY RECAP", 1)[1]
    return {m[1]: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[2])}
            for m in re.finditer(r"^(\S+)\s+:\s+(.*)$", tail, re.M)}


def changed(output: str) -> dict[str, int]:
    return {host: counts["changed"] for host, counts in recap(output).items()}


@pytest.mark.real
def test_playbooks_roll_out_stop_check_and_retry_a_lock(tmp_path: Path, sshd, collections: Path) -> None:
    switch = tmp_path / "failswitch.sh"
    switch.write_text(FAILSWITCH)
    switch.chmod(0o755)
    flag = tmp_path / "fail-alpha"
    alpha_root = tmp_path / "hosts" / "alpha" / "apps"
    f = Fleet(tmp_path, str(sshd.ssh_config), {
        "alpha": {"ssh": "login-a", "update": f"{switch} {flag} {SITE_EXAMPLE} install --root {alpha_root}"},
        "beta": {"ssh": "login-b", "gated": True},
        "gamma": {"ssh": "login-c"},
    }, sshd=sshd)
    f.open_gate()
    state = tmp_path / "state"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("login_hosts:\n  hosts:\n    alpha:\n    beta:\n    gamma:\n  vars:\n"
                         "    ansible_python_interpreter: '{{ ansible_playbook_python }}'\n")
    playbook = tmp_path / "rollout.yml"
    playbook.write_text(PLAYBOOK)
    env = ansible_env(collections, tmp_path / "home")

    def play(sha: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return run([BIN / "ansible-playbook", "-i", inventory, playbook, "-e", f"sha={sha}", "-e",
                    f"vq_config={f.config}", "-e", f"vq_state={state}", *extra], env, check=False)

    def hosts_digest() -> tuple[dict[str, str], dict[str, str]]:
        # check mode's verify reads the hosts' record like every run that reaches a host (CONTRACT 12): the
        # driver's view of it (record/) may grow; nothing else may change, on the driver or the hosts
        own = {k: v for k, v in tree_digest(state).items() if not k.startswith("record/")}
        return own, tree_digest(tmp_path / "hosts")

    # check mode on fresh hosts: every host would change, nothing changes anywhere
    before = hosts_digest()
    done = play(f.a, "--check")
    assert done.returncode == 0 and changed(done.stdout) == {"alpha": 1, "beta": 1, "gamma": 1}, done.stdout
    assert hosts_digest() == before
    # nothing ran in check mode, so there is no outcome (never "ok"); a missing scratch_root fails the task as
    # the run would, naming the fix, and the play stops there
    module = [BIN / "ansible", "alpha", "-i", inventory, "-c", "local", "--check", "-m", "vq.admin.runtime", "-a",
              f"program={f.program} expected_sha={f.a} config={f.config} state_dir={state}"]
    done = run(module, env)
    result = json.loads(done.stdout.split("alpha | CHANGED => ", 1)[1])
    assert (result["outcome"], result["exit_code"], result["verify"]["state"]) == (None, None, "drifted"), result
    scratch = f.scratch("alpha")
    scratch.rename(scratch.with_name("away"))
    done = run(module, env, check=False)
    result = json.loads(done.stdout.split("alpha | FAILED! => ", 1)[1])
    assert result["msg"].startswith(f"alpha: scratch_root {scratch} does not exist"), result["msg"]
    assert f"mkdir -p {scratch}" in result["msg"] and result["outcome"] == "failed", result
    done = play(f.a, "--check")
    assert done.returncode == 2 and recap(done.stdout)["alpha"]["failed"] == 1, done.stdout
    scratch.with_name("away").rename(scratch)
    assert hosts_digest() == before

    # the first host's build fails: the play stops there, beta and gamma are untouched
    flag.touch()
    done = play(f.a)
    assert done.returncode == 2, done.stdout
    assert recap(done.stdout)["alpha"]["failed"] == 1 and set(recap(done.stdout)) == {"alpha"}, done.stdout
    assert "failswitch: the build fails" in done.stdout
    assert [r["outcome"] for r in f.receipts(state)] == ["failed"] and f.receipts(state)[0]["host"] == "alpha"
    assert f.started() == 0 and not f.root("beta").exists() and not f.root("gamma").exists()
    flag.unlink()

    # serial 1, max_fail_percentage 0: A rolled out; the second run changes nothing
    done = play(f.a)
    assert done.returncode == 0 and changed(done.stdout) == {"alpha": 1, "beta": 1, "gamma": 1}, done.stdout
    done = play(f.a)
    assert done.returncode == 0 and changed(done.stdout) == {"alpha": 0, "beta": 0, "gamma": 0}, done.stdout
    assert {r["host"]: r["outcome"] for r in f.receipts(state)[-3:]} == {
        "alpha": "already-current", "beta": "already-current", "gamma": "already-current"}

    # the facts, with connection: local (the action plugin fills host from the inventory name)
    done = run([BIN / "ansible", "login_hosts", "-i", inventory, "-c", "local", "-m", "vq.admin.facts",
                "-a", f"config={f.config} state_dir={state}"], env)
    assert done.stdout.count(f'"sha": "{f.a}"') >= 3 and '"host": "gamma"' in done.stdout, done.stdout
    # the helper lane in check mode: its plan is refused (this world has no helper_source_repo): failed, with
    # the first error line as msg and the outcome usage
    done = run([BIN / "ansible", "alpha", "-i", inventory, "-c", "local", "--check", "-m", "vq.admin.helper",
                "-a", f"config={f.config} state_dir={state}"], env, check=False)
    result = json.loads(done.stdout.split("alpha | FAILED! => ", 1)[1])
    assert (result["outcome"], result["exit_code"]) == ("usage", 2), done.stdout
    assert result["msg"].startswith("hosts.alpha.helper_source_repo: is not configured"), result["msg"]

    # gamma moved to B behind the play's back: check mode says gamma alone would change, and changes nothing
    assert run_vq("update", f.program, "gamma", "--expected-sha", f.b, config=f.config, state=state).exit_code == 0
    before = hosts_digest()
    done = play(f.a, "--check")
    assert done.returncode == 0 and changed(done.stdout) == {"alpha": 0, "beta": 0, "gamma": 1}, done.stdout
    assert hosts_digest() == before

    # a second administrator holds beta's lease: outcome locked, retried with until, then already-current
    (f.gate / "open").unlink()
    started = f.started()
    other = f.update("beta", f.b, state=tmp_path / "other-state")
    wait_for(lambda: f.started() > started, "the other administrator's build to start")
    proc = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), "--limit", "beta",
                             "-e", f"sha={f.b}", "-e", f"vq_config={f.config}", "-e", f"vq_state={state}",
                             "-e", "lock_retries=120"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(r["outcome"] == "locked" for r in f.receipts(state, "beta")), "a locked receipt for beta")
    f.open_gate()
    code, out, err = finish(proc)
    assert finish(other)[0] == 0
    assert code == 0 and "FAILED - RETRYING: [beta -> localhost]: deploy vibeqc" in out, out + err
    assert recap(out) == {"beta": dict(recap(out)["beta"], ok=1, changed=0, failed=0)}, out
    locked = [r for r in f.receipts(state, "beta") if r["outcome"] == "locked"]
    assert locked and all(r["exit_code"] == 75 and "lease" in r["errors"][0] for r in locked), locked
    assert f.receipts(state, "beta")[-1]["outcome"] == "already-current"

    # the same with wait_lock (--wait-lock): the task waits for the held lease, no retry, no locked receipt
    (f.gate / "open").unlink()
    started, receipts, calls = f.started(), len(f.receipts(state, "beta")), tmp_path / "calls.jsonl"
    other = f.update("beta", f.a, state=tmp_path / "other-state")
    wait_for(lambda: f.started() > started, "the other administrator's build to start")
    proc = subprocess.Popen([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook), "--limit", "beta",
                             "-e", f"sha={f.a}", "-e", f"vq_config={f.config}", "-e", f"vq_state={state}",
                             "-e", "wait_lock=300"], env=dict(env, VQ_ADMIN_TESTING="1", VQ_ADMIN_FAULT_LOG=str(calls)),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: calls.exists() and "session" in calls.read_text(), "the task's run to ask for the lease")
    f.open_gate()
    code, out, err = finish(proc)
    assert finish(other)[0] == 0
    assert code == 0 and "RETRYING" not in out and recap(out)["beta"]["failed"] == 0, out + err
    last = f.receipts(state, "beta")[receipts:]
    assert [r["outcome"] for r in last] == ["already-current"] and last[0]["lease"]["waited"]["wait_lock"] == 300
