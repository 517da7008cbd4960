"""The driver side of allocation builds without a real Slurm: configuration,
the plan, the transcript sink, the receipt fields, and whole runs through
the local transport with an ``sbatch`` stand-in on PATH.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from plan_match import slot_values
from support import AGENT, NOTHING_ACTIVE, GitRepo, run_vq, write_config
from vq_admin.config import ConfigError, parse_config
from vq_admin.lanes import allocation_step
from vq_admin.lanes.allocation_stream import StreamCall, TranscriptSink
from vq_admin.report.receipt import Receipt
from vq_admin.report.sections import Deploy

FAKE_SBATCH = """#!{python}
import os, sys
# the job writes its transcripts into its own attempt directory (Slurm's --output/--error are /dev/null)
attempt = os.path.dirname([a for a in sys.argv[1:] if not a.startswith("-")][0])
print("77", flush=True)
with open(os.path.join(attempt, "stdout"), "w") as fh:
    fh.write("VQ-DEPLOY-METRIC objects=9\\nbuilt\\n")
with open(os.path.join(attempt, "stderr"), "w") as fh:
    fh.write("warning: x\\n")
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


def host_toml(scratch: Path | None, repo: Path, script: Path, verify: Path, extra: str = "") -> str:
    scratch_line = f'scratch_root = "{scratch}"\n' if scratch else ""
    return (f'[hosts.cluster]\nfleet_role = "managed"\ntransport = "local"\n{scratch_line}agent = "{AGENT}"\n\n'
            f'[hosts.cluster.scheduler_runtime_deployments.prog]\nupdate_command = "{script}"\n'
            f'verify_command = "{verify}"\nsource_repo = "{repo}"\ntimeout_seconds = 120\n'
            f'update_allocation = {{ sbatch_args = ["--time=10", "--partition=debug"] }}\n{extra}')


@pytest.fixture
def world(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH.format(python=sys.executable)),
                       ("scontrol", "#!/bin/sh\necho 'Invalid job id specified' >&2\nexit 1\n"),
                       ("sacct", "#!/bin/sh\nexit 1\n")):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    verify = tmp_path / "verify.py"
    verify.write_text(f"#!{sys.executable}\nprint({json.dumps(NOTHING_ACTIVE)!r})\n")  # nothing installed yet
    verify.chmod(0o755)
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml", host_toml(scratch, repo.path, tmp_path / "unused", verify))
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    return SimpleNamespace(tmp=tmp_path, repo=repo, sha=sha, scratch=scratch, config=config, env=env,
                           state=tmp_path / "state")


def update(world, *extra: str, env: dict | None = None):
    return run_vq("update", "prog", "cluster", "--expected-sha", world.sha, "--json", *extra,
                  config=world.config, state=world.state, env={**world.env, **(env or {})}, timeout=300)


# -- configuration and plan -------------------------------------------------------------


def test_scratch_root_is_required_with_an_allocation_profile(tmp_path):
    import tomllib

    text = host_toml(None, tmp_path, tmp_path / "d", tmp_path / "v")
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(text))
    assert caught.value.key == "hosts.cluster.scratch_root" and "update_allocation" in caught.value.reason
    with pytest.raises(ConfigError, match="hosts.cluster.scratch_root: must not contain '%'"):
        parse_config(tomllib.loads(host_toml(tmp_path / "a%j", tmp_path, tmp_path / "d", tmp_path / "v")))


def test_dry_run_plans_the_agent_submission(world):
    result = update(world, "--dry-run")
    assert result.exit_code == 0, result.stderr
    steps = {s["name"]: s for s in result.json()["steps"]}
    argv = steps["deploy"]["argv"]
    assert argv[:13] == [AGENT, "alloc-run", "--root", str(world.scratch), "--program", "prog", "--attempt",
                         "<attempt>", "--timeout", "120", "[<progress>]...", "--sbatch-arg=--time=10",
                         "--sbatch-arg=--partition=debug"]
    assert argv[13:17] == ["--archive", "<stage>/source.tar", "--archive-sha256", "<archive_sha256>"]
    assert argv[17:20] == ["--", str(world.tmp / "unused"), "--program"] and argv[-1] == "<stage>/source.tar"
    # a dry run draws nothing: the progress option is the list slot a terminal run fills with --progress 10
    assert "--progress" not in argv
    assert steps["deploy"]["where"] == "local" and "Slurm batch job" in steps["deploy"]["purpose"]
    assert not (world.scratch / ".vq-admin").exists()


