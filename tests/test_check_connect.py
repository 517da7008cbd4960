"""``vq admin check --connect`` against the real loopback sshd and the real
single-node Slurm; and ``vq admin check`` refusing a missing ``ssh_config``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from support import AGENT, run_vq, write_config

pytestmark = pytest.mark.real


def _slow_agent(tmp: Path, seconds: float) -> Path:
    """An agent that answers after *seconds* (a slow login host)."""
    script = tmp / f"slow-agent-{seconds:g}"
    script.write_text(f"#!{sys.executable}\nimport os, sys, time\ntime.sleep({seconds})\n"
                      f"os.execv({AGENT!r}, [{AGENT!r}] + sys.argv[1:])\n")
    script.chmod(0o755)
    return script


def _profile(host: str, program: str, allocation: bool) -> str:
    alloc = 'update_allocation = { sbatch_args = ["--time=5"] }\n' if allocation else ""
    return (f"[hosts.{host}.scheduler_runtime_deployments.{program}]\n"
            f'update_command = "/bin/true"\nverify_command = "/bin/true"\nsource_repo = "/srv/src/{program}"\n'
            f"timeout_seconds = 60\n{alloc}")


def _host(name: str, *, ssh: str | None = None, agent: str = AGENT, role: str = "managed",
          transport: str = "ssh", scratch: Path, allocation: bool = False) -> str:
    lines = [f"[hosts.{name}]", f'fleet_role = "{role}"', f'transport = "{transport}"', f'agent = "{agent}"',
             f'scratch_root = "{scratch}"']
    if ssh:
        lines.append(f'ssh = "{ssh}"')
    text = "\n".join(lines) + "\n"
    if allocation:
        text += _profile(name, f"{name}-prog", True)
    return text + "\n"


@pytest.fixture
def scratch(tmp_path):
    d = tmp_path / "scratch"
    d.mkdir()
    return d


def test_every_host_reached_in_parallel_with_a_reason_for_each_failure(tmp_path, scratch, real_cluster):
    slow = _slow_agent(tmp_path, 3)
    hang = _slow_agent(tmp_path, 120)
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.sshd.ssh_config}"\n\n' + "".join([
        _host("cluster", ssh="cluster", scratch=scratch, allocation=True),        # agent + sinfo: ok
        _host("build", ssh="cluster-build", scratch=scratch),                     # agent only: ok
        _host("slow1", ssh="cluster", agent=str(slow), scratch=scratch),          # 3 s each ...
        _host("slow2", ssh="cluster", agent=str(slow), scratch=scratch),          # ... in parallel
        _host("noagent", ssh="cluster", agent="/nonexistent/vq-admin-agent", scratch=scratch),
        _host("unresolvable", ssh="no-such-host.invalid", scratch=scratch),
        _host("hung", ssh="cluster", agent=str(hang), scratch=scratch),
        _host("retired", ssh="cluster", role="excluded", scratch=scratch),
    ]))
    started = time.monotonic()
    result = run_vq("check", "--connect", "--timeout", "8", "--json", config=config, timeout=120)
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.stderr
    doc = result.json()
    assert doc["schema"] == "vq-admin/check-connect/1" and doc["reachable"] is False and doc["exit_code"] == 1
    hosts = doc["hosts"]
    assert sorted(hosts) == sorted(["cluster", "build", "slow1", "slow2", "noagent", "unresolvable", "hung", "retired"])
    assert hosts["cluster"]["status"] == "ok", hosts["cluster"]
    assert hosts["cluster"]["argv"][-4:] == ["version", "--sinfo", "--root", str(scratch)]
    assert hosts["cluster"]["sinfo"]["exit_code"] == 0 and sum(hosts["cluster"]["sinfo"]["states"].values()) == 1
    assert hosts["cluster"]["agent"]["version"] and hosts["cluster"]["agent"]["checksum"] in ("xxh3_64", "blake2b")
    assert hosts["build"]["status"] == "ok" and hosts["build"]["sinfo"] is None
    assert hosts["build"]["where"] == "cluster-build"
    assert hosts["slow1"]["status"] == hosts["slow2"]["status"] == "ok"
    assert "not found" in hosts["noagent"]["reason"] and "/nonexistent/vq-admin-agent" in hosts["noagent"]["reason"]
    assert hosts["unresolvable"]["status"] == "failed"
    assert "exit 255" in hosts["unresolvable"]["reason"] and "no-such-host.invalid" in hosts["unresolvable"]["reason"]
    assert hosts["hung"]["reason"] == "no answer within 8 s"
    assert hosts["retired"]["status"] == "skipped" and "excluded" in hosts["retired"]["reason"]
    assert doc["failed"] == ["noagent", "unresolvable", "hung"]
    # in parallel: the two 3 s hosts and the 8 s bound overlap (serially it would be >= 14 s)
    assert elapsed < 13, elapsed


def test_the_table_names_each_failure_and_all_reachable_exits_0(tmp_path, scratch, real_cluster):
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.sshd.ssh_config}"\n\n' + "".join([
        _host("cluster", ssh="cluster", scratch=scratch, allocation=True),
        _host("noagent", ssh="cluster", agent="/nonexistent/agent", scratch=scratch),
    ]))
    result = run_vq("check", "--connect", config=config, timeout=120)
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].split() == ["HOST", "ROLE", "WHERE", "STATUS", "AGENT", "PYTHON", "SINFO", "SECONDS", "DETAIL"]
    assert lines[1].split()[:4] == ["cluster", "managed", "cluster", "ok"] and "idle" in lines[1]
    assert lines[2].split()[:4] == ["noagent", "managed", "cluster", "failed"]
    assert "agent /nonexistent/agent not found" in lines[2] and len(lines) == 3  # one line per host, with its reason

    good = write_config(tmp_path / "good.toml", f'ssh_config = "{real_cluster.sshd.ssh_config}"\n\n'
                        + _host("cluster", ssh="cluster", scratch=scratch, allocation=True)
                        + _host("build", ssh="cluster-build", scratch=scratch))
    result = run_vq("check", "--connect", config=good, timeout=120)
    assert result.exit_code == 0, result.stderr
    assert [ln.split()[3] for ln in result.stdout.splitlines()[1:]] == ["ok", "ok"]


def test_build_hosts_are_probed_once_each_and_an_alias_is_never_contacted(tmp_path, scratch, real_sshd):
    """update_host and helper_update_host are reached like login hosts (agent version), each destination
    once, naming what uses it; an alias without ``ssh`` (the docs' example) is reached as its canonical host."""
    def profile(program: str, build: str) -> str:
        return _profile("cluster", program, False) + f'update_host = "{build}"\n'

    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n\n'
                          + _host("cluster", ssh="cluster", scratch=scratch)
                          + 'helper_update_command = "/bin/true"\nhelper_update_host = "cluster-build"\n\n'
                          + profile("one", "cluster-build") + profile("two", "no-such-build.invalid")
                          + '\n[hosts.login2]\nfleet_role = "alias"\ncanonical_host = "cluster"\n')
    result = run_vq("check", "--connect", "--timeout", "20", "--json", config=config, timeout=120)
    doc = result.json()
    assert result.exit_code == 1 and doc["failed"] == ["no-such-build.invalid"], result.stdout
    assert sorted(doc["hosts"]) == ["cluster", "login2"] and doc["hosts"]["cluster"]["status"] == "ok"
    assert doc["hosts"]["login2"]["status"] == "skipped" and "alias of cluster" in doc["hosts"]["login2"]["reason"]
    builds = doc["build_hosts"]
    assert list(builds) == ["cluster-build", "no-such-build.invalid"]
    good, bad = builds["cluster-build"], builds["no-such-build.invalid"]
    assert good["status"] == "ok" and good["agent"]["version"]
    assert good["argv"][-3:] == ["version", "--root", str(scratch)]
    assert good["used_by"] == ["helper_update_host of cluster", "update_host of cluster/one"]
    assert bad["status"] == "failed" and bad["used_by"] == ["update_host of cluster/two"]
    assert "exit 255" in bad["reason"] and "no-such-build.invalid" in bad["reason"]

    text = run_vq("check", "--connect", "--timeout", "20", config=config, timeout=120)
    lines = text.stderr.splitlines()
    assert text.exit_code == 1 and len(lines) == 5, text.stderr  # the header, then one line per host
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["cluster-build"].split()[1:4] == ["build", "cluster-build", "ok"]
    assert rows["cluster-build"].endswith("helper_update_host of cluster, update_host of cluster/one")
    assert rows["no-such-build.invalid"].split()[1:4] == ["build", "no-such-build.invalid", "failed"]
    assert "ssh to no-such-build.invalid failed (exit 255)" in rows["no-such-build.invalid"]
    assert rows["login2"].split()[3] == "skipped"


