"""Every verb reads the configuration the same way (issue 23): ``--config`` and
``VQ_ADMIN_CONFIG`` for all; a missing or invalid configuration is exit 2; a
HOST the configuration does not name is exit 2 listing the configured hosts;
a usage error never replaces the last run's record (``last.json``).
"""

from __future__ import annotations

import pytest

from support import AGENT, GitRepo, run_vq_inprocess, write_config
from vq_admin.state.records import LastRun, StateDir

SHA = "a" * 40
#: Every verb that reads the configuration, with its operands naming host ``cluster`` (and program ``toyrt``).
EVERY_VERB = {
    "status": ["status"], "status-all": ["status", "--all"], "history": ["history"], "providers": ["providers"],
    "check": ["check"], "launcher": ["launcher", "toyrt", "cluster"], "references": ["references", "toyrt", "cluster"],
    "rollback": ["rollback", "toyrt", "cluster"], "prune": ["prune", "toyrt", "cluster"],
    "update": ["update", "toyrt", "cluster", "--expected-sha", SHA], "update-helper": ["update", "cluster"],
}
#: The verbs that take a HOST, naming ``clustr`` (a typo).
WITH_HOST = {
    "status": ["status", "clustr"], "history": ["history", "clustr"], "launcher": ["launcher", "toyrt", "clustr"],
    "references": ["references", "toyrt", "clustr"], "rollback": ["rollback", "toyrt", "clustr"],
    "prune": ["prune", "toyrt", "clustr"], "update": ["update", "toyrt", "clustr", "--expected-sha", SHA],
    "update-helper": ["update", "clustr"],
}


@pytest.fixture
def site(tmp_path):
    """A configuration naming host ``cluster`` (program ``toyrt``, and ``typo`` whose provider_options
    misspell ``root``), and a state directory holding the last run's record of each."""
    repo = GitRepo(tmp_path / "repo").path
    config = write_config(tmp_path / "admin.toml", f"""\
        [hosts.cluster]
        fleet_role = "managed"
        transport = "local"
        agent = "{AGENT}"
        helper_update_command = "/bin/true"
        helper_source_repo = "{repo}"

        [hosts.cluster.scheduler_runtime_deployments.toyrt]
        update_command = "/bin/true"
        verify_command = "/bin/true"
        source_repo = "{repo}"

        [hosts.cluster.scheduler_runtime_deployments.typo]
        provider = "site_example"
        provider_options = {{ rot = "{tmp_path / 'apps'}" }}
        source_repo = "{repo}"
        """)
    state = StateDir(tmp_path / "state")
    for program in ("toyrt", "typo"):
        state.record_run("runtime", "cluster", program, LastRun(outcome="ok", exit_code=0, expected_sha=SHA,
                                                                receipt="r-earlier", at="2026-11-30T00:00:00Z"), None)
    return config, state


def last_records(state: StateDir) -> dict[str, bytes]:
    return {str(p.relative_to(state.root)): p.read_bytes() for p in sorted(state.root.rglob("last*.json"))}


@pytest.mark.parametrize("verb", EVERY_VERB)
@pytest.mark.parametrize("fault", ["missing", "not TOML"])
def test_a_missing_or_invalid_configuration_is_a_usage_error_for_every_verb(tmp_path, site, verb, fault):
    _, state = site
    bad = tmp_path / "bad.toml"
    if fault == "not TOML":
        write_config(bad, "hosts = [[[\n")
    before = last_records(state)
    done = run_vq_inprocess(*EVERY_VERB[verb], config=bad, state=state.root)
    assert done.exit_code == 2, done.stdout + done.stderr
    assert any(why in done.stderr for why in (("does not exist", "No such file") if fault == "missing"
                                              else ("is not valid TOML",))), done.stderr
    assert last_records(state) == before


@pytest.mark.parametrize("verb", WITH_HOST)
def test_an_unknown_host_is_a_usage_error_naming_the_configured_hosts(site, verb):
    config, state = site
    before = last_records(state)
    done = run_vq_inprocess(*WITH_HOST[verb], config=config, state=state.root)
    assert done.exit_code == 2, done.stdout + done.stderr
    assert "host 'clustr' is not in the configuration" in done.stderr and "(hosts: cluster)" in done.stderr
    assert last_records(state) == before
    assert not (state.root / "hosts" / "clustr").exists()


@pytest.mark.parametrize("verb", ["launcher", "references", "rollback", "prune"])
def test_a_program_the_host_has_no_profile_for_is_a_usage_error_naming_its_profiles(site, verb):
    config, state = site
    before = last_records(state)
    done = run_vq_inprocess(verb, "toyrx", "cluster", config=config, state=state.root)
    assert done.exit_code == 2 and "no scheduler_runtime_deployments.toyrx profile (profiles: toyrt, typo)" \
        in done.stderr, done.stderr
    assert last_records(state) == before


def test_a_configured_program_without_evidence_is_refused_by_the_launcher(site):
    config, state = site
    unverified = run_vq_inprocess("launcher", "toyrt", "cluster", config=config, state=state.root)
    assert unverified.exit_code == 77 and "refused (no-evidence)" in unverified.stderr  # configured, not verified


@pytest.mark.parametrize("verb", ["status", "history", "providers"])
def test_the_config_option_wins_over_the_environment(tmp_path, site, verb):
    config, state = site
    bad = write_config(tmp_path / "bad.toml", "hosts = [[[\n")
    assert run_vq_inprocess(verb, "--config", str(config), config=bad, state=state.root).exit_code == 0
    assert run_vq_inprocess(verb, "--config", str(bad), config=config, state=state.root).exit_code == 2
    shown = run_vq_inprocess("status", "cluster", "--json", "--config", str(config), config=bad, state=state.root)
    assert shown.json()["hosts"]["cluster"]["runtimes"]["toyrt"]["last"]["receipt"] == "r-earlier"


def test_a_provider_options_typo_names_the_key_and_keeps_the_last_record(site):
    config, state = site
    sha = GitRepo(config.parent / "repo").commit("one")
    before = last_records(state)
    message = "provider_options.rot: unknown key; site_example takes root, command"
    done = run_vq_inprocess("update", "typo", "cluster", "--expected-sha", sha, config=config, state=state.root)
    assert done.exit_code == 2 and message in done.stderr, done.stderr
    assert last_records(state) == before  # status still shows the earlier run as the last one
    status = run_vq_inprocess("status", "cluster", "--json", config=config, state=state.root)
    assert status.json()["hosts"]["cluster"]["runtimes"]["typo"]["last"]["receipt"] == "r-earlier"
    checked = run_vq_inprocess("check", config=config, state=state.root)
    assert checked.exit_code == 2 and message in checked.stderr
