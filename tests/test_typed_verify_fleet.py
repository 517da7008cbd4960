"""The verify, fleet and check-connect documents as types: what is written, null against absent, and
what a malformed agent answer becomes (one line naming the field)."""

from __future__ import annotations

import pytest
from vq_admin_hookspecs import Slot

from vq_admin.commands.verify import Active, Expected, RuntimeCheck, VerifyDocument, outcome_of
from vq_admin.document import Document, DocumentError
from vq_admin.fleet import FleetHost, WorkerAnswer
from vq_admin.lanes.confirm_step import HealthJob
from vq_admin.report.outcome import Outcome
from vq_admin.ssh.connect_check import Sinfo, VersionFacts

SHA = "a" * 40


def test_expected_writes_from_and_a_runtime_writes_lease_record_confirm_only_when_known() -> None:
    entry = RuntimeCheck(expected=Expected(sha=SHA, source="expected-sha"), detail="x")
    value = entry.to_value()
    assert list(value) == ["expected", "active", "steps", "verify", "state", "detail"]
    assert value["expected"] == {"sha": SHA, "tag": None, "from": "expected-sha", "launcher": None,
                                 "launcher_sha256": None}
    current = entry.replace(state="current", active=Active(sha=SHA, tag=None, launcher="/l", launcher_sha256=None),
                            confirm=HealthJob(job_id="7", passed=True))
    assert current.to_value()["confirm"] == {"job_id": "7", "state": None, "exit_code": None, "node": None,
                                             "seconds": None, "metrics": None, "passed": True, "problems": None}
    assert RuntimeCheck.from_value(current.to_value(), "verify").active == current.active


@pytest.mark.parametrize(("states", "outcome"), [
    (["current"], Outcome.OK), (["current", "unknown", "drifted"], Outcome.UNKNOWN),
    (["deploying", "broken"], Outcome.FAILED), (["current", "deploying"], Outcome.LOCKED)])
def test_the_verify_outcome_is_the_worst_state(states: list[str], outcome: Outcome) -> None:
    doc = VerifyDocument(expected_sha=None, hosts={f"h{i}": {"p": RuntimeCheck(
        expected=Expected(sha=SHA, source="last-ok"), state=state)} for i, state in enumerate(states)})
    assert outcome_of(doc) is outcome


def test_a_fleet_host_writes_its_optional_members_only_when_known() -> None:
    bare = FleetHost(outcome="skipped", exit_code=None, receipt=None, role="build", reason="never touched")
    assert bare.to_value() == {"outcome": "skipped", "exit_code": None, "receipt": None, "role": "build",
                               "reason": "never touched"}
    ran = FleetHost(outcome="failed", exit_code=1, receipt="r", role="managed", seconds=1.5, errors=["e"])
    assert ran.to_value()["errors"] == ["e"] and "shares_lease_with" not in ran.to_value()


@pytest.mark.parametrize(("kind", "value", "field"), [
    (WorkerAnswer, {"outcome": "ok", "exit_code": "0"}, "$.exit_code"),
    (WorkerAnswer, {"outcome": "ok", "lease": {"waited": {"siblings": [{"pid": "1"}]}}}, "$.lease.waited"),
    (VersionFacts, {"version": "1", "sinfo": {"states": {"idle": "2"}}}, "$.sinfo.states"),
    (HealthJob, {"job_id": 7}, "$.job_id")])
def test_a_malformed_answer_is_one_line_naming_the_field(kind: type[Document], value: object, field: str) -> None:
    with pytest.raises(DocumentError) as caught:
        kind.from_value(value, "the answer")
    assert str(caught.value).startswith("the answer: ") and field in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_planned_argv_slot_is_written_as_its_text() -> None:
    class Step(Document, frozen=True, kw_only=True):
        argv: list[str]

    assert Step(argv=["agent", Slot("attempt")]).to_value() == {"argv": ["agent", "<attempt>"]}
    assert Sinfo(error="not reported").to_value() == {"error": "not reported"}
