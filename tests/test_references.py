"""The references census (the agent's census verb run in this process, its scheduler scripted) and
site_example's ``prune``.

The real-Slurm census runs in test_census_real.py and test_bindings_real.py; here the listing's
parsing, the cache and the fail-closed rules are pinned with a scripted squeue and scontrol.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from vq_admin.agent import census as agent_census
from vq_admin.core import protocol
from vq_admin.launcher import registry
from vq_admin.launcher.references import CensusError, census, scan
from vq_admin.state.records import StateDir, Verified, dump_json, write_atomic
from vq_admin.ssh.transport import RunResult, Transport

SITE_DIR = Path(__file__).resolve().parents[1] / "site_example"
SHA = {k: k.lower() * 40 for k in "ABCD"}
AGENT = ["/opt/vq/bin/vq-admin-agent"]


@dataclass
class Job:
    id: str
    script: str | None = None  # None: not a batch job
    state: str = "PENDING"
    command: str = "/home/u/job.sh"
    display: str = ""
    submit: str = "2026-11-30T10:00:00"
    user: str = "u"
    gone: bool = False  # ended between the listing and its script read


class Slurm:
    """squeue and scontrol as the agent's census runs them, answering from :attr:`jobs`; each argv run
    is in :attr:`calls`; :attr:`fail` answers one program's calls with ``(exit, stdout, stderr)``."""

    def __init__(self, *jobs: Job, cluster: str = "c1") -> None:
        self.jobs, self.cluster, self.calls = list(jobs), cluster, []
        self.fail: dict[str, tuple[int, bytes, bytes]] = {}

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[0] in self.fail:
            return self.fail[argv[0]]
        if argv[0] == "squeue":
            token = argv[-1].split(",")[0].split(":0", 1)[1]
            lines = ["".join(value + token for value in (
                job.id, job.display or job.id, job.state, job.user, job.submit, "0" if job.script is None else "1",
                self.cluster, job.command, "/home/u", f"/home/u/slurm-{job.id}.out", f"/home/u/slurm-{job.id}.out",
                "/dev/null")) for job in self.jobs]
            return 0, "".join(line + "\n" for line in lines).encode(), b""
        assert argv[:3] == ["scontrol", "write", "batch_script"] and argv[4] == "-"
        job = next((j for j in self.jobs if j.id == argv[3] and not j.gone), None)
        if job is None:
            return 0, b"", b"job script retrieval failed: Invalid job id specified\n"
        return 0, (job.script or "").encode(), b""

    def reads(self) -> list[str]:
        return [argv[3] for argv in self.calls if argv[0] == "scontrol"]


class Login(Transport):
    """The login host: the agent's ``census`` verb answered in this process, its scheduler *slurm*."""

    where = "login"

    def __init__(self, slurm: Slurm) -> None:
        self.slurm = slurm

    def run(self, argv, *, timeout, env=None, stdin=None):
        assert list(argv) == protocol.census(AGENT)
        found, code = agent_census.answer(self.slurm)
        return RunResult(list(argv), self.where, code, protocol.encode(found).encode(), b"", 0.0)


def launcher(sha: str) -> str:
    return f"/apps/v/releases/{sha}/source/.venv/bin/python"


def script(*lines: str) -> str:
    return "#!/bin/sh\n" + "".join(f"{line}\n" for line in lines)


@pytest.fixture
def state(tmp_path):
    st = StateDir(tmp_path / "state")
    for i, k in enumerate("ABCD"):
        registry.record_verified(st.root, "cluster", "vibeqc",
                                 Verified(**{"sha": SHA[k], "tag": None, "launcher": launcher(SHA[k]),
                                                                 "launcher_sha256": "e" * 64, "receipt": f"r-{k}",
                                                                 "at": f"2026-11-30T0{i}:00:00Z"}))
    lane = st.lane_dir("runtime", "cluster", "vibeqc")
    write_atomic(lane / "last-ok.json", dump_json({"sha": SHA["D"], "launcher": launcher(SHA["D"])}))
    write_atomic(lane / "last-good.json", dump_json({"sha": SHA["C"], "launcher": launcher(SHA["C"])}))
    return st


def reasons(doc) -> dict[str, list[str]]:
    return {row["sha"]: row["reasons"] for row in doc["generations"]}