def test_sinfo_failing_is_a_failure_with_slurms_message(tmp_path, scratch):
    """A local host whose Slurm cannot be reached (no SLURM_CONF, no DNS SRV record)."""
    config = write_config(tmp_path / "admin.toml", _host("here", transport="local", scratch=scratch, allocation=True))
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    result = run_vq("check", "--connect", "--json", config=config, env=env, timeout=120)
    assert result.exit_code == 1
    here = result.json()["hosts"]["here"]
    assert here["status"] == "failed" and here["reason"].startswith("sinfo: ")
    assert here["sinfo"]["exit_code"] not in (0, None) and here["agent"]["version"]


def test_a_missing_ssh_config_is_a_usage_error_naming_the_key(tmp_path, scratch):
    missing = tmp_path / "nowhere" / "ssh_config"
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{missing}"\n\n'
                          + _host("cluster", ssh="cluster", scratch=scratch))
    for extra in ([], ["--connect"]):
        result = run_vq("check", *extra, config=config, timeout=60)
        assert result.exit_code == 2, result.stderr
        assert f"ssh_config: {missing} does not exist" in result.stderr and result.stdout == ""
    result = run_vq("check", "--json", config=config, timeout=60)
    assert result.exit_code == 2 and "ssh_config" in result.json()["errors"][0]


