"""Exact scheduler execution bindings: the registry, ``resolve_launcher``,
``check_pin`` and ``vq admin launcher`` (every refusal), without Slurm.

The command line runs in a fresh interpreter (``support.run_vq``), as the
queue driver would run it.  End-to-end deployments here use the local
transport and the site_example provider on real git repositories; the
Slurm/ssh scenario is in test_bindings_real.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import AGENT, GitRepo, run_vq, run_vq_inprocess, site_example_host, write_config
from vq_admin import bindings
from vq_admin.launcher import registry
from vq_admin.state.records import Verified
from vq_admin.bindings import Binding, LauncherRefused, check_pin, resolve_launcher

SHA_A = "a" * 40
SHA_B = "b" * 40
SHA_C = "c" * 40
HEAVY = ("pluggy", "plumbum", "filelock", "vq_admin_hookspecs", "vq_site_example", "msgspec")
#: The one profile of ``cluster`` and ``fresh`` (a PROGRAM the configuration does not name is a usage error).
PROFILE = 'update_command = "/bin/true"\nverify_command = "/bin/true"\nsource_repo = "/srv/src/vibeqc"'
HEAVY_OWN = ("vq_admin.config", "vq_admin.plugins", "vq_admin.ssh.transport", "vq_admin.state.records",
             "vq_admin.providers", "vq_admin.document")


def launcher_of(root: Path, sha: str) -> str:
    return f"{root}/releases/{sha}/source/.venv/bin/python"


def make_launcher(root: Path, sha: str, body: bytes = b"#!/bin/sh\nexit 0\n") -> tuple[str, str]:
    """A real launcher file at the per-SHA path; returns (path, sha256)."""
    path = Path(launcher_of(root, sha))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    path.chmod(0o755)
    return str(path), hashlib.sha256(body).hexdigest()


def register(state: Path, host: str, sha: str, launcher: str, sha256: str = "e" * 64, receipt: str = "r-1",
             at: str = "2026-11-30T00:00:00Z", program: str = "vibeqc") -> dict:
    return registry.record_verified(state, host, program, Verified(sha=sha, tag=None, launcher=launcher,
                                                                   launcher_sha256=sha256, receipt=receipt, at=at))


@pytest.fixture
def world(tmp_path):
    """A state dir with verified A then B on ``cluster``, and a configuration
    with aliases and non-managed roles (transport local, the real agent)."""
    state, apps = tmp_path / "state", tmp_path / "apps"
    path_a, sum_a = make_launcher(apps, SHA_A, b"#!/bin/sh\necho A\n")
    path_b, sum_b = make_launcher(apps, SHA_B, b"#!/bin/sh\necho B\n")
    register(state, "cluster", SHA_A, path_a, sum_a, "r-a", "2026-11-30T00:00:00Z")
    register(state, "cluster", SHA_B, path_b, sum_b, "r-b", "2026-11-30T01:00:00Z")
    config = write_config(tmp_path / "admin.toml", f"""
        [hosts.cluster]
        fleet_role = "managed"
        transport = "local"
        agent = "{AGENT}"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        {PROFILE}
        [hosts.login2]
        fleet_role = "alias"
        canonical_host = "cluster"
        [hosts.helper]
        fleet_role = "helper-only"
        [hosts.old]
        fleet_role = "excluded"
        [hosts.to-helper]
        fleet_role = "alias"
        canonical_host = "helper"
        [hosts.fresh]
        fleet_role = "managed"
        [hosts.fresh.scheduler_runtime_deployments.vibeqc]
        {PROFILE}
        """)
    return {"state": state, "config": config, "apps": apps, "A": path_a, "B": path_b, "sumA": sum_a, "sumB": sum_b}


def vq(world, *args: str):
    """``vq-admin ARGS`` against the world, in this process (the fresh-interpreter launcher is
    tests/test_fastlookup.py's and tests/test_launcher_script.py's)."""
    return run_vq_inprocess(*args, config=world["config"], state=world["state"])


# -- the registry -------------------------------------------------------------------


def test_entry_is_never_rewritten_and_latest_moves(world):
    entry = Path(registry.entry_path(world["state"], "cluster", "vibeqc", SHA_A))
    before = entry.read_bytes()
    outcome = register(world["state"], "cluster", SHA_A, world["A"], world["sumA"], "r-a2", "2026-11-30T02:00:00Z")
    assert outcome["created"] is False and outcome["conflict"] is None
    assert entry.read_bytes() == before
    assert json.loads(before)["receipt"] == "r-a"
    latest, _ = registry.resolve(world["state"], "cluster", "vibeqc", None)
    assert latest == SHA_A  # re-verified A is the latest again
    assert resolve_launcher("vibeqc", "cluster", state_dir=world["state"], config_path=world["config"]).receipt == "r-a"


def test_differing_reattestation_is_kept_apart_and_refused(world):
    outcome = register(world["state"], "cluster", SHA_A, world["A"], "f" * 64, "r-a2")
    assert outcome["created"] is False and outcome["conflict"]
    assert json.loads(Path(outcome["entry"]).read_text())["launcher_sha256"] == world["sumA"]
    with pytest.raises(LauncherRefused) as info:
        resolve_launcher("vibeqc", "cluster", expected_sha=SHA_A, state_dir=world["state"])
    assert info.value.code == "evidence-corrupt" and "not immutable" in info.value.reason


@pytest.mark.parametrize("launcher", ["/apps/v/current/.venv/bin/python", "/usr/bin/python3", "/site/bin/vibeqc",
                                      "relative/releases/" + SHA_C + "/source/.venv/bin/python"])
def test_registry_refuses_to_record_a_mutable_launcher(tmp_path, launcher):
    with pytest.raises(registry.RegistryError):
        register(tmp_path, "cluster", SHA_C, launcher)
    assert not (tmp_path / "registry").exists()


def test_lookup_lists_no_directory(world, monkeypatch):
    """O(1): the lookup opens the pointer and one entry; it never lists a directory."""
    def forbidden(*a, **k):
        raise AssertionError("a lookup listed a directory")

    monkeypatch.setattr(os, "listdir", forbidden)
    monkeypatch.setattr(os, "scandir", forbidden)
    assert resolve_launcher("vibeqc", "cluster", expected_sha=SHA_A, state_dir=world["state"]).launcher == world["A"]
    assert resolve_launcher("vibeqc", "cluster", state_dir=world["state"]).launcher == world["B"]


def test_corrupt_entry_is_refused(world):
    Path(registry.entry_path(world["state"], "cluster", "vibeqc", SHA_A)).write_text('{"schema": "other"}')
    done = vq(world, "launcher", "vibeqc", "cluster", "--expected-sha", SHA_A)
    assert (done.exit_code, done.stdout) == (77, "")
    assert "evidence-corrupt" in done.stderr


# -- vq admin launcher: answers ------------------------------------------------------


def test_prints_exactly_the_latest_verified_launcher(world):
    done = vq(world, "launcher", "vibeqc", "cluster")
    assert (done.exit_code, done.stdout, done.stderr) == (0, world["B"] + "\n", "")


@pytest.mark.parametrize("label", ["A", "B"])
def test_expected_sha_and_exact_path_answer(world, label):
    sha = {"A": SHA_A, "B": SHA_B}[label]
    done = vq(world, "launcher", "vibeqc", "cluster", "--expected-sha", sha.upper(), "--path", world[label])
    assert (done.exit_code, done.stdout) == (0, world[label] + "\n")
    doc = vq(world, "launcher", "vibeqc", "cluster", "--expected-sha", sha, "--json").json()
    assert doc["launcher"] == world[label] and doc["launcher_sha256"] == world["sum" + label]
    assert doc["latest"] is (label == "B") and doc["receipt"] == f"r-{label.lower()}"


def test_alias_resolves_to_its_managed_canonical_host(world):
    doc = vq(world, "launcher", "vibeqc", "login2", "--json").json()
    assert (doc["host"], doc["requested_host"], doc["launcher"]) == ("cluster", "login2", world["B"])


def test_check_on_host_accepts_the_unchanged_launcher(world):
    done = vq(world, "launcher", "vibeqc", "cluster", "--check-on-host")
    assert (done.exit_code, done.stdout) == (0, world["B"] + "\n"), done.stderr


# -- vq admin launcher: every refusal ----------------------------------------------

REFUSALS = {
    "no evidence for a managed host": (["fresh"], "no-evidence", "no verified deployment evidence"),
    "sha differs": (["cluster", "--expected-sha", SHA_C], "sha-mismatch", "differs from the verified evidence"),
    "path of another verified sha": (["cluster", "--expected-sha", SHA_B, "--path", "<A>"], "path-mismatch",
                                     "is not the verified launcher"),
    "path of an unverified root": (["cluster", "--path", f"/elsewhere/releases/{SHA_B}/source/.venv/bin/python"],
                                   "path-mismatch", "authenticates nothing"),
    "path through current": (["cluster", "--path", "<apps>/current/source/.venv/bin/python"], "mutable-launcher",
                             "stable link 'current'"),
    "current named by sha": (["cluster", "--path", f"<apps>/current/{SHA_B}"], "mutable-launcher", "'current'"),
    "bare interpreter": (["cluster", "--path", "/usr/bin/python3"], "mutable-launcher", "bare interpreter"),
    "stable wrapper": (["cluster", "--path", "/site/bin/vibeqc-release"], "mutable-launcher", "stable wrapper"),
    "alias of a helper-only host": (["to-helper"], "unmanaged-host", "does not resolve to a managed host"),
    "helper-only host": (["helper"], "unmanaged-host", "no runtime maintenance authority"),
    "excluded host": (["old"], "unmanaged-host", "'excluded'"),
    "legacy bare sha pin": (["cluster", "--pin", SHA_A], "legacy-pin", "bare SHA"),
    "legacy current pin": (["cluster", "--pin",
                            json.dumps({"sha": SHA_A, "launcher": "<apps>/current/source/.venv/bin/python"})],
                           "legacy-pin", "stable link 'current'"),
    "legacy pin without launcher": (["cluster", "--pin", json.dumps({"sha": SHA_A})], "legacy-pin", "no launcher path"),
    "unrecognised pin": (["cluster", "--pin", "{not json"], "legacy-pin", "not recognised"),
    "pin with other bytes": (["cluster", "--pin",
                              json.dumps({"schema": "vq-admin/pin/1", "sha": SHA_A, "launcher": "<A>",
                                                             "launcher_sha256": "0" * 64})], "pin-mismatch", "attests"),
    "pin for another host": (["cluster", "--pin", json.dumps({"schema": "vq-admin/pin/1", "host": "x2", "sha": SHA_A,
                                                             "launcher": "<A>"})], "pin-mismatch", "dispatch asks"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusal_exits_77_with_reason_and_prints_no_launcher(world, case):
    words, code, reason = REFUSALS[case]
    words = [w.replace("<A>", world["A"]).replace("<apps>", str(world["apps"])) for w in words]
    program, rest = ("vibeqc", words) if words[0] != "other-prog" else ("other-prog", words[1:])
    done = vq(world, "launcher", program, *rest)
    assert done.exit_code == 77, done.stderr
    assert done.stdout == ""
    assert f"refused ({code})" in done.stderr and reason in done.stderr and "remedy:" in done.stderr
    doc = vq(world, "launcher", program, *rest, "--json").json()
    assert (doc["exit_code"], doc["code"], doc["launcher"]) == (77, code, None)
    assert doc["reason"] and doc["remedy"]
    for verified in (world["A"], world["B"]):  # no verified launcher is offered in place of the refused one
        if verified not in " ".join(rest):
            assert verified not in done.stderr + json.dumps(doc)


@pytest.mark.parametrize("words,message", [
    (["other-prog", "cluster"], "host cluster has no scheduler_runtime_deployments.other-prog profile "
                                "(profiles: vibeqc)"),
    (["vibeqc", "nowhere"], "host 'nowhere' is not in the configuration"),
], ids=["unknown program", "unknown host"])
def test_a_program_or_host_the_configuration_does_not_name_is_a_usage_error(world, words, message):
    done = vq(world, "launcher", *words)
    assert (done.exit_code, done.stdout) == (2, "") and message in done.stderr, done.stderr
    assert vq(world, "launcher", *words, "--json").json()["exit_code"] == 2


def test_legacy_pin_remedy_is_the_documented_one(world):
    done = vq(world, "launcher", "vibeqc", "cluster", "--pin", SHA_A)
    assert (f"remedy: re-verify: vq admin update vibeqc cluster --expected-sha {SHA_A}, then resubmit with the "
            f"launcher printed by vq admin launcher vibeqc cluster --expected-sha {SHA_A}") in done.stderr


def test_check_on_host_refuses_a_changed_launcher(world):
    Path(world["B"]).write_bytes(b"#!/bin/sh\necho not B\n")
    plain = vq(world, "launcher", "vibeqc", "cluster")  # visible on this driver: changed bytes are seen (CONTRACT 12)
    assert plain.exit_code == 77 and "refused (launcher-gone): " in plain.stderr and "changed:" in plain.stderr
    done = vq(world, "launcher", "vibeqc", "cluster", "--check-on-host")
    assert (done.exit_code, done.stdout) == (77, "")
    assert "refused (launcher-changed)" in done.stderr and world["sumB"] in done.stderr
    Path(world["B"]).unlink()
    done = vq(world, "launcher", "vibeqc", "cluster", "--check-on-host")
    assert done.exit_code == 77 and "no longer exists" in done.stderr


def test_check_on_host_without_configuration_fails_closed(world, tmp_path):
    done = run_vq("launcher", "vibeqc", "cluster", "--check-on-host", config=tmp_path / "missing.toml",
                  state=world["state"])
    assert (done.exit_code, done.stdout) == (77, "") and "readback-failed" in done.stderr


@pytest.mark.parametrize("args", [["--expected-sha", SHA_A[:12]], ["--expected-sha", "main"],
                                  ["--pin", SHA_A, "--path", "/x"]])
def test_usage_errors_exit_2(world, args):
    done = vq(world, "launcher", "vibeqc", "cluster", *args)
    assert (done.exit_code, done.stdout) == (2, "")


# -- the Python API -----------------------------------------------------------------


def test_python_api_refusal_is_typed(world):
    with pytest.raises(LauncherRefused) as info:
        resolve_launcher("vibeqc", "cluster", path="/usr/bin/python3", state_dir=world["state"])
    assert info.value.code == "mutable-launcher" and info.value.outcome.exit_code == 77
    with pytest.raises(bindings.BindingUsageError):
        resolve_launcher("vibeqc", "cluster", expected_sha="abc123", state_dir=world["state"])
    with pytest.raises(ValueError):
        resolve_launcher("vibeqc", "../etc", state_dir=world["state"])


def test_pin_round_trip_and_binding_is_frozen(world):
    binding = resolve_launcher("vibeqc", "cluster", expected_sha=SHA_A, state_dir=world["state"])
    assert isinstance(binding, Binding) and binding.launcher == world["A"]
    with pytest.raises(AttributeError):
        binding.launcher = "/usr/bin/python3"  # type: ignore[misc]
    assert check_pin(binding.pin(), state_dir=world["state"]) == binding
    assert check_pin(json.dumps(binding.pin()), state_dir=world["state"]) == binding


def test_pin_stays_valid_after_a_newer_deployment(world, tmp_path):
    """A job pinned to A keeps A: a newer verified C does not rebind or invalidate it."""
    pin = resolve_launcher("vibeqc", "cluster", expected_sha=SHA_A, state_dir=world["state"]).pin()
    path_c, sum_c = make_launcher(world["apps"], SHA_C)
    register(world["state"], "cluster", SHA_C, path_c, sum_c, "r-c", "2026-11-30T03:00:00Z")
    again = check_pin(pin, state_dir=world["state"])
    assert (again.launcher, again.latest) == (world["A"], False)


# -- the import path stays light ------------------------------------------------------


def _loaded(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_bindings_import_loads_nothing_heavy():
    mods = _loaded("import json, sys, vq_admin.bindings; print(json.dumps(sorted(sys.modules)))")
    assert "vq_admin.bindings" in mods
    assert [m for m in mods if m.split(".")[0] in HEAVY or m in HEAVY_OWN] == []


@pytest.mark.parametrize("host", ["cluster", "login2", "nowhere"])
def test_launcher_command_loads_nothing_heavy(world, host):
    """``vq admin launcher`` as the driver runs it: the modules of the whole process."""
    code = ("import json, sys\nfrom vq_admin.entry import main\n"
            f"rc = main(['launcher', 'vibeqc', {host!r}])\n"
            "print(json.dumps(sorted(sys.modules)))")
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(world["config"]), VQ_ADMIN_STATE_DIR=str(world["state"]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    mods = json.loads(done.stdout.splitlines()[-1])
    # The verb ran: its plain success through vq_admin.launcher.plain_lookup, anything else through the command.
    assert "vq_admin.commands.launcher" in mods or (host == "cluster" and "vq_admin.launcher.plain_lookup" in mods)
    assert [m for m in mods if m.split(".")[0] in HEAVY or m in HEAVY_OWN] == []


# -- end to end: a verified deployment feeds the registry -------------------------------


@pytest.mark.real
def test_verified_deployment_registers_exactly_its_launcher(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    sha_a = repo.commit("A")
    sha_bad = repo.commit("bad", {"vq_selftest.py": "raise SystemExit(1)\n"})
    root, scratch, state = tmp_path / "apps" / "vibeqc", tmp_path / "scratch", tmp_path / "state"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml",
                          site_example_host("cluster", root=root, repo=repo.path, scratch=scratch))
    ran = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha_a, "--cluster-install", "--json",
                 config=config, state=state)
    assert ran.exit_code == 0, ran.stderr
    receipt = ran.json()
    verified = receipt["verify"]["final"]["receipt"]
    done = run_vq("launcher", "vibeqc", "cluster", "--expected-sha", sha_a, config=config, state=state)
    assert (done.exit_code, done.stdout) == (0, verified["active_path"] + "\n")
    assert done.stdout == f"{root}/releases/{sha_a}/bin/vibeqc-{sha_a}\n"  # the generation's own launcher
    entry = json.loads(Path(registry.entry_path(state, "cluster", "vibeqc", sha_a)).read_text())
    assert (entry["launcher_sha256"], entry["receipt"]) == (verified["active_path_sha256"], receipt["id"])
    before = Path(registry.entry_path(state, "cluster", "vibeqc", sha_a)).read_bytes()
    again = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha_a, "--json", config=config, state=state)
    assert again.json()["outcome"] == "already-current"
    assert Path(registry.entry_path(state, "cluster", "vibeqc", sha_a)).read_bytes() == before
    failed = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha_bad, "--json", config=config, state=state)
    assert failed.exit_code == 1
    assert not Path(registry.entry_path(state, "cluster", "vibeqc", sha_bad)).exists()
    refused = run_vq("launcher", "vibeqc", "cluster", "--expected-sha", sha_bad, config=config, state=state)
    assert (refused.exit_code, refused.stdout) == (77, "") and "sha-mismatch" in refused.stderr
    sha_c = repo.commit("C")
    dry = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha_c, "--dry-run", config=config, state=state)
    assert dry.exit_code == 0
    assert not Path(registry.entry_path(state, "cluster", "vibeqc", sha_c)).exists()


# -- the benchmark runs (its figures and targets are met in bench/, never timed here) ---------


def test_bench_bindings_runs_and_reports_both_ratios():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    try:
        import bench_bindings
    finally:
        sys.path.pop(0)
    lookup, start = bench_bindings.main(["--entries", "200", "--rounds", "1", "--runs", "1"])
    assert lookup["unit"] == "us" and start["unit"] == "ms"
    for figure in (lookup, start):
        assert figure["baseline"] > 0 and figure["figure"] > 0 and figure["ratio"] > 0, figure


def test_pin_dispatched_through_an_alias_of_its_host(world):
    pin = resolve_launcher("vibeqc", "login2", expected_sha=SHA_A, state_dir=world["state"],
                           config_path=world["config"]).pin()
    assert pin["host"] == "cluster"
    done = vq(world, "launcher", "vibeqc", "login2", "--pin", json.dumps(pin))
    assert (done.exit_code, done.stdout) == (0, world["A"] + "\n"), done.stderr