def take(state, slurm: Slurm) -> dict:
    """The census as its JSON says it."""
    return json.loads(take_census(state, slurm).to_json())


def take_census(state, slurm: Slurm):
    return census(state, Login(slurm), AGENT, "cluster", "vibeqc")


def test_census_reasons(state):
    slurm = Slurm(Job("11", script(f"{launcher(SHA['A'])} run.py")),
                  Job("12", state="RUNNING", command=f"/apps/v/releases/{SHA['B']}/bin/tool --x"),
                  Job("13", script("true"), state="COMPLETED"),
                  Job("14", script("/apps/v/current/source/.venv/bin/python run.py"), display="10_[1-3]"),
                  Job("15", script("true"), gone=True))  # ended between the listing and its script read
    doc = take(state, slurm)
    assert reasons(doc) == {SHA["A"]: ["job 11 (PENDING)"], SHA["B"]: ["job 12 (RUNNING)"], SHA["C"]: ["last-good"],
                            SHA["D"]: ["last-ok"]}  # the words prune keeps them by
    assert doc["jobs_scanned"] == 3 and doc["complete"] is True
    assert slurm.reads() == ["11", "14", "15"]  # not 12 (no batch script), not 13 (terminal)
    assert len(doc["warnings"]) == 1 and "job 14 (PENDING) names /apps/v/current" in doc["warnings"][0]
    row_a = next(r for r in doc["generations"] if r["sha"] == SHA["A"])
    assert row_a["jobs"] == [{"id": "11", "display": "11", "state": "PENDING", "user": "u", "match": "launcher"}]
    assert doc["cost"] == dict(doc["cost"], jobs_listed=5, scripts_read=3, scripts_cached=0, scheduler_calls=4)


def test_a_sha_nobody_verified_here_is_unregistered(state):
    other = "e" * 40
    doc = take(state, Slurm(Job("11", script(f"/x/releases/{other}/bin/py"))))
    assert doc["unregistered"] == {other: ["job 11 (PENDING)"]}


def test_the_census_says_what_prune_keeps_and_removes_in_prunes_words(state):
    """``vq admin references`` without --json: LAST OK is ``last-ok`` (prune's word, not ``current``), and a
    generation nothing references is what prune removes (never "keep: unreferenced")."""
    from vq_admin.commands.references import _lines

    text = "\n".join(_lines(take_census(state, Slurm()))) + "\n"
    assert f"  {SHA['D']}  {launcher(SHA['D'])}\n      keep: last-ok\n" in text, text
    assert f"  {SHA['C']}  {launcher(SHA['C'])}\n      keep: last-good\n" in text, text
    assert text.count("      prune: nothing references it: vq admin prune removes it unless it is among the --keep N "
                      "most recent (default 3)") == 2, text
    assert "unreferenced" not in text and "current" not in text


def test_job_gone_between_calls_is_skipped(state):
    doc = take(state, Slurm(Job("11", script("true"), gone=True)))
    assert doc["jobs_scanned"] == 0


def test_a_value_cannot_forge_a_field_or_a_job(state):
    """A path holding a newline and field-like text is one job's text, never another job or state."""
    forged = f"/home/u/x\n12|12|COMPLETED|u|{launcher(SHA['B'])}|JobState=COMPLETED"
    doc = take(state, Slurm(Job("11", script("true"), command=forged)))
    assert doc["jobs_scanned"] == 1
    assert reasons(doc)[SHA["B"]] == ["job 11 (PENDING)"]


@pytest.mark.parametrize("fail,problem", [
    (("squeue", (1, b"", b"squeue: error: Unable to contact slurm controller\n")), "squeue failed"),
    (("squeue", (0, b"garbage line\n", b"")), "does not parse"),
    (("scontrol", (1, b"", b"Access/permission denied\n")), "Access/permission denied"),
    # scontrol write batch_script says so on stderr and exits 0
    (("scontrol", (0, b"", b"job script retrieval failed: Unable to contact slurm controller\n")), "Unable to contact"),
    (("scontrol", (0, b"", b"")), "no script"),
], ids=["squeue-fails", "unparsable", "script-denied", "script-fails-with-status-0", "script-empty"])
def test_an_incomplete_census_fails_closed(state, fail, problem):
    slurm = Slurm(Job("11", script(f"{launcher(SHA['A'])} run.py")))
    slurm.fail = dict([fail])
    with pytest.raises(CensusError, match=problem) as failed:
        take(state, slurm)
    assert failed.value.cost is not None and failed.value.cost.scheduler_calls == len(slurm.calls)


