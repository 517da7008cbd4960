"""``vq admin verify``: the read-only drift check, against the real sshd.

Four managed hosts, each an alias of one loopback sshd with its own runtime
root, all verified at one SHA by the tool; then, behind its back, beta's
``current`` link is moved to another generation, gamma's launcher is
replaced, and delta's ssh alias points at a closed port.  ``verify --all``
must say current / drifted (both SHAs) / drifted (both hashes) / unknown,
and change nothing under the state directory or on any host.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from fleet_world import Fleet, finish, wait_for
from realhosts import SshdServer, remote_path
from support import SITE_EXAMPLE, run_vq, tree_digest

pytestmark = pytest.mark.real

ALIASES = ("login-a", "login-b", "login-c", "login-d")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshdServer(tmp_path_factory.mktemp("verify-sshd"), env={"PATH": remote_path()}, aliases=ALIASES,
                          separate_accounts=True)
    server.start()
    yield server
    server.stop()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_verify_names_current_drifted_and_unknown_and_changes_nothing(tmp_path, sshd):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(sshd.ssh_config.read_text())
    f = Fleet(tmp_path, str(ssh_config), {name: {"ssh": alias} for name, alias in
                                         zip(("alpha", "beta", "gamma", "delta"), ALIASES, strict=True)},
              sshd=sshd)
    state = tmp_path / "state"
    done = run_vq("update", f.program, "--all", "--expected-sha", f.a, "--json", config=f.config, state=state)
    assert done.exit_code == 0, done.stdout + done.stderr
    done = run_vq("update", f.program, "beta", "--expected-sha", f.b, "--json", config=f.config, state=state)
    assert done.exit_code == 0, done.stdout + done.stderr

    # behind the tool's back: beta's current back to A, gamma's launcher replaced, delta unreachable
    current = f.root("beta") / "current"
    os.symlink(os.readlink(current).replace(f.b, f.a), f.root("beta") / "current.tmp")
    os.replace(f.root("beta") / "current.tmp", current)
    last_ok = json.loads((state / "hosts" / "gamma" / "runtime" / f.program / "last-ok.json").read_text())
    launcher = Path(last_ok["launcher"])
    launcher.unlink()
    launcher.write_text('#!/bin/sh\nexec python3 "$@"\n')
    launcher.chmod(0o755)
    blocks = ssh_config.read_text().split("\n\n")  # one per alias, in ALIASES order
    blocks[3] = blocks[3].replace(f"Port {sshd.port}", f"Port {closed_port()}")
    ssh_config.write_text("\n\n".join(blocks))
    def unchanged() -> tuple[dict[str, str], dict[str, str]]:  # the host's record it reads is kept in record/
        return ({k: v for k, v in tree_digest(state).items() if not k.startswith("record")},
                tree_digest(tmp_path / "hosts"))

    before = unchanged()

    done = run_vq("verify", f.program, "--all", "--json", config=f.config, state=state)
    assert done.exit_code == 3, done.stdout + done.stderr
    doc = done.json()
    assert (doc["schema"], doc["outcome"], doc["exit_code"]) == ("vq-admin/verify/1", "unknown", 3)
    hosts = {name: doc["hosts"][name][f.program] for name in ("alpha", "beta", "gamma", "delta")}
    assert {name: entry["state"] for name, entry in hosts.items()} == {
        "alpha": "current", "beta": "drifted", "gamma": "drifted", "delta": "unknown"}
    assert hosts["beta"]["detail"] == f"active SHA {f.a}; LAST OK names {f.b}"
    assert hosts["beta"]["active"]["sha"] == f.a and hosts["beta"]["expected"]["sha"] == f.b
    new_hash = hosts["gamma"]["active"]["launcher_sha256"]
    assert new_hash and new_hash != last_ok["launcher_sha256"]
    assert hosts["gamma"]["detail"] == (f"launcher {launcher} has SHA-256 {new_hash}; "
                                        f"LAST OK attested {last_ok['launcher_sha256']}")
    assert "delta could not be reached" in hosts["delta"]["detail"]
    assert [e.split(":")[0] for e in doc["errors"]] == [f"beta {f.program}", f"gamma {f.program}",
                                                        f"delta {f.program}"]

    # the table off a terminal: printed because something is not current; one host: 0 and silent
    table = run_vq("verify", f.program, "--all", config=f.config, state=state)
    assert table.exit_code == 3 and table.stdout.splitlines()[0].split() == ["HOST", "PROGRAM", "STATE", "DETAIL"]
    assert [line.split()[:3] for line in table.stdout.splitlines()[1:]] == [
        ["alpha", f.program, "current"], ["beta", f.program, "drifted"], ["gamma", f.program, "drifted"],
        ["delta", f.program, "unknown"]]
    alone = run_vq("verify", f.program, "alpha", config=f.config, state=state)
    assert (alone.exit_code, alone.stdout) == (0, ""), alone.stderr
    # --expected-sha A: what beta now runs is what was asked for
    asked = run_vq("verify", f.program, "beta", "--expected-sha", f.a, "--json", config=f.config, state=state)
    assert asked.exit_code == 0 and asked.json()["hosts"]["beta"][f.program]["state"] == "current", asked.stdout
    # gamma alone is drifted: exit 1 (failed)
    assert run_vq("verify", f.program, "gamma", config=f.config, state=state).exit_code == 1

    prom = tmp_path / "metrics" / "vq_admin_verify.prom"
    prom.parent.mkdir(mode=0o755)
    done = run_vq("verify", "--all", "--textfile", str(prom), config=f.config, state=state)
    assert done.exit_code == 3 and done.stdout == ""
    text = prom.read_text()
    assert "# TYPE vq_admin_runtime_drift gauge" in text and "# TYPE vq_admin_runtime_state gauge" in text
    # the state is never a label of the drift gauge (a new series at each change); it is a fixed state set
    for name, found in (("alpha", "current"), ("beta", "drifted"), ("gamma", "drifted"), ("delta", "unknown")):
        labels = f'host="{name}",program="{f.program}"'
        assert f"vq_admin_runtime_drift{{{labels}}} {0.0 if found == 'current' else 1.0}" in text
        for state_name in ("current", "drifted", "unhealthy", "broken", "unknown"):
            assert f'vq_admin_runtime_state{{{labels},state="{state_name}"}} {float(found == state_name)}' in text
    assert [line for line in text.splitlines() if line.startswith("vq_admin_runtime_drift{")
            and "state=" in line] == []

    unknown = run_vq("verify", f.program, "nosuch", "--json", config=f.config, state=state)
    assert unknown.exit_code == 2 and "hosts: alpha, beta, delta, gamma" in unknown.json()["errors"][0]
    # nothing changed: no receipt, record or log line under the state directory, nothing on any host
    assert unchanged() == before


def test_a_silent_verifier_is_named_and_verify_calls_it_broken_not_unhealthy(tmp_path, real_sshd):
    """A verifier that exits 0 and prints nothing: the update's error names the command and its exit
    status, and ``verify`` reports a broken verifier (not a runtime problem), naming both too."""
    from test_chaos import World

    world = World(tmp_path, str(real_sshd.ssh_config), "silent-verifier")
    assert world.run(world.a).outcome == "ok"
    (tmp_path / "verify-wrapper").write_text("#!/bin/sh\necho 'verifier: lost its way' >&2\nexit 0\n")
    done = world.run(world.b)
    assert done.outcome == "failed" and world.active() == world.a, done.stdout
    verifier = tmp_path / "verify-wrapper"
    assert done.receipt["errors"][-1] == (f"pre-verify: verify command {verifier} exited 0 and printed nothing (a "
                                          "verify receipt on stdout is required; stderr: verifier: lost its way); "
                                          "only read-only checks ran; nothing was changed"), done.receipt["errors"]
    found = run_vq("verify", world.program, "cluster", "--json", config=world.config, state=world.state)
    entry = found.json()["hosts"]["cluster"][world.program]
    assert found.exit_code == 1 and entry["state"] == "broken", found.stdout
    assert entry["detail"].startswith(f"the verifier is broken: verify command {verifier} exited 0 and printed "
                                      "nothing"), entry["detail"]
    (tmp_path / "verify-wrapper").write_text("#!/bin/sh\nexit 4\n")
    entry = run_vq("verify", world.program, "cluster", "--json", config=world.config,
                   state=world.state).json()["hosts"]["cluster"][world.program]
    assert (entry["state"], entry["detail"]) == ("broken", f"the verifier is broken: verify command {verifier} "
                                                           "exited 4: (no message on stderr)"), entry


SWITCH_THEN_WAIT = """#!/bin/sh
# switch-then-wait DIR WORDS...: run WORDS (the deploy: it switches current), record it, wait for DIR/open.
dir="$1"; shift
"$@" || exit $?
: > "$dir/switched"
i=0
while [ ! -e "$dir/open" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
"""


def test_a_runtime_whose_lease_a_run_holds_is_deploying_naming_the_run_not_drifted(tmp_path, sshd):
    """Issue 31 item 9: while an update holds the lease (here: after its provider switched current, before
    its final verify), verify says deploying (exit 75) and names the run, not drifted (exit 1); afterwards
    current again."""
    gate = tmp_path / "deploy-gate"
    gate.mkdir()
    script = tmp_path / "switch-then-wait"
    script.write_text(SWITCH_THEN_WAIT)
    script.chmod(0o755)
    f = Fleet(tmp_path, str(sshd.ssh_config), {"alpha": {"ssh": "login-a"}, "beta": {"ssh": "login-b"}}, sshd=sshd)
    state = tmp_path / "state"
    assert run_vq("update", f.program, "--all", "--expected-sha", f.a, config=f.config, state=state).exit_code == 0
    text = f.config.read_text().replace(f'update_command = "{SITE_EXAMPLE} install --root {f.root("alpha")}"',
                                        f'update_command = "{script} {gate} {SITE_EXAMPLE} install --root '
                                        f'{f.root("alpha")}"')
    f.config.write_text(text)
    run = f.update("alpha", f.b, state=tmp_path / "state-other")  # another administrator deploys B
    try:
        wait_for(lambda: (gate / "switched").exists() or run.poll() is not None, "the deploy to switch current")
        assert run.poll() is None, run.communicate()
        done = run_vq("verify", f.program, "--all", "--json", config=f.config, state=state)
        assert done.exit_code == 75, done.stdout + done.stderr
        doc = done.json()
        assert (doc["outcome"], doc["exit_code"]) == ("locked", 75)
        alpha, beta = (doc["hosts"][name][f.program] for name in ("alpha", "beta"))
        assert beta["state"] == "current" and alpha["state"] == "deploying", alpha
        assert alpha["detail"].startswith("a run holds its host-side lease: held by the agent pid "), alpha["detail"]
        assert f"pid {run.pid}" in alpha["detail"] and f"meanwhile the runtime reads drifted: active SHA {f.b}" \
            in alpha["detail"]
        assert alpha["lease"]["holder"]["pid"] == run.pid and alpha["active"]["sha"] == f.b
        table = run_vq("verify", f.program, "alpha", config=f.config, state=state)
        assert table.exit_code == 75 and table.stdout.splitlines()[1].split()[:3] == ["alpha", f.program, "deploying"]
    finally:
        (gate / "open").touch()
    code, out, err = finish(run)
    assert code == 0, out + err
    after = run_vq("verify", f.program, "alpha", "--expected-sha", f.b, "--json", config=f.config, state=state)
    assert after.exit_code == 0 and after.json()["hosts"]["alpha"][f.program]["state"] == "current", after.stdout
