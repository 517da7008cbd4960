"""Words of a command line (docs/security.md): every word from input that lands in an argv is refused by
the one name rule or placed after ``--``; no process is started to find out."""

from __future__ import annotations

import msgspec
import pytest

from vq_admin.core.identifiers import JOB_ID_RE
from vq_admin.document import FullSha, Sha256
from vq_admin.launcher.references import QueuedJob
from vq_admin.record.statement import DRIVER_ID_RE, DriverId

#: Values an inventory, a configuration file or a scheduler's output could hand vq-admin.
HOSTILE = ["-oProxyCommand=touch /tmp/pwned", "--all", "-x", "a\n", "a\nb", "a\0b", "x" * 120_000, ""]

SHA = "a" * 40


# -- the patterns a document is checked with: anchored, so a trailing newline never passes ----------------

@pytest.mark.parametrize(("kind", "good"), [(FullSha, SHA), (Sha256, "b" * 64), (DriverId, "u@h/0123abcd")])
def test_document_patterns_refuse_a_trailing_newline(kind, good):
    assert msgspec.convert(good, kind) == good
    for bad in (good + "\n", "\n" + good, good + "\0"):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, kind)
    assert not DRIVER_ID_RE.match("u@h/0123abcd\n")


@pytest.mark.parametrize("job_id", ["12\n", "-1", "--all", "١٢", "12;x", "", "1" * 21, "12 13"])
def test_a_job_id_is_ascii_digits_only(job_id):
    assert not JOB_ID_RE.match(job_id)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": job_id, "display": job_id, "state": "PENDING", "user": "u"}, QueuedJob)


def test_sbatch_parsable_and_the_census_share_the_job_id_rule():
    from vq_admin.agent import census, slurmjob

    assert slurmjob.PARSABLE_RE.match("123;cluster").group(1) == "123"
    assert not slurmjob.PARSABLE_RE.match("١٢٣")
    token = "\x1f"
    good = ["12", "12", "PENDING", "u", "2026-01-01T00:00:00", "1"] + ["x"] * (len(census.FIELDS) - 6)
    assert census._listing(("".join(f + token for f in good)).encode(), token)
    for job in ("١٢", "-1", "12\n"):
        fields = [job, *good[1:]]
        with pytest.raises(census.CensusFailed):
            census._listing(("".join(f + token for f in fields)).encode(), token)


# -- configuration strings: one line, bounded, never an option where they start a command ------------------

def _host(**keys):
    profile = {"update_command": "/site/bin/deploy", "verify_command": "/site/bin/verify", "source_repo": "/srv/src"}
    profile.update(keys.pop("profile", {}))
    return {"hosts": {"cluster": {"fleet_role": "managed", **keys, "scheduler_runtime_deployments": {"p": profile}}}}


CONFIG_WORDS = [  # (where the value goes, the configuration holding it)
    ("hosts.cluster.ssh", lambda v: _host(ssh=v)),
    ("hosts.cluster.helper_update_host", lambda v: _host(helper_update_host=v, helper_update_command="/b/up")),
    ("hosts.cluster.agent", lambda v: _host(agent=v)),
    ("hosts.cluster.helper_update_command", lambda v: _host(helper_update_command=v)),
    ("hosts.cluster.scheduler_runtime_deployments.p.update_command", lambda v: _host(profile={"update_command": v})),
    ("hosts.cluster.scheduler_runtime_deployments.p.update_host", lambda v: _host(profile={"update_host": v})),
    ("hosts.cluster.scheduler_runtime_deployments.p.source_repo", lambda v: _host(profile={"source_repo": v})),
    ("hosts.cluster.scheduler_runtime_deployments.p.lane", lambda v: _host(profile={"lane": v})),
    ("hosts.cluster.scratch_root", lambda v: _host(scratch_root=v)),
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(("where", "config"), CONFIG_WORDS, ids=[w for w, _ in CONFIG_WORDS])
def test_a_hostile_configuration_string_is_refused_naming_its_key(where, config, value):
    from vq_admin.config import ConfigError, parse_config

    if where.endswith(("source_repo", "scratch_root")) and value in ("x" * 120_000,):
        value = "/" + value  # an absolute path, refused for its length alone
    with pytest.raises(ConfigError) as refused:
        parse_config(config(value))
    assert refused.value.key == where


def test_a_long_path_is_refused_for_its_length():
    from vq_admin.config import MAX_STRING, ConfigError, parse_config

    parse_config(_host(scratch_root="/" + "x" * (MAX_STRING - 1)))
    with pytest.raises(ConfigError, match=f"at most {MAX_STRING}"):
        parse_config(_host(scratch_root="/" + "x" * MAX_STRING))


# -- the fleet's worker command line: each value attached to its option ------------------------------------

@pytest.mark.parametrize("value", ["--all", "-oProxyCommand=x", "--dry-run", "-"])
def test_a_fleet_worker_reads_each_value_as_the_value_not_an_option(value):
    from types import SimpleNamespace

    from vq_admin.cli import build_parser
    from vq_admin.fleet import Rollout

    args = SimpleNamespace(cluster_install=False, wait_lock=None, config=value, state_dir=value)
    rollout = SimpleNamespace(program="vibeqc", sha=SHA, tag=value, args=args, dry_run=False)
    argv = Rollout.worker_argv(rollout, "cluster")  # type: ignore[arg-type]
    parsed = build_parser().parse_args(argv)
    assert (parsed.config, parsed.state_dir, parsed.tag, parsed.expected_sha) == (value, value, value, SHA)
    assert parsed.targets == ["vibeqc", "cluster"] and not parsed.dry_run