COST = (b'{"jobs_listed": 3, "scripts_read": 0, "scripts_cached": 0, "cache_rejected": 0, "cache_problem": null, '
        b'"scheduler_calls": 1, "seconds": 0.1}')


@pytest.mark.parametrize("answer,problem", [
    ((255, b"", b"ssh: connect to host: Connection refused"), "Connection refused"),
    ((2, b"", b"vq-admin-agent: error: argument verb: invalid choice: 'census' (choose from 'lease')"),
     "has no census verb"),
    ((127, b"", b"sh: 1: vq-admin-agent: not found"), "not found"),
    ((0, b'{"complete": true}', b""), "cost"),
    # strict: a complete answer without its jobs is not an empty queue (it was read with defaults before)
    ((0, b'{"complete": true, "error": null, "jobs_scanned": 3, "cost": ' + COST + b'}', b""), "groups"),
    ((0, b'{"complete": true, "error": null, "groups": [], "cost": ' + COST + b'}', b""), "jobs_scanned"),
    ((0, b'{"complete": true, "error": null, "jobs_scanned": null, "groups": null, "cost": ' + COST + b'}', b""),
     "could not read the queue completely"),
], ids=["transport", "older-agent", "no-agent", "no-cost", "no-groups", "no-jobs-scanned", "null-jobs"])
def test_an_agent_that_cannot_answer_fails_the_census(state, answer, problem):
    class Broken(Transport):
        where = "login"

        def run(self, argv, *, timeout, env=None, stdin=None):
            code, out, err = answer
            return RunResult(list(argv), self.where, code, out, err, 0.0, "transport" if code == 255 else None)

    with pytest.raises(CensusError, match=problem):
        census(state, Broken(), AGENT, "cluster", "vibeqc")


# -- the cache of what stored scripts name ---------------------------------------------------------


def cache_file() -> Path:
    found = list((Path(os.environ["XDG_STATE_HOME"]) / "vq-admin-agent" / "census").glob("c1.*.json"))
    assert len(found) == 1, found
    return found[0]


def queue() -> Slurm:
    return Slurm(*(Job(str(i), script(f"{launcher(SHA['A'])} run.py" if i % 2 else "true")) for i in range(1, 7)))


def test_the_second_census_reads_no_script_and_forgets_the_jobs_that_left(state):
    slurm = queue()
    first = scan(Login(slurm), AGENT)
    assert first.cost.scripts_read == 6 and first.cost.scripts_cached == 0
    again = scan(Login(slurm), AGENT)
    assert (again.cost.scripts_read, again.cost.scripts_cached, again.cost.scheduler_calls) == (0, 6, 1)
    assert again.jobs_naming([SHA["A"]]) == first.jobs_naming([SHA["A"]])
    assert [job.id for job in again.jobs_naming([SHA["A"], SHA["B"]])[SHA["A"]]] == ["1", "3", "5"]
    path = cache_file()
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    assert sorted(json.loads(path.read_text())["jobs"], key=int) == ["1", "2", "3", "4", "5", "6"]
    slurm.jobs[0].state = "COMPLETED"  # terminal: its entry goes
    del slurm.jobs[1]  # left the queue
    scan(Login(slurm), AGENT)
    assert sorted(json.loads(path.read_text())["jobs"], key=int) == ["3", "4", "5", "6"]


def test_a_requeued_job_is_read_again_and_keeps_its_references(state):
    slurm = queue()
    scan(Login(slurm), AGENT)
    slurm.jobs[0].submit = "2026-11-30T11:00:00"  # scontrol requeue gives the job a new submit time
    again = scan(Login(slurm), AGENT)
    assert again.cost.scripts_read == 1 and slurm.reads()[-1] == "1"
    assert [job.id for job in again.jobs_naming([SHA["A"]])[SHA["A"]]] == ["1", "3", "5"]


