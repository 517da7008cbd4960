"""Steps a run adds only when it needs them are planned too.

* ``Plan.add_when_needed`` plans a template (slots and all) that the dry run
  lists under ``when_needed``; ``Plan.again`` copies it (or a planned step)
  into the run under its own name, and the copy runs through ``execute``;
* ``execute_stream`` runs a streamed step's planned argv with its slots
  filled, through the caller's streaming call, with the step's failpoints;
* the read-back verify after an interrupted deploy is a copy of the planned
  ``readback-verify`` template, not a verify planned again at run time;
* ``previous-attempt`` is planned when an interrupted run's attempt record
  exists when the plan is made; a record cleared meanwhile leaves the step
  skipped, one that appeared or changed meanwhile is refused (75).
"""

from __future__ import annotations

import pytest
from test_plan_slots import Counting, run_lane
from test_plan_slots import world  # noqa: F401  (a fixture)
from vq_admin_hookspecs import Slot, is_slot

from vq_admin.agent.allocation import new_attempt_name
from vq_admin.context import RunContext, RunOptions
from vq_admin.lanes import allocation_attempt
from vq_admin.lanes.runtime import RuntimeUpdate
from vq_admin.report.outcome import Locked
from vq_admin.plan import Plan, SlotError, Step, execute, execute_stream
from vq_admin.plugins import Providers
from vq_admin.state.records import StateDir
from vq_admin.ssh.transport import RunResult, Session, Transport


class Double(Transport):
    """Records what it was asked to run; not a local host, so the driver's command check stays out."""

    where = "double"

    def __init__(self) -> None:
        self.ran: list[list[str]] = []

    def run(self, argv, *, timeout, env=None, stdin=None, watch=None):  # type: ignore[override]
        self.ran.append(list(argv))
        return RunResult(list(argv), self.where, 0, b"{}", b"", 0.01)


def test_a_template_is_copied_into_the_run_with_its_slots_and_listed_for_the_dry_run():
    plan = Plan()
    first = plan.add("verify", "login", ["/agent", "verify", "--path", Slot("active_path")], "verify")
    template = plan.add_when_needed("reconcile", "login", ["/agent", "alloc-reconcile", "--attempt", Slot("attempt")],
                                    "after a drop")
    assert [s.name for s in plan.steps] == ["verify"], "a template is not a step of the run"
    assert plan.when_needed_list() == [{"name": "reconcile", "where": "login", "purpose": "after a drop",
                                        "argv": ["/agent", "alloc-reconcile", "--attempt", "<attempt>"]}]
    with pytest.raises(ValueError, match="already planned"):
        plan.add_when_needed("reconcile", "login", ["/x"], "twice")
    copy1 = plan.again("reconcile", "reconcile")
    copy2 = plan.again(template, "reconcile-2", "the second try")
    again = plan.again(first, "verify-again", after=first)
    assert [s.name for s in plan.steps] == ["verify", "verify-again", "reconcile", "reconcile-2"]
    assert copy2.purpose == "the second try" and copy1.purpose == "after a drop"
    with pytest.raises(ValueError, match="already has"):
        plan.again("reconcile", "reconcile")
    double = Double()
    execute(copy2, double, timeout=5, attempt="deploy.1")
    execute(again, double, timeout=5, active_path="/apps/v/1/bin/vq")
    assert double.ran == [["/agent", "alloc-reconcile", "--attempt", "deploy.1"],
                          ["/agent", "verify", "--path", "/apps/v/1/bin/vq"]]
    assert is_slot(template.planned_argv[-1]) and template.argv is None, "the template itself never runs"
    assert copy1.status == "planned" and is_slot(copy1.planned_argv[-1])


def test_execute_stream_runs_the_planned_argv_filled_and_the_caller_settles_it(monkeypatch):
    points: list[tuple[str, str]] = []
    monkeypatch.setattr("vq_admin.plan.failpoint", lambda point, *args: points.append((point, *args)))
    plan = Plan()
    step = plan.add("deploy", "login", ["/agent", "alloc-run", "--attempt", Slot("attempt"),
                                        Slot("progress", many=True), "--", "/site/deploy"], "deploy")
    streamed: list[list[str]] = []

    def stream(argv: list[str]) -> str:
        streamed.append(argv)
        assert points == [("step-before", "deploy")], "the step started before the stream"
        return "answer"

    assert execute_stream(step, Double(), stream, values={"attempt": "deploy.1", "progress": []}) == "answer"
    assert streamed == [["/agent", "alloc-run", "--attempt", "deploy.1", "--", "/site/deploy"]]
    assert step.argv == streamed[0] and points == [("step-before", "deploy")], "the caller settles the step"
    points.clear()
    execute_stream(step, Double(), stream, attempt="deploy.2", progress=["--progress", "10"])
    assert streamed[-1][3:6] == ["deploy.2", "--progress", "10"] and points == [("step-before", "deploy")]
    with pytest.raises(SlotError, match="no value for its slot 'attempt'"):
        execute_stream(step, Double(), stream, progress=[])
    with_env = plan.add("other", "login", ["/agent"], "x", {"A": "1"})
    with pytest.raises(SlotError, match="no environment of its own"):
        execute_stream(with_env, Double(), stream)
    assert len(streamed) == 2, "nothing streamed for a refused step"


