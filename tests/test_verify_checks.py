"""Each failed verify check fails the run (exit 1); LAST OK and LAST GOOD stay.

The provider is the built-in ``command`` provider running two small scripts:
deploy "activates" a prepared receipt (copies it to active.json), and verify
prints the active receipt, so every field of the evidence is under test control.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from support import GitRepo, command_host, run_vq, write_config

DEPLOY = """\
import shutil, sys, pathlib
here = pathlib.Path(sys.argv[1])
(here / "deploy-calls").open("a").write(" ".join(sys.argv[2:]) + "\\n")
shutil.copyfile(here / "pending.json", here / "active.json")
print("VQ-DEPLOY-METRIC build_seconds=0.5")
"""
VERIFY = """\
import sys, pathlib
here = pathlib.Path(sys.argv[1])
active = here / "active.json"
sys.stdout.write(active.read_text() if active.exists() else '{"program": "", "source_sha": "", "tag": null, "healthy": false, "activation": "none", "quiescent": true, "updater_pid": null, "active_path": "", "active_path_sha256": ""}')
"""  # noqa: E501 - the script as the provider would run it


class Site:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.repo = GitRepo(tmp / "src")
        self.shas = [self.repo.commit(f"c{i}") for i in range(3)]
        (tmp / "deploy.py").write_text(DEPLOY)
        (tmp / "verify.py").write_text(VERIFY)
        self.config = write_config(tmp / "admin.toml", command_host(
            "vibeqc", scratch=tmp, repo=self.repo.path, update=f"{sys.executable} {tmp / 'deploy.py'} {tmp}",
            verify=f"{sys.executable} {tmp / 'verify.py'} {tmp}", transport="local", timeout_seconds=None,
            verify_timeout_seconds=None))
        self.state = tmp / "state"

    def launcher(self, sha: str) -> tuple[str, str]:
        path = self.tmp / "apps" / "releases" / sha / "bin" / f"vibeqc-{sha}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n# launcher of {sha}\n")
        return str(path), hashlib.sha256(path.read_bytes()).hexdigest()

    def good_receipt(self, sha: str) -> dict:
        path, digest = self.launcher(sha)
        return {"program": "vibeqc", "source_sha": sha, "tag": None, "healthy": True, "activation": "atomic",
                "quiescent": True, "updater_pid": None, "active_path": path, "active_path_sha256": digest,
                "health_detail": "ok"}

    def prepare(self, text: str) -> None:
        (self.tmp / "pending.json").write_text(text)

    def update(self, sha: str, *extra: str):
        return run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", *extra,
                      config=self.config, state=self.state)

    def record(self, which: str) -> dict | None:
        path = self.state / "hosts" / "cluster" / "runtime" / "vibeqc" / f"{which}.json"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture
def site(tmp_path):
    site = Site(tmp_path)
    for sha in site.shas[:2]:
        site.prepare(json.dumps(site.good_receipt(sha)))
        result = site.update(sha)
        assert result.exit_code == 0, result.stdout + result.stderr
    assert site.record("last-ok")["sha"] == site.shas[1]
    assert site.record("last-good")["sha"] == site.shas[0]
    return site


def mutate(site: Site, sha: str, name: str) -> tuple[str, str]:
    """The receipt text for one failed check, and the check expected to fail."""
    good = site.good_receipt(sha)
    if name == "two-documents":
        return json.dumps(good) + "\n" + json.dumps(good), "verify"
    changes = {
        "source_sha": ("source_sha", site.shas[1]),
        "tag": ("tag", "v9.9"),
        "healthy": ("healthy", False),
        "activation": ("activation", "copy-in-place"),
        "quiescent": ("quiescent", False),
        "updater_pid": ("updater_pid", 4242),
        "active_path": ("active_path", str(site.tmp / "apps" / "current" / "bin" / f"vibeqc-{sha}")),
        "active_path_sha256": ("active_path_sha256", "0" * 64),
    }
    key, value = changes[name]
    good[key] = value
    return json.dumps(good), name


CASES = ["source_sha", "tag", "healthy", "activation", "quiescent", "updater_pid", "active_path",
         "active_path_sha256", "two-documents"]


@pytest.mark.parametrize("case", CASES)
def test_a_failed_check_fails_the_run_and_moves_no_record(site, case):
    sha = site.shas[2]
    text, check = mutate(site, sha, case)
    site.prepare(text)
    result = site.update(sha)
    receipt = result.json()
    assert result.exit_code == 1, result.stderr
    assert receipt["outcome"] == "failed" and receipt["exit_code"] == 1
    assert receipt["deploy"]["exit_code"] == 0
    final = receipt["verify"]["final"]
    assert final["proven"] is False
    if check == "verify":
        assert "more than one JSON document" in final["error"]
    else:
        failed = [c["name"] for c in final["checks"] if not c["ok"]]
        assert check in failed, failed
    assert site.record("last-ok")["sha"] == site.shas[1]
    assert site.record("last-good")["sha"] == site.shas[0]
    assert site.record("last")["outcome"] == "failed"


def test_a_verified_run_carries_the_full_sha_everywhere(site):
    sha = site.shas[2]
    site.prepare(json.dumps(site.good_receipt(sha)))
    receipt = site.update(sha).json()
    assert receipt["outcome"] == "ok"
    steps = {s["name"]: s for s in receipt["steps"]}
    assert receipt["source"]["sha"] == sha
    assert steps["stage-verify"]["argv"][steps["stage-verify"]["argv"].index("--sha") + 1] == sha
    assert steps["deploy"]["argv"][steps["deploy"]["argv"].index("--expected-sha") + 1] == sha
    assert receipt["verify"]["final"]["receipt"]["source_sha"] == sha
    assert receipt["metrics"] == {"build_seconds": 0.5} and receipt["metrics_complete"] is True
    assert site.record("last-ok")["sha"] == sha
    assert site.record("last-good")["sha"] == site.shas[1]


def test_force_rebuilds_an_already_current_runtime(site):
    calls = (site.tmp / "deploy-calls").read_text().count("\n")
    again = site.update(site.shas[1])
    assert again.json()["outcome"] == "already-current"
    assert (site.tmp / "deploy-calls").read_text().count("\n") == calls
    forced = site.update(site.shas[1], "--force")
    assert forced.json()["outcome"] == "ok"
    assert (site.tmp / "deploy-calls").read_text().count("\n") == calls + 1


def test_a_build_is_never_started_while_the_provider_reports_one_running(site):
    calls = (site.tmp / "deploy-calls").read_text()
    busy = dict(site.good_receipt(site.shas[1]), quiescent=False, updater_pid=31337)
    (site.tmp / "active.json").write_text(json.dumps(busy))
    result = site.update(site.shas[2])
    assert result.exit_code == 75, result.stderr
    assert "updater_pid 31337" in result.json()["errors"][0]
    assert (site.tmp / "deploy-calls").read_text() == calls
    assert site.record("last-ok")["sha"] == site.shas[1]


RECEIPT_KEYS = {"schema", "id", "outcome", "exit_code", "lane", "host", "program", "expected_sha", "tag", "started_at",
                "finished_at", "steps", "deploy", "command_output", "metrics", "metrics_complete", "verify", "mirror",
                "source", "errors", "readback"}


def test_the_receipt_envelope_is_the_contract(site):
    """CONTRACT section 6: the versioned envelope; stored copy identical to what --json printed."""
    sha = site.shas[2]
    site.prepare(json.dumps(site.good_receipt(sha)))
    printed = site.update(sha).json()
    assert RECEIPT_KEYS <= set(printed)
    assert printed["schema"] == "vq-admin/receipt/1" and printed["exit_code"] == 0
    for step in printed["steps"]:
        assert {"name", "where", "argv", "exit_code", "seconds"} <= set(step)
        assert all(isinstance(word, str) for word in step["argv"])
    assert {"complete", "reason", "log_dir", "observations"} <= set(printed["command_output"])
    stored = json.loads((site.state / "receipts" / f"{printed['id']}.json").read_text())
    assert stored == printed
    log = [json.loads(line) for line in (site.state / "admin.log").read_text().splitlines()]
    assert log[-1]["receipt"].endswith(f"{printed['id']}.json") and log[-1]["outcome"] == "ok"