def test_a_tampered_entry_is_not_trusted(state):
    slurm = queue()
    scan(Login(slurm), AGENT)
    path = cache_file()
    doc = json.loads(path.read_text())
    doc["jobs"]["1"]["words"] = [launcher(SHA["B"])]  # another SHA written in
    doc["jobs"]["2"]["words"] = [launcher(SHA["B"])]
    path.write_text(json.dumps(doc))
    again = scan(Login(slurm), AGENT)
    assert (again.cost.cache_rejected, again.cost.scripts_read) == (2, 2) and slurm.reads()[-2:] == ["1", "2"]
    assert again.jobs_naming([SHA["B"]]) == {SHA["B"]: []}
    assert [job.id for job in again.jobs_naming([SHA["A"]])[SHA["A"]]] == ["1", "3", "5"]


@pytest.mark.parametrize("spoil", ["loose-mode", "foreign-owner", "symlink", "not-json", "new-key"])
def test_a_cache_that_is_not_trusted_costs_only_time(state, tmp_path, spoil):
    slurm = queue()
    scan(Login(slurm), AGENT)
    path = cache_file()
    if spoil == "loose-mode":
        path.chmod(0o622)
    elif spoil == "foreign-owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file away")
        os.chown(path, 65534, 65534)
    elif spoil == "symlink":
        (tmp_path / "elsewhere.json").write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(tmp_path / "elsewhere.json")
    elif spoil == "not-json":
        path.write_text("{")
    else:  # a key that is not the one the entries were sealed with
        (path.parent / "key").write_text("0" * 64)
    again = scan(Login(slurm), AGENT)
    assert again.cost.scripts_read == 6 and again.cost.scripts_cached == 0
    assert [job.id for job in again.jobs_naming([SHA["A"]])[SHA["A"]]] == ["1", "3", "5"]
    assert again.cost.cache_problem or again.cost.cache_rejected == 6
    third = scan(Login(slurm), AGENT)  # the census wrote a trusted cache again
    assert (third.cost.scripts_read, third.cost.scripts_cached) == (0, 6)
    assert not cache_file().is_symlink() and cache_file().stat().st_uid == os.geteuid()


def test_an_untrusted_cache_directory_is_not_used(state):
    census_dir = Path(os.environ["XDG_STATE_HOME"]) / "vq-admin-agent" / "census"
    census_dir.mkdir(parents=True, mode=0o700)
    census_dir.chmod(0o777)
    slurm = queue()
    scan(Login(slurm), AGENT)
    again = scan(Login(slurm), AGENT)
    assert again.cost.scripts_read == 6 and "census cache directory" in (again.cost.cache_problem or "")
    assert list(census_dir.iterdir()) == []


def test_a_state_home_behind_a_symlink_keeps_its_cache(state, tmp_path, monkeypatch):
    (tmp_path / "real-home").mkdir(mode=0o700)
    (tmp_path / "home").symlink_to(tmp_path / "real-home")  # /home -> /gpfs/home, say
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home"))
    slurm = queue()
    scan(Login(slurm), AGENT)
    again = scan(Login(slurm), AGENT)
    assert (again.cost.scripts_read, again.cost.cache_problem) == (0, None)


def test_what_a_failed_census_read_is_kept(state):
    slurm = queue()

    def timing_out_at_5(argv):
        if argv[0] == "scontrol" and argv[3] == "5":
            return 0, b"", b"job script retrieval failed: Socket timed out on send/recv operation\n"
        return slurm(argv)

    with pytest.raises(CensusError, match="Socket timed out") as failed:
        scan(Login(timing_out_at_5), AGENT)  # type: ignore[arg-type]
    assert failed.value.cost is not None and failed.value.cost.scripts_read == 5
    slurm.calls.clear()
    again = scan(Login(slurm), AGENT)
    assert slurm.reads() == ["5", "6"] and again.cost.scripts_cached == 4  # 1 to 4 were read before the failure


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


def test_prune_refuses_an_empty_census_name(root):
    """``--referenced-file ""`` names no census: it is refused as unreadable, never read as 'nothing referenced'."""
    done = prune("--root", str(root), "--program", "vibeqc", "--referenced-file", "")
    assert done.returncode == 2 and "not a readable census" in done.stderr and "nothing removed" in done.stderr
    assert all((root / "releases" / SHA[k]).is_dir() for k in "ABCD")
