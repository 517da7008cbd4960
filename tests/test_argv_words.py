"""Words of a command line (docs/security.md): every word from input that lands in an argv is refused by
the one name rule or placed after ``--``; no process is started to find out."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

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



# -- the builders: a hostile word is refused, or lands after "--"; nothing is started to find out ---------

@pytest.fixture
def no_process(monkeypatch):
    """Any attempt to start a process fails the test."""
    import os
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[:2]!r}")

    for owner, name in ((subprocess, "Popen"), (os, "posix_spawn"), (os, "execv"), (os, "execvpe"), (os, "fork")):
        monkeypatch.setattr(owner, name, refuse)


def after_dashes(argv, word):
    """True when *word* is in *argv* after its first ``--``."""
    return "--" in argv and word in argv[argv.index("--") + 1:]


@pytest.mark.parametrize("value", HOSTILE)
def test_the_ssh_transport_refuses_a_destination_that_is_not_one(value, no_process):
    from vq_admin.ssh.transport import SshTransport

    with pytest.raises(ValueError, match="bad ssh destination"):
        SshTransport(value, None, None)


def test_the_ssh_transport_puts_the_destination_after_dashes(no_process):
    from vq_admin.ssh.argv import master_argv
    from vq_admin.ssh.transport import SshTransport

    ssh = SshTransport("ops@login-1", "/etc/vq/ssh_config", "/tmp/vqssh-1-x")
    for argv in (ssh.describe_argv(["--all", "-x"], {"A": "-b"}), ssh.master_wrap(["vq-admin-agent", "session"]),
                 master_argv(None, None, True, "ops@login-1", ["--all"])):
        assert argv[argv.index("--") + 1] == "ops@login-1", argv
        assert argv.index("--") == len(argv) - 3  # "--", the destination, the one remote command line


@pytest.mark.parametrize("value", HOSTILE)
def test_the_launcher_read_back_refuses_a_hostile_destination(value, no_process, monkeypatch):
    from vq_admin.launcher import profile_view
    from vq_admin.ssh import effective

    monkeypatch.setattr(effective, "problem", lambda *a: None)
    with pytest.raises(profile_view.ConfigUnavailable):
        profile_view.hash_argv({"ssh": value}, {}, "cluster", "/opt/vibeqc/bin/vibeqc")
    argv = profile_view.hash_argv({"ssh": "login-1"}, {}, "cluster", "/opt/vibeqc/bin/vibeqc")
    assert after_dashes(argv, "login-1") and argv[argv.index("--") + 1] == "login-1"


@pytest.mark.parametrize("value", ["-oProxyCommand=x", "--all", "a:b", "refs/x y"])
def test_git_puts_the_mirror_url_after_dashes_and_refuses_a_destination_it_cannot(value, no_process):
    from vq_admin.config import ConfigError
    from vq_admin.source import archive_argv, mirror
    from vq_admin.ssh.transport import SshTransport

    pushed = mirror.push_argv("/srv/src", "login-1:/srv/mirror.git", [(SHA, "refs/vq/pins/" + SHA)])
    assert after_dashes(pushed, "login-1:/srv/mirror.git")
    listed = mirror.read_argv("/srv/src", mirror.mirror_for(SshTransport("login-1", None, None), "/srv/m.git"), [])
    assert after_dashes(listed, "login-1:/srv/m.git")
    archived = archive_argv("/srv/src", SHA, "/tmp/w")
    assert archived[archived.index("--end-of-options") + 1] == SHA
    with pytest.raises(ValueError):
        mirror.refspec(SHA, value)
    if value == "a:b":  # a destination git would read as its url's host and path
        with pytest.raises(ConfigError):
            mirror.mirror_for(SshTransport(value, None, None), "/srv/m.git")


def _module_utils():
    import importlib.util

    spec = importlib.util.spec_from_file_location("vq_module_utils", ROOT / "ansible/plugins/module_utils/vq_admin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Failed(Exception):
    pass


class FakeModule:
    """An AnsibleModule that fails as Ansible does and refuses to run anything."""

    def __init__(self, **params):
        self.params = {"vq": "/bin/true", "config": None, "state_dir": None, "program": None, **params}

    def fail_json(self, msg, **kwargs):
        raise Failed(msg)

    def run_command(self, argv):
        raise AssertionError(f"the module ran {argv!r}")


@pytest.mark.parametrize("value", HOSTILE[:-1])
def test_the_ansible_module_refuses_an_option_shaped_host_before_anything_runs(value):
    vq_admin = _module_utils()
    for params in ({"host": value}, {"host": "alpha", "program": value}):
        with pytest.raises(Failed, match="is not a name|host is required"):
            vq_admin.Vq(FakeModule(**params))


def test_the_ansible_module_attaches_each_value_and_puts_the_targets_after_dashes():
    vq_admin = _module_utils()
    words = vq_admin.lane_words({"expected_sha": "--all", "tag": "-x", "wait_lock": 5}, "vibeqc", "alpha")
    assert words == ["update", "--expected-sha=--all", "--tag=-x", "--wait-lock=5", "--", "vibeqc", "alpha"]


# -- the audit: every place shipped code starts a process has a row in docs/security.md -------------------

ROOT = Path(__file__).resolve().parent.parent
#: What starts a process: the standard library's starters and the two runners' entry points.
STARTER_RE = re.compile(
    r"(?<![\w.])(subprocess\.(?:run|Popen|call|check_call|check_output|getoutput|getstatusoutput)"
    r"|os\.(?:exec[lv]p?e?|posix_spawnp?|fork|forkpty|system|popen|spawn[lv]p?e?)"
    r"|(?:asyncio\.)?create_subprocess_(?:exec|shell)|pty\.spawn|(?:self\.)?module\.run_command"
    r"|process\.(?:run|spawn|output)|spawn\.(?:run_captured|start)|run_captured)\(")
#: Each starter's call sites per file, as audited in docs/security.md ("Words of a command line"), and the
#: name its row there gives the file.
AUDITED = {
    ("ansible/plugins/module_utils/vq_admin.py", "self.module.run_command"): (1, "module_utils/vq_admin.py"),
    ("site_example/vq_site_example/build.py", "subprocess.Popen"): (1, "`build.py`"),
    ("site_example/vq_site_example/confirm.py", "subprocess.run"): (1, "`confirm.py`"),
    ("site_example/vq_site_example/helper_update.py", "subprocess.run"): (1, "`helper_update.py`"),
    ("vq_admin/agent/allocation.py", "os.execvpe"): (1, "agent `allocation.py` job"),
    ("vq_admin/agent/census.py", "spawn.run_captured"): (1, "agent `census.py`"),
    ("vq_admin/agent/cli.py", "run_captured"): (1, "agent `cli.py`"),
    ("vq_admin/agent/confirm.py", "spawn.run_captured"): (1, "`confirm.py` (`spawn.run_captured`)"),
    ("vq_admin/agent/detached.py", "spawn.start"): (1, "`detached.py`"),
    ("vq_admin/agent/detached.py", "os.fork"): (2, "`detached.py`"),
    ("vq_admin/agent/slurmjob.py", "spawn.run_captured"): (1, "agent `slurmjob.py`"),
    ("vq_admin/agent/slurmjob.py", "spawn.start"): (1, "run by `slurmjob.py` (`spawn.start`)"),
    ("vq_admin/agent/spawn.py", "subprocess.Popen"): (2, "agent `spawn.py`"),
    ("vq_admin/agent/spawn.py", "os.posix_spawn"): (1, "agent `spawn.py`"),
    ("vq_admin/agent/verify_readback.py", "spawn.run_captured"): (1, "`verify_readback.py`"),
    ("vq_admin/conformance/world.py", "subprocess.call"): (2, "`conformance/world.py`"),
    ("vq_admin/conformance/world.py", "process.output"): (1, "`conformance/world.py`"),
    ("vq_admin/conformance/world.py", "process.run"): (1, "`conformance/world.py`"),
    ("vq_admin/core/agentjudge.py", "subprocess.run"): (1, "`core/agentjudge.py`"),
    ("vq_admin/core/agentjudge.py", "os.execv"): (1, "`core/agentjudge.py`"),
    ("vq_admin/demo.py", "process.output"): (1, "`demo.py`"),
    ("vq_admin/demo.py", "process.run"): (1, "`demo.py`"),
    ("vq_admin/fleet.py", "os.fork"): (1, "`fleet.py`"),
    ("vq_admin/lanes/allocation_stream.py", "process.run"): (1, "`lanes/allocation_stream.py`"),
    ("vq_admin/launcher/profile_view.py", "process.run"): (1, "`launcher/profile_view.py`"),
    ("vq_admin/lease.py", "process.spawn"): (2, "`lease.py`"),
    ("vq_admin/record/signing.py", "process.run"): (3, "`record/signing.py`"),
    ("vq_admin/ssh/early_session.py", "process.spawn"): (1, "`ssh/early_session.py`"),
    ("vq_admin/ssh/effective.py", "process.run"): (1, "`ssh/effective.py`"),
    ("vq_admin/ssh/process.py", "subprocess.Popen"): (2, "`ssh/process.py`"),
    ("vq_admin/ssh/transport.py", "process.run"): (2, "`ssh/transport.py`"),
}


def starters() -> Counter[tuple[str, str]]:
    """Each starter's call sites per shipped Python file (comments and ``def`` lines aside)."""
    found: Counter[tuple[str, str]] = Counter()
    for top in ("vq_admin", "hookspecs", "site_example", "ansible/plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for line in path.read_text(encoding="utf-8").splitlines():
                code = line.split("#", 1)[0]
                if not code.lstrip().startswith(("def ", '"', "'", ":")):
                    found.update((str(path.relative_to(ROOT)), m.group(1)) for m in STARTER_RE.finditer(code))
    return found


def test_every_process_starter_in_shipped_code_is_audited():
    found = starters()
    audited = Counter({key: count for key, (count, _) in AUDITED.items()})
    assert found == audited, ("a process starter was added, moved or removed: give it a row in docs/security.md "
                              f"('Words of a command line') and here; new {found - audited}, gone {audited - found}")


def test_each_audited_file_has_its_row_in_security_md():
    text = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    section = text.split("## Words of a command line", 1)[1].split("\n## ", 1)[0]
    missing = sorted({name for _, name in AUDITED.values() if name not in section})
    assert not missing, f"docs/security.md 'Words of a command line' has no row naming {missing}"
