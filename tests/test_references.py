"""The references census (scheduler replies scripted) and site_example's ``prune``.

The real-Slurm census and retention run in test_bindings_real.py; here the
parsing and the fail-closed rules are pinned with a scripted transport.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vq_admin.launcher import registry
from vq_admin.launcher.references import CensusError, census
from vq_admin.state.records import StateDir, dump_json, write_atomic
from vq_admin.ssh.transport import RunResult, Transport

SITE_DIR = Path(__file__).resolve().parents[1] / "site_example"
SHA = {k: k.lower() * 40 for k in "ABCD"}


class Scripted(Transport):
    """Answers each argv from a table: ``{tuple(argv): (exit, stdout, stderr)}``."""

    where = "login"

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def run(self, argv, *, timeout, env=None, stdin=None):
        self.calls.append(list(argv))
        code, out, err = self.answers.get(tuple(argv), (1, "", f"unexpected {argv}"))
        if code == 255:
            return RunResult(list(argv), self.where, 255, b"", err.encode(), 0.0, "transport")
        return RunResult(list(argv), self.where, code, out.encode(), err.encode(), 0.0)


def squeue(*lines: str):
    return ("squeue", "-h", "--all", "-t", "all", "-o", "%A|%i|%T"), (0, "".join(f"{ln}\n" for ln in lines), "")


def show(job: str, state: str, batch: int = 1, command: str = "/home/u/job.sh"):
    return (("scontrol", "show", "job", "-o", job),
            (0, f"JobId={job} JobName=j JobState={state} BatchFlag={batch} Command={command} WorkDir=/home/u\n", ""))


def script(job: str, text: str):
    return ("scontrol", "write", "batch_script", job, "-"), (0, text, "")


def launcher(sha: str) -> str:
    return f"/apps/v/releases/{sha}/source/.venv/bin/python"


@pytest.fixture
def state(tmp_path):
    st = StateDir(tmp_path / "state")
    for i, k in enumerate("ABCD"):
        registry.record_verified(st.root, "cluster", "vibeqc",
                                 {"sha": SHA[k], "tag": None, "launcher": launcher(SHA[k]),
                                                                 "launcher_sha256": "e" * 64, "receipt": f"r-{k}",
                                                                 "at": f"2026-11-30T0{i}:00:00Z"})
    lane = st.lane_dir("runtime", "cluster", "vibeqc")
    write_atomic(lane / "last-ok.json", dump_json({"sha": SHA["D"], "launcher": launcher(SHA["D"])}))
    write_atomic(lane / "last-good.json", dump_json({"sha": SHA["C"], "launcher": launcher(SHA["C"])}))
    return st


def reasons(doc) -> dict[str, list[str]]:
    return {row["sha"]: row["reasons"] for row in doc["generations"]}


def test_census_reasons(state):
    answers = dict([
        squeue("11|11|PENDING", "12|12|RUNNING", "13|13|COMPLETED", "14|10_[1-3]|PENDING", "15|15|PENDING"),
        show("11", "PENDING"), script("11", f"#!/bin/sh\n{launcher(SHA['A'])} run.py\n"),
        show("12", "RUNNING", batch=0, command=f"/apps/v/releases/{SHA['B']}/bin/tool --x"),
        show("14", "PENDING"), script("14", "#!/bin/sh\n/apps/v/current/source/.venv/bin/python run.py\n"),
        show("15", "COMPLETED"),  # ended between squeue and show: not counted
    ])
    transport = Scripted(answers)
    doc = census(state, transport, "cluster", "vibeqc")
    assert reasons(doc) == {SHA["A"]: ["job 11 (PENDING)"], SHA["B"]: ["job 12 (RUNNING)"], SHA["C"]: ["last-good"],
                            SHA["D"]: ["last-ok"]}  # the words prune keeps them by
    assert doc["jobs_scanned"] == 3 and doc["complete"] is True
    assert ["scontrol", "show", "job", "-o", "13"] not in transport.calls  # terminal in squeue: not read
    assert ["scontrol", "write", "batch_script", "12", "-"] not in transport.calls  # no batch script
    assert len(doc["warnings"]) == 1 and "job 14 (PENDING) names /apps/v/current" in doc["warnings"][0]
    row_a = next(r for r in doc["generations"] if r["sha"] == SHA["A"])
    assert row_a["jobs"] == [{"id": "11", "display": "11", "state": "PENDING", "match": "launcher"}]


def test_the_census_says_what_prune_keeps_and_removes_in_prunes_words(state):
    """``vq admin references`` without --json: LAST OK is ``last-ok`` (prune's word, not ``current``), and a
    generation nothing references is what prune removes (never "keep: unreferenced")."""
    from vq_admin.commands.references import _lines

    text = "\n".join(_lines(census(state, Scripted(dict([squeue()])), "cluster", "vibeqc"))) + "\n"
    assert f"  {SHA['D']}  {launcher(SHA['D'])}\n      keep: last-ok\n" in text, text
    assert f"  {SHA['C']}  {launcher(SHA['C'])}\n      keep: last-good\n" in text, text
    assert text.count("      prune: nothing references it: vq admin prune removes it unless it is among the --keep N "
                      "most recent (default 3)") == 2, text
    assert "unreferenced" not in text and "current" not in text


def test_job_gone_between_calls_is_skipped(state):
    answers = dict([squeue("11|11|PENDING"),
                    (("scontrol", "show", "job", "-o", "11"),
                     (1, "", "slurm_load_jobs error: Invalid job id specified"))])
    doc = census(state, Scripted(answers), "cluster", "vibeqc")
    assert doc["jobs_scanned"] == 0


@pytest.mark.parametrize("answers", [
    dict([(squeue()[0], (1, "", "squeue: error: Unable to contact slurm controller"))]),
    dict([(squeue()[0], (255, "", "ssh: connect to host: Connection refused"))]),
    dict([squeue("garbage line")]),
    dict([squeue("11|11|PENDING"), show("11", "PENDING"),
          (("scontrol", "write", "batch_script", "11", "-"), (1, "", "Access/permission denied"))]),
    dict([squeue("11|11|PENDING"), (("scontrol", "show", "job", "-o", "11"), (1, "", "Socket timed out"))]),
], ids=["squeue-fails", "transport", "unparsable", "script-denied", "show-fails"])
def test_an_incomplete_census_fails_closed(state, answers):
    with pytest.raises(CensusError):
        census(state, Scripted(answers), "cluster", "vibeqc")


# -- site_example prune -----------------------------------------------------------------


def prune(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE_DIR), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "vq_site_example.cli", "prune", *argv], capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "apps" / "vibeqc"
    for k in "ABCD":
        release = root / "releases" / SHA[k]
        (release / "source").mkdir(parents=True)
        (release / "PROGRAM").write_text("vibeqc\n")
    (root / "releases" / f".partial.{SHA['A']}.x").mkdir()
    other = tmp_path / "elsewhere" / SHA["B"]
    other.mkdir(parents=True)
    (root / "releases" / ("e" * 40)).symlink_to(other)  # a symlink is never followed nor removed
    os.symlink(f"releases/{SHA['D']}", root / "current")
    return root


def write_census(path: Path, referenced: dict[str, list[str]], **extra) -> Path:
    doc = {"schema": "vq-admin/references/1", "program": "vibeqc", "complete": True,
           "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "generations": [{"sha": s, "reasons": r} for s, r in referenced.items()]}
    doc.update(extra)
    path.write_text(json.dumps(doc))
    return path


def test_prune_removes_only_the_unreferenced(root, tmp_path):
    census_file = write_census(tmp_path / "c.json",
                               {SHA["A"]: ["job 7 (PENDING)"], SHA["B"]: [], SHA["C"]: ["last-good"]})
    done = prune("--root", str(root), "--program", "vibeqc", "--referenced-file", str(census_file))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["removed"] == [SHA["B"]]
    assert out["kept"] == {SHA["A"]: ["job 7 (PENDING)"], SHA["C"]: ["last-good"], SHA["D"]: ["current"]}
    assert sorted(p.name for p in (root / "releases").iterdir()) == sorted(
        [SHA["A"], SHA["C"], SHA["D"], f".partial.{SHA['A']}.x", "e" * 40])
    assert (tmp_path / "elsewhere" / SHA["B"]).is_dir()


def test_prune_keep_sha_and_dry_run(root, tmp_path):
    census_file = write_census(tmp_path / "c.json", {})
    done = prune("--root", str(root), "--program", "vibeqc", "--referenced-file", str(census_file),
                 "--keep-sha", SHA["A"], "--dry-run")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["removed"] == [SHA["B"], SHA["C"]]
    assert all((root / "releases" / SHA[k]).is_dir() for k in "ABCD")


@pytest.mark.parametrize("extra", [{"complete": False}, {"program": "other"}, {"taken_at": "2020-01-01T00:00:00Z"},
                                   {"schema": "x"}, {"generations": [{"sha": "abc", "reasons": []}]}])
def test_prune_refuses_a_doubtful_census(root, tmp_path, extra):
    census_file = write_census(tmp_path / "c.json", {}, **extra)
    done = prune("--root", str(root), "--program", "vibeqc", "--referenced-file", str(census_file))
    assert done.returncode == 2 and "nothing removed" in done.stderr
    assert all((root / "releases" / SHA[k]).is_dir() for k in "ABCD")


def test_prune_needs_a_census(root):
    done = prune("--root", str(root), "--program", "vibeqc")
    assert done.returncode == 2
    assert all((root / "releases" / SHA[k]).is_dir() for k in "ABCD")