def test_timeout_without_connect_is_a_usage_error(tmp_path, scratch):
    config = write_config(tmp_path / "admin.toml", _host("here", transport="local", scratch=scratch))
    assert run_vq("check", "--timeout", "5", config=config).exit_code == 2
    assert run_vq("check", "--connect", "--timeout", "-1", config=config).exit_code == 2
    assert run_vq("check", "--connect", "--timeout", "nan", config=config).exit_code == 2


def test_each_scratch_root_is_checked_as_a_run_would_with_the_fix_named(tmp_path, real_sshd):
    """A login host's missing scratch_root fails ``--connect`` naming the mkdir/chmod that fixes it, and
    then lets the run through; a build host is checked for the scratch_root of each login host naming it
    (stages are made there), and one that another user can change is named with its fix."""
    missing, shared = tmp_path / "scratch-missing", tmp_path / "scratch-shared"
    shared.mkdir()
    shared.chmod(0o777)  # group- and other-writable without the sticky bit: anybody could swap .vq-admin
    good = tmp_path / "scratch-good"
    good.mkdir()
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n\n'
                          + _host("cluster", ssh="cluster", scratch=missing)
                          + _host("other", ssh="cluster", scratch=good)
                          + _profile("other", "prog", False) + 'update_host = "cluster-build"\n\n'
                          + _host("third", ssh="cluster", scratch=shared)
                          + _profile("third", "prog", False) + 'update_host = "cluster-build"\n\n')
    result = run_vq("check", "--connect", "--timeout", "30", "--json", config=config, timeout=120)
    doc = result.json()
    assert result.exit_code == 1 and doc["failed"] == ["cluster", "third", "cluster-build"], result.stdout
    cluster = doc["hosts"]["cluster"]
    assert cluster["argv"][-2:] == ["--root", str(missing)] and cluster["agent"]["version"]
    assert cluster["scratch"] == [{"root": str(missing), "problem": cluster["reason"]}]
    assert f"scratch_root {missing} does not exist" in cluster["reason"]
    assert f"mkdir -p {missing} && chmod 700 {missing}" in cluster["reason"]
    assert doc["hosts"]["other"]["status"] == "ok" and doc["hosts"]["other"]["scratch"][0]["problem"] is None
    build = doc["build_hosts"]["cluster-build"]
    assert [c["root"] for c in build["scratch"]] == [str(good), str(shared)]
    assert build["scratch"][0]["problem"] is None and build["reason"] == build["scratch"][1]["problem"]
    assert f"directory {shared} is group- and other-writable" in build["reason"] and "chmod go-w" in build["reason"]
    text = run_vq("check", "--connect", "--timeout", "30", config=config, timeout=120)
    row = next(line for line in text.stderr.splitlines() if line.startswith("cluster "))
    assert text.exit_code == 1 and row.split()[3] == "failed" and row.endswith(f"chmod 700 {missing}"), text.stderr

    missing.mkdir(mode=0o700)  # the fix as named
    shared.chmod(0o755)
    result = run_vq("check", "--connect", "--timeout", "30", "--json", config=config, timeout=120)
    assert result.exit_code == 0 and result.json()["failed"] == [], result.stdout


def test_a_run_refused_by_a_missing_scratch_root_names_the_fix_and_check_connect_finds_it_first(tmp_path,
                                                                                               real_sshd):
    from test_chaos import World

    world = World(tmp_path, real_sshd.ssh_config, "scratchless")
    world.scratch.rmdir()
    found = run_vq("check", "--connect", "--json", config=world.config, timeout=120).json()
    assert found["failed"] == ["cluster", "cluster-build"], found
    rows = (found["hosts"]["cluster"], found["build_hosts"]["cluster-build"])
    assert all("mkdir -p" in row["reason"] for row in rows), rows
    done = world.run()
    assert done.outcome == "refused" and world.active() is None, done.stdout
    assert any(f"mkdir -p {world.scratch} && chmod 700 {world.scratch}" in e for e in done.receipt["errors"]), \
        done.receipt["errors"]
