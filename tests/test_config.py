"""Every rule of CONTRACT section 3: a bad file exits 2 naming the dotted key."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import run_vq_inprocess, write_config
from vq_admin.config import ConfigError, parse_config

GOOD = {
    "hosts": {
        "cluster": {
            "fleet_role": "managed",
            "scratch_root": "/scratch/vq",
            "scheduler_runtime_deployments": {
                "vibeqc-release": {
                    "update_command": "/site/bin/deploy --flag 'two words'",
                    "verify_command": "/site/bin/verify",
                    "source_repo": "/srv/src/vibeqc",
                }
            },
        }
    }
}


def with_profile(**changes):
    data = {"hosts": {"cluster": dict(GOOD["hosts"]["cluster"])}}
    profile = dict(GOOD["hosts"]["cluster"]["scheduler_runtime_deployments"]["vibeqc-release"])
    for key, value in changes.items():
        if value is None:
            profile.pop(key, None)
        else:
            profile[key] = value
    data["hosts"]["cluster"]["scheduler_runtime_deployments"] = {"vibeqc-release": profile}
    return data


def with_host(**changes):
    host = dict(GOOD["hosts"]["cluster"])
    for key, value in changes.items():
        if value is None:
            host.pop(key, None)
        else:
            host[key] = value
    return {"hosts": {"cluster": host}}


P = "hosts.cluster.scheduler_runtime_deployments.vibeqc-release"

BAD = [
    (with_profile(update_host="build", update_allocation={"sbatch_args": []}), f"{P}.update_allocation",
     "mutually exclusive"),
    (with_profile(timeout_seconds=0), f"{P}.timeout_seconds", "finite positive"),
    (with_profile(timeout_seconds=-5), f"{P}.timeout_seconds", "finite positive"),
    (with_profile(timeout_seconds=float("inf")), f"{P}.timeout_seconds", "finite positive"),
    (with_profile(timeout_seconds=float("nan")), f"{P}.timeout_seconds", "finite positive"),
    (with_profile(timeout_seconds=True), f"{P}.timeout_seconds", "finite positive"),
    (with_profile(verify_timeout_seconds="600"), f"{P}.verify_timeout_seconds", "finite positive"),
    (with_host(helper_timeout_seconds=0), "hosts.cluster.helper_timeout_seconds", "finite positive"),
    (with_profile(source_repo="relative/path"), f"{P}.source_repo", "absolute"),
    (with_profile(feed_source_mirror="git/mirror.git"), f"{P}.feed_source_mirror", "absolute"),
    (with_host(scratch_root="scratch"), "hosts.cluster.scratch_root", "absolute"),
    (with_host(helper_source_repo="/srv/../etc"), "hosts.cluster.helper_source_repo", ".."),
    (with_host(helper_source_repo="/srv/git/.."), "hosts.cluster.helper_source_repo", ".."),
    (with_profile(source_repo="/srv//..//etc"), f"{P}.source_repo", ".."),
    (with_profile(update_command=""), f"{P}.update_command", "empty"),
    (with_profile(update_command="   "), f"{P}.update_command", "empty"),
    (with_profile(update_command="/bin/a\n/bin/b"), f"{P}.update_command", "one line"),
    (with_profile(update_command="/bin/deploy 'unbalanced"), f"{P}.update_command", "cannot be split"),
    (with_profile(verify_command=["/bin/verify"]), f"{P}.verify_command", "one line"),
    (with_profile(update_command=None), f"{P}.update_command", "required"),
    (with_profile(verify_command=None), f"{P}.verify_command", "required"),
    (with_profile(source_repo=None), f"{P}.source_repo", "required"),
    (with_profile(provider="../evil"), f"{P}.provider", "entry-point name"),
    (with_profile(provider_options={"root": "/apps"}), f"{P}.provider_options", "plugin providers"),
    (with_profile(update_allocation={"sbatch_args": ["script.sh"]}), f"{P}.update_allocation.sbatch_args",
     "sbatch option"),
    (with_profile(update_allocation={"sbatch_args": ["--wait"]}), f"{P}.update_allocation.sbatch_args",
     "set by vq-admin"),
    (with_profile(update_allocation={"sbatch_args": "--time=1"}), f"{P}.update_allocation.sbatch_args",
     "list of strings"),
    (with_profile(update_allocation={"partition": "x"}), f"{P}.update_allocation.partition", "unknown key"),
    (with_profile(update_host="-oProxyCommand=x"), f"{P}.update_host", "ssh destination"),
    (with_profile(lane="main..x"), f"{P}.lane", "branch name"),
    (with_profile(preparer_reads="tip"), f"{P}.preparer_reads", "one of lane, pin"),
    (with_profile(prepare_command="/site/bin/prep"), f"{P}.prepare_command", "feed_source_mirror"),
    (with_profile(unknown_key=1), f"{P}.unknown_key", "unknown key"),
    (with_host(fleet_role=None), "hosts.cluster.fleet_role", "required"),
    (with_host(fleet_role="boss"), "hosts.cluster.fleet_role", "one of"),
    (with_host(transport="rsh"), "hosts.cluster.transport", "one of ssh, local"),
    (with_host(scheduler="pbs"), "hosts.cluster.scheduler", "one of slurm"),
    (with_host(ssh="-F/etc/passwd"), "hosts.cluster.ssh", "ssh destination"),
    (with_host(canonical_host="other"), "hosts.cluster.canonical_host", "only allowed"),
    (with_host(fleet_role="alias"), "hosts.cluster.canonical_host", "required"),
    (with_host(fleet_role="alias", canonical_host="nowhere"), "hosts.cluster.canonical_host", "not a host"),
    (with_host(typo_key="x"), "hosts.cluster.typo_key", "unknown key"),
    (with_host(helper_update_host="build"), "hosts.cluster.helper_update_host", "helper_update_command"),
    ({"hosts": {"bad host": {"fleet_role": "managed"}}}, "hosts.bad host", "must match"),
    ({"hosts": {"cluster": {"fleet_role": "managed", "scheduler_runtime_deployments": {"bad/prog": {}}}}},
     "hosts.cluster.scheduler_runtime_deployments.bad/prog", "must match"),
    ({"hosts": {"cluster": {"fleet_role": "managed"}}, "extra": 1}, "extra", "unknown key"),
    ({"ssh_config": "ssh_config", "hosts": {}}, "ssh_config", "absolute"),
    ({"hosts": {"cluster": dict(with_profile(feed_source_mirror="/srv/git/m.git")["hosts"]["cluster"],
                                ssh="login:2222")}},
     "hosts.cluster.ssh", "git cannot use"),
    ({"hosts": []}, "hosts", "table"),
]


def test_the_good_file_parses_with_words_split_like_a_shell():
    config = parse_config(GOOD)
    profile = config.hosts["cluster"].runtimes["vibeqc-release"]
    assert profile.update_command == ("/site/bin/deploy", "--flag", "two words")
    assert profile.build_place == "login-host"
    assert config.hosts["cluster"].ssh == "cluster"


@pytest.mark.parametrize("data,key,reason", BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_every_rule_names_the_dotted_key(data, key, reason):
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert caught.value.key == key
    assert reason in caught.value.reason
    assert str(caught.value).startswith(key)


def test_alias_must_not_point_at_an_alias():
    data = {"hosts": {"a": {"fleet_role": "alias", "canonical_host": "b"},
                      "b": {"fleet_role": "alias", "canonical_host": "a"}}}
    with pytest.raises(ConfigError, match="itself an alias"):
        parse_config(data)


def test_cli_check_exits_2_naming_the_key(tmp_path):
    config = write_config(tmp_path / "admin.toml", """
        [hosts.cluster]
        fleet_role = "managed"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/bin/true"
        verify_command = "/bin/true"
        source_repo = "/srv/src"
        timeout_seconds = -1
    """)
    result = run_vq_inprocess("check", config=config)
    assert result.exit_code == 2
    assert "hosts.cluster.scheduler_runtime_deployments.vibeqc.timeout_seconds" in result.stderr
    assert "Traceback" not in result.stderr
    as_json = run_vq_inprocess("check", "--json", config=config)
    assert as_json.exit_code == 2
    assert as_json.json()["outcome"] == "usage"


def test_cli_refuses_a_config_writable_by_others(tmp_path):
    config = write_config(tmp_path / "admin.toml", '[hosts.cluster]\nfleet_role = "managed"\n')
    config.chmod(0o666)
    result = run_vq_inprocess("check", config=config)
    assert result.exit_code == 2
    assert str(config) in result.stderr and "writable" in result.stderr


def test_cli_check_accepts_a_valid_file(tmp_path):
    config = write_config(tmp_path / "admin.toml", """
        [hosts.cluster]
        fleet_role = "managed"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/bin/true"
        verify_command = "/bin/true"
        source_repo = "/srv/src"
    """)
    result = run_vq_inprocess("check", "--json", config=config)
    assert result.exit_code == 0, result.stderr
    assert result.json()["valid"] is True


def test_unparseable_toml_is_a_usage_error(tmp_path):
    config = write_config(tmp_path / "admin.toml", "[hosts.cluster\nfleet_role = ")
    result = run_vq_inprocess("check", config=config)
    assert result.exit_code == 2 and "not valid TOML" in result.stderr


# -- hypothesis: arbitrary documents never produce a traceback -------------------------

KEYS = sorted({"fleet_role", "transport", "ssh", "canonical_host", "scheduler", "scratch_root", "agent",
               "helper_update_command", "helper_source_repo", "helper_timeout_seconds", "provider",
               "update_command", "install_command", "verify_command", "update_host", "update_allocation",
               "timeout_seconds", "source_repo", "feed_source_mirror", "lane", "prepare_command",
               "preparer_reads", "provider_options", "sbatch_args", "x"})
scalars = st.one_of(st.text(max_size=20), st.integers(), st.floats(allow_nan=True), st.booleans(),
                    st.sampled_from(["managed", "alias", "ssh", "local", "/abs/path", "rel", "slurm", "lane", "pin"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=12)
profiles = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)
hosts = st.dictionaries(st.sampled_from(KEYS),
                        st.one_of(values, st.dictionaries(st.text(max_size=8), profiles, max_size=2)), max_size=8)
documents = st.fixed_dictionaries({"hosts": st.dictionaries(st.text(max_size=10), hosts, max_size=3)})


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_fuzzed_configurations_parse_or_name_a_key(data):
    try:
        parse_config(data)
    except ConfigError as exc:
        assert exc.reason
    # anything else propagates and fails the test


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzzed_bytes_are_toml_errors_or_configs(raw):
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return
    try:
        parse_config(data)
    except ConfigError:
        pass