def test_the_read_back_after_an_interrupted_deploy_is_the_planned_template(world, monkeypatch):  # noqa: F811
    make = lambda ctx: RuntimeUpdate(ctx, "cluster", "vibeqc", world["runtime_sha"], None)  # noqa: E731
    dry = run_lane(world, make, Counting(), dry_run=True)
    needed = {s["name"]: s for s in dry.plan.when_needed_list()}
    assert set(needed) == {"readback-verify", "readback-verify-readback"}
    assert "<active_path>" in needed["readback-verify-readback"]["argv"]
    real_deploy = RuntimeUpdate.deploy

    def dropped(self):  # the deploy ran, but its connection dropped: only a read-back decides
        real_deploy(self)
        return RunResult(["deploy"], "cluster", 255, b"", b"Connection closed", 0.1, interrupted="transport")

    monkeypatch.setattr(RuntimeUpdate, "deploy", dropped)
    provider = Counting()
    done = run_lane(world, make, provider, dry_run=False)
    assert done.outcome.value == "ok", done.errors
    steps = {s["name"]: s for s in done.plan.to_list()}
    planned = {s.name: s for s in done.plan.when_needed}
    assert steps["readback-verify"]["status"] == "ok"
    assert steps["readback-verify"]["purpose"] == planned["readback-verify"].purpose, "a copy of the template"
    assert steps["readback-verify-readback"]["purpose"].endswith("(in the readback-verify agent call)")
    assert steps["readback-verify"]["argv"] == [str(w) for w in planned["readback-verify"].planned_argv]
    assert len(provider.hooks("runtime_verify")) == 1, "the verify hook is asked once, when the plan is made"


def _lane(world, *, dry_run: bool = False) -> tuple[RuntimeUpdate, Session]:  # noqa: F811
    session = Session(None)
    providers = Providers.from_plugins({"counting": Counting()})
    options = RunOptions(json=True, dry_run=dry_run)
    ctx = RunContext(world["config"], StateDir(world["state"]), session, providers, options)
    return RuntimeUpdate(ctx, "cluster", "vibeqc", world["runtime_sha"], None), session


def _record(lane: RuntimeUpdate, attempt: str) -> None:
    lane.receipt.id = "r-test"
    allocation_attempt.record(lane.inputs, attempt, f"/scratch/.vq-admin/runtime-deploy/vibeqc/{attempt}")


def _planned_with_a_record(lane: RuntimeUpdate) -> tuple[str, Step]:
    """Record an attempt as an interrupted run would, make the plan; the attempt and its planned step."""
    attempt = new_attempt_name()
    _record(lane, attempt)
    lane.make_plan()
    return attempt, lane.receipt.plan.get("previous-attempt")


def test_previous_attempt_is_planned_from_the_record_the_plan_saw(world):  # noqa: F811
    lane, session = _lane(world)
    with session:
        first, step = _planned_with_a_record(lane)
        assert step.planned_argv[-4:] == ["--attempt", first, "--timeout", "1"]
        names = [s.name for s in lane.receipt.plan.steps]
        assert names.index("previous-attempt") < names.index("pre-verify"), "its end comes first"
        allocation_attempt.clear(lane.inputs)  # cleared after planning (another run reconciled it)
        allocation_attempt.reconcile_previous(lane.inputs)
        assert step.status == "skipped" and step.argv is None
        _record(lane, new_attempt_name())  # another attempt recorded after planning
        with pytest.raises(Locked, match="appeared or changed after this run was planned"):
            allocation_attempt.reconcile_previous(lane.inputs)
        assert step.argv is None, "nothing ran"
    other, session = _lane(world)
    with session:
        allocation_attempt.clear(other.inputs)
        other.make_plan()
        assert not other.receipt.plan.has("previous-attempt")
        _record(other, new_attempt_name())  # appeared after planning
        with pytest.raises(Locked, match="appeared or changed"):
            allocation_attempt.reconcile_previous(other.inputs)


def test_the_source_step_records_the_git_archive_that_ran(world, monkeypatch):  # noqa: F811
    """The planned ``source`` argv is the one ``make_archive`` runs (``--end-of-options`` and all)."""
    from vq_admin import source

    ran: list[list[str]] = []
    real = source.run_local_argv

    def spy(argv, *args, **kwargs):
        ran.append(list(argv))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(source, "run_local_argv", spy)
    make = lambda ctx: RuntimeUpdate(ctx, "cluster", "vibeqc", world["runtime_sha"], None)  # noqa: E731
    dry = run_lane(world, make, Counting(), dry_run=True)
    done = run_lane(world, make, Counting(), dry_run=False)
    assert done.outcome.value == "ok", done.errors
    planned = next(s for s in dry.plan.to_list() if s["name"] == "source")["argv"]
    recorded = next(s for s in done.plan.to_list() if s["name"] == "source")["argv"]
    archives = [argv for argv in ran if "archive" in argv]
    assert archives == [recorded], "what the receipt says ran is what ran"
    assert planned[-2:] == ["--end-of-options", world["runtime_sha"]] and planned[-3] == "<workdir>/source.tar"
    workdir = recorded[-3][: -len("/source.tar")]  # the run's one slot: every planned word, filled, is what ran
    assert [getattr(w, "text", w).replace("<workdir>", workdir) for w in planned] == recorded


def test_a_planned_previous_attempt_runs_its_planned_argv_and_clears_the_record(world):  # noqa: F811
    """The record the plan saw is still there: the planned reconcile runs (the real agent, which finds
    no job under that attempt: it never started, so the attempt is fenced and counts as ended)."""
    lane, session = _lane(world)
    with session:
        attempt, step = _planned_with_a_record(lane)
        allocation_attempt.reconcile_previous(lane.inputs)
        assert step.argv == step.planned_argv and step.status == "ok", (step.status, step.detail)
        assert lane.receipt.previous_attempt.attempt == attempt
        assert not allocation_attempt._path(lane.inputs).exists(), "ended: the record is cleared"