# -- whole runs through the local transport -----------------------------------------------


def test_an_allocation_run_preserves_exit_status_and_carries_the_transcript(world):
    result = update(world, env={"FAKE_EXIT": "3"})
    assert result.exit_code == 1, result.stderr + result.stdout
    receipt = result.json()
    deploy, output = receipt["deploy"], receipt["command_output"]
    assert deploy["exit_code"] == 3 and deploy["job_id"] == "77" and deploy["sbatch_exit_code"] == 3
    assert output["complete"] is True and output["observations"] == 3
    assert output["stdout"] == "VQ-DEPLOY-METRIC objects=9\nbuilt\n" and output["stderr"] == "warning: x\n"
    assert receipt["metrics"] == {"objects": 9} and receipt["metrics_complete"] is True
    attempt = Path(deploy["log_dir"])
    assert attempt.parent == world.scratch / ".vq-admin" / "runtime-deploy" / "prog"
    assert (attempt / "job").read_text() == "77\n"
    transcript = Path(output["transcript"])
    assert transcript == world.state / "receipts" / f"{receipt['id']}.transcript"
    assert (transcript / "stdout").read_text() == output["stdout"]
    assert json.loads((world.state / "receipts" / f"{receipt['id']}.json").read_text())["deploy"]["exit_code"] == 3


def test_a_deploy_refused_before_it_runs_leaves_nothing_behind(world):
    """A local allocation deploy whose command another user could replace is refused (77) at the
    step's start: no attempt record, no transcript directory, no attempt on the host."""
    loose = world.tmp / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    script = loose / "deploy.py"
    script.write_text(f"#!{sys.executable}\n")
    script.chmod(0o755)
    world.config = write_config(world.tmp / "loose.toml", host_toml(world.scratch, world.repo.path, script,
                                                                    world.tmp / "verify.py"))
    result = update(world)
    assert result.exit_code == 77, result.stderr + result.stdout
    receipt = result.json()
    deploy = next(s for s in receipt["steps"] if s["name"] == "deploy")
    assert deploy["status"] == "failed" and f"directory {loose}" in deploy["detail"], deploy
    assert not (world.state / "receipts" / f"{receipt['id']}.transcript").exists()
    assert not list(world.state.rglob("attempt.json")), "no attempt was recorded for a deploy that never ran"
    assert not (world.scratch / ".vq-admin" / "runtime-deploy" / "prog").exists()


