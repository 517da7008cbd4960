"""``vq admin status --prometheus`` and ``--textfile PATH`` (CONTRACT 11): the state of
real runs as the Prometheus text exposition format, read back with
``prometheus_client``'s own parser."""

from __future__ import annotations

import calendar
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from support import GitRepo, run_vq, run_vq_inprocess, site_example_host, write_config
from vq_admin.cli import build_parser, parse

ROOT = Path(__file__).resolve().parents[1]


def samples(text: str) -> dict[str, list]:
    """Metric family name -> its samples; every family has HELP and TYPE."""
    families = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP"
        assert family.type == "gauge", f"{family.name} is {family.type}"
        families[family.name] = family.samples
    for name in families:
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text
    return families


def one(families, name: str, **labels) -> float:
    found = [s.value for s in families[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def epoch(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


@pytest.fixture
def site(tmp_path):
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    (tmp_path / "scratch").mkdir()
    config = write_config(tmp_path / "admin.toml", site_example_host("cluster", root=tmp_path / "apps",
                                                                     repo=repo.path, scratch=tmp_path / "scratch"))
    return tmp_path, config, tmp_path / "state", sha


def test_metrics_of_real_runs(site):
    tmp, config, state, sha = site
    first = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", "--json",
                   config=config, state=state)
    assert first.exit_code == 0, first.stderr
    receipt = first.json()
    result = run_vq_inprocess("status", "--prometheus", config=config, state=state)
    assert result.exit_code == 0, result.stderr
    families = samples(result.stdout)
    labels = {"host": "cluster", "program": "vibeqc", "lane": "runtime"}
    assert one(families, "vq_admin_last_outcome", outcome="ok", **labels) == 1
    assert [s.labels["outcome"] for s in families["vq_admin_last_outcome"]] == ["ok"]
    assert one(families, "vq_admin_last_exit_code", **labels) == 0
    assert one(families, "vq_admin_last_run_timestamp_seconds", **labels) == epoch(receipt["finished_at"])
    ok_at = one(families, "vq_admin_last_ok_timestamp_seconds", **labels)
    assert ok_at == epoch(receipt["finished_at"])
    assert one(families, "vq_admin_last_run_duration_seconds", **labels) == (
        epoch(receipt["finished_at"]) - epoch(receipt["started_at"]))
    assert not families.get("vq_admin_transcript_complete"), "a fixed-host build has no allocation transcript"

    # A refused run (a commit the checkout lacks) moves the outcome and the run timestamp, not LAST OK's.
    bad = run_vq("update", "vibeqc", "cluster", "--expected-sha", "f" * 40, "--json", config=config, state=state)
    assert bad.exit_code == 77, bad.stderr
    families = samples(run_vq_inprocess("status", "--prometheus", config=config, state=state).stdout)
    assert one(families, "vq_admin_last_outcome", **labels) == 1
    assert [s.labels["outcome"] for s in families["vq_admin_last_outcome"]] == ["refused"]
    assert one(families, "vq_admin_last_exit_code", **labels) == 77
    assert one(families, "vq_admin_last_run_timestamp_seconds", **labels) == epoch(bad.json()["finished_at"]) >= ok_at
    assert one(families, "vq_admin_last_ok_timestamp_seconds", **labels) == ok_at

    # every lookup's use, per generation, with the time of the last one
    for job in ("1", "2", None):
        assert run_vq("launcher", "vibeqc", "cluster", *(["--job", job] if job else []), config=config,
                      state=state).exit_code == 0
    families = samples(run_vq_inprocess("status", "--prometheus", config=config, state=state).stdout)
    assert one(families, "vq_admin_runtime_uses", host="cluster", program="vibeqc", sha=sha) == 3
    assert 0 <= time.time() - one(families, "vq_admin_runtime_last_use_timestamp_seconds", sha=sha) < 600

    # HOST narrows, as for the table and --json.
    assert run_vq_inprocess("status", "elsewhere", "--prometheus", config=config, state=state).stdout.count("{") == 0


def named(tmp_path, *hosts: str):
    """A configuration naming *hosts* (status reads it, as every verb)."""
    return write_config(tmp_path / "admin.toml", "".join(f'[hosts.{h}]\nfleet_role = "managed"\n' for h in hosts))


def test_helper_lane_has_an_empty_program_label(tmp_path):
    from vq_admin.state.records import LastRun, StateDir

    StateDir(tmp_path).record_run("helper", "login", None, LastRun(outcome="refused", exit_code=77,
                                                                   at="2026-11-30T10:00:00Z"), None)
    families = samples(run_vq_inprocess("status", "--prometheus", state=tmp_path, config=named(tmp_path)).stdout)
    assert one(families, "vq_admin_last_outcome", host="login", lane="helper", program="", outcome="refused") == 1


def test_textfile_is_written_atomically_and_nothing_is_printed(site):
    tmp, config, state, sha = site
    assert run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", config=config,
                  state=state).exit_code == 0
    collector = tmp / "textfile"
    collector.mkdir(mode=0o755)
    target = collector / "vq_admin.prom"
    target.write_text("stale\n")
    before = target.stat().st_ino
    result = run_vq_inprocess("status", "--textfile", str(target), config=config, state=state)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and result.stderr == ""
    assert sorted(p.name for p in collector.iterdir()) == ["vq_admin.prom"], "a temp file was left behind"
    assert target.stat().st_ino != before, "the file was rewritten in place, not replaced by rename"
    families = samples(target.read_text())
    assert one(families, "vq_admin_last_outcome", host="cluster", outcome="ok") == 1
    both = run_vq_inprocess("status", "--prometheus", "--textfile", str(target), config=config, state=state)
    assert both.exit_code == 0 and samples(both.stdout).keys() == families.keys()


def test_textfile_rules(tmp_path):
    state, config = tmp_path / "state", named(tmp_path)
    wrong = run_vq_inprocess("status", "--textfile", str(tmp_path / "vq.txt"), state=state, config=config)
    assert wrong.exit_code == 2 and ".prom" in wrong.stderr
    missing = run_vq_inprocess("status", "--textfile", str(tmp_path / "nowhere" / "vq.prom"), state=state,
                               config=config)
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others could plant a link at the predictable temp name
    unsafe = run_vq_inprocess("status", "--textfile", str(shared / "vq.prom"), state=state, config=config)
    assert unsafe.exit_code == 77, unsafe.stderr
    assert str(shared) in unsafe.stderr and "0777" in unsafe.stderr
    assert list(shared.iterdir()) == []
    both = run_vq_inprocess("status", "--prometheus", "--json", state=state, config=config)
    assert both.exit_code == 2 and both.json()["outcome"] == "usage"


def test_empty_state_gives_help_and_type_only(tmp_path):
    result = run_vq_inprocess("status", "--prometheus", state=tmp_path / "none", config=named(tmp_path))
    assert result.exit_code == 0
    families = samples(result.stdout)
    assert "vq_admin_last_outcome" in families and all(not s for s in families.values())


def test_prometheus_client_is_imported_only_for_these_options(tmp_path):
    code = ("import sys\nfrom vq_admin.entry import main\n"
            "for argv in (['status'], ['status', '--json'], ['check'], ['providers']):\n"
            "    main(argv + ['--state-dir', sys.argv[1]])\n"
            "print('LOADED' if 'prometheus_client' in sys.modules else 'CLEAN', file=sys.stderr)\n"
            "main(['status', '--prometheus', '--state-dir', sys.argv[1]])\n"
            "print('LOADED' if 'prometheus_client' in sys.modules else 'CLEAN', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, VQ_ADMIN_CONFIG=str(named(tmp_path))))
    marks = [line for line in done.stderr.splitlines() if line in ("LOADED", "CLEAN")]
    assert marks == ["CLEAN", "LOADED"], done.stderr


def test_the_operator_guide_gives_a_ready_cron_line():
    text = (ROOT / "docs" / "operator-guide.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if "--textfile" in line and line[:1] in "*0123456789"]
    assert lines, "docs/operator-guide.md has no crontab line with --textfile"
    words = shlex.split(lines[0])
    command = words[5:]
    assert command[0].endswith("vq-admin") and os.path.isabs(command[0]), "cron has a minimal PATH: give the path"
    args = parse(build_parser(), command[1:])
    assert args.verb == "status" and args.textfile.endswith(".prom")


@pytest.mark.real
def test_transcript_complete_of_a_real_allocation_build(tmp_path, real_cluster):
    from test_allocation_real import World

    world = World(tmp_path, real_cluster, "prom-alloc")
    world.site_example()
    result = world.update("--cluster-install")
    assert result.exit_code == 0, result.stderr + result.stdout
    assert result.json()["command_output"]["complete"] is True
    families = samples(run_vq_inprocess("status", "--prometheus", config=world.config, state=world.state).stdout)
    assert one(families, "vq_admin_transcript_complete", host="cluster", program="prom-alloc", lane="runtime") == 1
    assert one(families, "vq_admin_last_outcome", host="cluster", program="prom-alloc", outcome="ok") == 1
