"""A run that could not reach its login host (name not resolved, connection refused, authentication
failed) changed nothing: it is ``failed`` (1), saying so, never ``unknown`` (3), for every lane verb
that takes the host-side lease; ``verify``, which changes nothing, still calls such a host ``unknown``
(CONTRACT section 15).  Real ssh against the loopback sshd, real git.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from realhosts.procs import free_port
from support import GitRepo, command_host, run_vq, write_config

pytestmark = pytest.mark.real

#: What each way of not reaching the host puts in ssh's last line.
CASES = {
    "unresolvable": "Could not resolve hostname",
    "refused": "Connection refused",
    "noauth": "Permission denied",
}


def ssh_config(tmp_path: Path, sshd) -> Path:
    """The sshd's aliases plus ``unresolvable``, ``refused`` (a port nothing listens on) and ``noauth``
    (the real sshd, with a key it does not accept)."""
    stranger = tmp_path / "stranger-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True, timeout=30)
    common = (f"    UserKnownHostsFile {sshd.known_hosts}\n    StrictHostKeyChecking yes\n    BatchMode yes\n"
              "    User root\n    IdentitiesOnly yes\n")
    path = tmp_path / "ssh_config"
    path.write_text(sshd.ssh_config.read_text() + "\n"
                    + f"Host unresolvable\n    HostName no-such-host.invalid\n{common}\n"
                    + f"Host refused\n    HostName 127.0.0.1\n    Port {free_port()}\n{common}"
                    + f"    IdentityFile {sshd.identity}\n\n"
                    + f"Host noauth\n    HostName 127.0.0.1\n    Port {sshd.port}\n{common}"
                    + f"    IdentityFile {stranger}\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("where", list(CASES))
def test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing(tmp_path, real_sshd, where):
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("A")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    marker = tmp_path / "built"
    table = command_host("vibeqc", scratch=scratch, repo=repo.path, update=f"/usr/bin/touch {marker}",
                         verify="/bin/false").replace('ssh = "cluster"', f'ssh = "{where}"')
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{ssh_config(tmp_path, real_sshd)}"\n\n{table}')
    state = tmp_path / "state"
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", config=config, state=state,
                  timeout=180)
    receipt = done.json()
    assert (done.exit_code, receipt["outcome"]) == (1, "failed"), done.stdout
    assert "this run changed nothing" in receipt["errors"][0] and CASES[where] in receipt["errors"][0], receipt
    assert receipt["readback"]["advice"].startswith("nothing was changed by this run"), receipt["readback"]
    assert not marker.exists() and not list(scratch.iterdir())
    summary = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, config=config, state=state, timeout=180)
    assert summary.exit_code == 1 and "failed (exit 1)" in summary.stderr, summary.stderr
    assert "changed nothing" in summary.stderr
    # verify changes nothing either, but could not establish the state: unknown there
    found = run_vq("verify", "vibeqc", "cluster", "--expected-sha", sha, "--json", config=config, state=state,
                   timeout=180)
    assert found.exit_code == 3 and found.json()["hosts"]["cluster"]["vibeqc"]["state"] == "unknown", found.stdout


def test_a_rollback_and_a_prune_that_cannot_reach_the_host_are_failed(tmp_path, real_sshd):
    """A rollback without an activation runs the update's first call; a prune takes the host-side lease
    before its body (``Lease.acquire``): neither reaches the host, both changed nothing."""
    from test_chaos import World

    world = World(tmp_path, str(ssh_config(tmp_path, real_sshd)), "unreachable-generations")
    assert world.run(world.a).outcome == "ok" and world.run(world.b).outcome == "ok"
    text = world.config.read_text().replace('ssh = "cluster"', 'ssh = "refused"')
    prune = 'prune_command = "/bin/true"\nverify_timeout_seconds'
    world.config.write_text(text.replace("verify_timeout_seconds", prune))
    for verb in (["rollback", world.program, "cluster"], ["prune", world.program, "cluster"]):
        done = run_vq(*verb, "--json", config=world.config, state=world.state, timeout=180)
        receipt = done.json()
        assert (done.exit_code, receipt["outcome"]) == (1, "failed"), (verb, done.stdout)
        assert any("Connection refused" in e and "changed nothing" in e for e in receipt["errors"]), receipt
    assert world.active() == world.b


def test_a_helper_update_that_cannot_reach_its_host_is_failed(tmp_path, real_sshd):
    from helper_world import helper_repo, helper_table

    repo, sha = helper_repo(tmp_path / "helper-repo")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    table = helper_table("cluster", root=tmp_path / "helper", repo=repo.path, scratch=scratch, transport="ssh",
                         ssh="unresolvable")
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{ssh_config(tmp_path, real_sshd)}"\n\n{table}')
    done = run_vq("update", "cluster", "--expected-sha", sha, "--json", config=config, state=tmp_path / "state",
                  timeout=180)
    receipt = done.json()
    assert (done.exit_code, receipt["outcome"]) == (1, "failed"), done.stdout
    assert any("Could not resolve hostname" in e and "changed nothing" in e for e in receipt["errors"]), receipt