def test_the_run_fills_exactly_the_planned_agent_argv(world):
    dry = update(world, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    result = update(world, env={"FAKE_EXIT": "3"})
    receipt = result.json()
    values = slot_values(dry.json()["steps"], receipt["steps"], names={"deploy"})
    assert values["attempt"] == receipt["deploy"]["attempt"] and values["stage"] == receipt["stage"]["dir"]
    assert values["archive_sha256"] == receipt["source"]["archive_sha256"]
    assert values["progress"] == []  # off a terminal: the progress slot is filled with no word at all


def test_a_live_run_fills_the_progress_slot_with_the_poll_interval():
    from vq_admin.report import progress
    from vq_admin.plan import Plan, filled

    step = Plan().add("deploy", "h", ["/agent", "alloc-run", "--attempt", allocation_step.ATTEMPT,
                                      allocation_step.PROGRESS, "--archive", allocation_step.ARCHIVE], "deploy")
    deploy = allocation_step.AllocationDeploy.__new__(allocation_step.AllocationDeploy)
    deploy.stage = SimpleNamespace(dir="/scratch/stage.1", ident=SimpleNamespace(archive_sha256="f" * 64))
    live, quiet = deploy.run_values("deploy.a", live=True), deploy.run_values("deploy.a", live=False)
    assert live["progress"] == ["--progress", str(progress.POLL_SECONDS)] and quiet["progress"] == []
    assert live["archive_sha256"] == "f" * 64
    assert filled(step, **{k: v for k, v in live.items() if k != "archive_sha256"})[0] == [
        "/agent", "alloc-run", "--attempt", "deploy.a", "--progress", "10", "--archive", "/scratch/stage.1/source.tar"]


def test_a_slot_the_provider_placed_in_its_env_stays_a_slot_inside_the_agents_env_word():
    from vq_admin_hookspecs import ProviderCommand, Slot

    from vq_admin.core import protocol
    from vq_admin.plan import Plan, filled

    archive = Slot("stage", suffix="/source.tar")
    command = ProviderCommand(argv=("/site/deploy", "--source-archive", archive),
                              env=(("SITE_ARCHIVE", "file=" + archive), ("ARCHIVE", archive), ("LANG", "C")))
    argv = allocation_step._placed(protocol.detach_run(
        ["/agent"], root="/scratch", program="p", attempt=allocation_step.ATTEMPT, timeout="60",
        progress_words=[allocation_step.PROGRESS], archive=allocation_step.ARCHIVE,
        archive_sha256=allocation_step.ARCHIVE_SHA256, env=command.env, command=command.argv), command)
    step = Plan().add("deploy", "h", argv, "deploy")
    assert "--env" in step.planned_argv and "SITE_ARCHIVE=file=<stage>/source.tar" in step.planned_argv
    ran, _ = filled(step, attempt="deploy.a", stage="/s", archive_sha256="f" * 64, progress=[])
    assert "SITE_ARCHIVE=file=/s/source.tar" in ran and "ARCHIVE=/s/source.tar" in ran and "LANG=C" in ran
    assert ran[-3:] == ["/site/deploy", "--source-archive", "/s/source.tar"] and not any("<" in w for w in ran)


def test_a_symlinked_program_directory_is_refused_through_the_driver(world):
    elsewhere = world.tmp / "elsewhere"
    elsewhere.mkdir()
    (world.scratch / ".vq-admin" / "runtime-deploy").mkdir(parents=True)
    os.symlink(elsewhere, world.scratch / ".vq-admin" / "runtime-deploy" / "prog")
    result = update(world)
    assert result.exit_code == 77, result.stderr + result.stdout
    receipt = result.json()
    assert any("refused" in e and "symlink" in e for e in receipt["errors"])
    assert receipt["deploy"]["job_id"] is None and receipt["deploy"]["exit_code"] is None
    assert list(elsewhere.iterdir()) == []
    assert list((world.scratch / ".vq-admin" / "stage" / "runtime" / "prog").iterdir())[0].joinpath("FAILED").exists()


# -- the transcript sink ------------------------------------------------------------------


def test_sink_finds_metrics_across_chunk_boundaries_and_keeps_the_head_and_tail(tmp_path):
    import xxhash

    sink = TranscriptSink(tmp_path / "t", "stdout", keep=64)
    data = (b"noise VQ-DEPLOY-METRIC fake=1\n" + b"VQ-DEPLOY-METRIC files=12\n" + b"x" * 200 + b"\n"
            + b"VQ-DEPLOY-METRIC " + b"y" * 70000 + b"=1\n" + b"VQ-DEPLOY-METRIC ratio=0.5")
    for i in range(0, len(data), 7):
        sink.write(data[i:i + 7])
    path = sink.commit()
    assert sink.metrics == {"files": 12, "ratio": 0.5}
    assert path.read_bytes() == data and sink.bytes == len(data)
    assert sink.digest == xxhash.xxh3_64(data).hexdigest() and sink.algorithm == "xxh3_64"
    marker = f"\n[... {len(data) - 64} bytes left out: see the transcript ...]\n"  # the head and tail around it
    assert sink.truncated and sink.text() == data[:32].decode() + marker + data[-32:].decode()
    assert [p.name for p in path.parent.iterdir()] == ["stdout"]  # no temp file left behind


def _stub_update(tmp_path):
    receipt = Receipt("runtime", "cluster", "prog", "a" * 40, None, "now")
    receipt.deploy = Deploy(log_dir="/scratch/.vq-admin/runtime-deploy/prog/deploy.20260101T000000Z.0a0b0c0d",
                            job_id=None, exit_code=None)
    said = []
    stub = allocation_step.AllocationDeploy(  # the step, built from its inputs (doubles here)
        SimpleNamespace(narrate=said.append), SimpleNamespace(name="cluster"),
        SimpleNamespace(timeout_seconds=60.0), receipt, "a" * 40,
        SimpleNamespace(reclaim=lambda success: said.append(f"reclaim {success}")))
    return stub, said


def _call(tmp_path, summary: dict, out: bytes, err: bytes, ended: bool = True):
    import xxhash

    sinks = {"stdout": TranscriptSink(tmp_path / "t", "stdout"), "stderr": TranscriptSink(tmp_path / "t", "stderr")}
    sinks["stdout"].write(out)
    sinks["stderr"].write(err)
    sent = {name: {"bytes": len(data), "checksum": "xxh3_64", "digest": xxhash.xxh3_64(data).hexdigest(),
                   "settled_digest": xxhash.xxh3_64(data).hexdigest() if summary["settle"]["settled"] else None}
            for name, data in (("stdout", out), ("stderr", err))}
    records = {"summary": summary, **({"end": {"sent": sent}} if ended else {})}
    call = StreamCall(["agent"], "cluster", exit_code=0, records=records, ended=ended)
    call.step = SimpleNamespace(exit_code=None, status=None, detail=None)
    return call, sinks


def _summary(exit_code, settled, reason, observations, **extra):
    base = {"job_id": "9", "submitted": True, "exit_code": exit_code, "sbatch_exit_code": exit_code,
            "established": True, "timed_out": False, "notes": [],
            "settle": {"settled": settled, "reason": reason, "observations": observations, "seconds": 1.0},
            "retention": {"removed": []}}
    base.update(extra)
    return base


@pytest.mark.parametrize("reason", ["empty", "unavailable", "unstable"])
@pytest.mark.parametrize("exit_code", [0, 3])
def test_an_incomplete_transcript_says_so_and_keeps_the_exit_status(tmp_path, reason, exit_code):
    stub, said = _stub_update(tmp_path)
    out = b"" if reason != "unstable" else b"VQ-DEPLOY-METRIC partial=1\nstill going\n"
    call, sinks = _call(tmp_path, _summary(exit_code, False, reason, 10), out, b"")
    result = stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    assert result.exit_code == exit_code and result.interrupted is None
    output = stub.receipt.command_output.to_value()
    assert output["complete"] is False and output["reason"] == reason and output["observations"] == 10
    assert output["log_dir"] == stub.receipt.deploy.log_dir and output["stdout"] == out.decode()
    assert "not proof that no build work occurred" in output["note"]
    assert stub.receipt.metrics_complete is False
    assert stub.receipt.metrics == ({"partial": 1} if out else {})
    assert stub.receipt.deploy.exit_code == exit_code


def test_a_settled_transcript_is_complete(tmp_path):
    stub, _ = _stub_update(tmp_path)
    call, sinks = _call(tmp_path, _summary(0, True, None, 3), b"VQ-DEPLOY-METRIC n=1\n", b"")
    result = stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    assert result.exit_code == 0
    assert stub.receipt.command_output.complete is True and stub.receipt.metrics_complete is True
    assert call.step.exit_code == 0 and call.step.status == "ok"


def test_a_stream_cut_before_its_end_is_incomplete(tmp_path):
    stub, _ = _stub_update(tmp_path)
    call, sinks = _call(tmp_path, _summary(0, True, None, 3), b"VQ-DEPLOY-METRIC n=1\n", b"", ended=False)
    stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    output = stub.receipt.command_output.to_value()
    assert output["complete"] is False and output["reason"] == "unavailable"
    assert stub.receipt.metrics == {"n": 1} and stub.receipt.metrics_complete is False


def test_a_transcript_changed_after_it_settled_is_unstable(tmp_path):
    stub, _ = _stub_update(tmp_path)
    call, sinks = _call(tmp_path, _summary(0, True, None, 3), b"abc\n", b"")
    call.records["end"]["sent"]["stdout"]["settled_digest"] = "0" * 16
    stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    assert stub.receipt.command_output.reason == "unstable"


def test_an_unknown_checksum_is_unstable_whatever_its_name_says(tmp_path):
    # the reason is decided from what was found, not read back from the problem's words (the name is the agent's)
    stub, _ = _stub_update(tmp_path)
    call, sinks = _call(tmp_path, _summary(0, True, None, 3), b"abc\n", b"")
    call.records["end"]["sent"]["stdout"]["checksum"] = "received-cut"
    stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    output = stub.receipt.command_output.to_value()
    assert output["reason"] == "unstable" and "unknown checksum 'received-cut'" in output["problems"][0]


def test_an_unestablished_end_is_an_interrupted_transport_not_a_failure(tmp_path):
    stub, _ = _stub_update(tmp_path)
    summary = _summary(None, True, None, 3, established=False, reconciled=True,
                       notes=["scontrol: Unable to contact slurm controller"])
    call, sinks = _call(tmp_path, summary, b"VQ-DEPLOY-METRIC n=1\n", b"")
    result = stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    assert result.interrupted == "transport" and result.exit_code is None
    assert "job 9" in result.error_text() and stub.receipt.deploy.log_dir in result.error_text()
    assert stub.receipt.command_output.complete is False and stub.receipt.metrics_complete is False


def test_a_blake2b_stream_from_an_agent_without_xxhash_is_checked_and_named(tmp_path):
    """An agent on a Python without xxhash names blake2b; the driver checks the digests in it."""
    import hashlib

    stub, _ = _stub_update(tmp_path)
    out = b"VQ-DEPLOY-METRIC n=1\n"
    call, sinks = _call(tmp_path, _summary(0, True, None, 3), out, b"")
    summary = call.records["summary"]
    summary["settle"]["checksum"] = "blake2b"
    for name, data in (("stdout", out), ("stderr", b"")):
        digest = hashlib.blake2b(data, digest_size=8).hexdigest()
        call.records["end"]["sent"][name].update(checksum="blake2b", digest=digest, settled_digest=digest)
    stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    output = stub.receipt.command_output.to_value()
    assert output["complete"] is True and output["checksum"] == "blake2b", output.get("problems")
    # a wrong blake2b digest is damage in transit, not a pass
    stub, _ = _stub_update(tmp_path / "again")
    call, sinks = _call(tmp_path / "again", _summary(0, True, None, 3), out, b"")
    call.records["summary"]["settle"]["checksum"] = "blake2b"
    call.records["end"]["sent"]["stdout"].update(checksum="blake2b", digest="0" * 16, settled_digest="0" * 16)
    stub._conclude(SimpleNamespace(argv=("deploy",)), call, sinks)
    assert stub.receipt.command_output.complete is False
    assert any("received" in p for p in stub.receipt.command_output.problems)


@pytest.mark.parametrize("record, field", [
    ('summary {"exit_code": "3", "established": true}', "$.exit_code"),
    ('summary {"settle": {"settled": "yes"}}', "$.settle.settled"),
    ('end {"sent": {"stdout": {"bytes": -1}}}', "$.bytes"),
])
def test_a_summary_or_end_record_of_the_wrong_type_is_an_unreadable_answer(tmp_path, record, field):
    """The agent's summary is read as its type: a field of the wrong type cuts the stream (never a guess)."""
    from vq_admin.lanes.allocation_stream import stream_call
    from vq_admin.ssh.transport import LocalTransport

    call = stream_call(LocalTransport(), ["sh", "-c", f"printf '%s\\n' '{record}'; sleep 60"], timeout=60, sinks={})
    assert call.frame_error is not None and field in call.frame_error, call.frame_error
    assert not call.complete and call.records == {} and call.summary is None
