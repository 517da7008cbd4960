"""A record that cannot be stored after the receipt is named in the receipt; the run still concludes.

The registry entry is written after the receipt; when that write is refused
(``RegistryError``, a ``ValueError``: an unsafe state tree) the receipt says
so.  ``conclude`` once read ``exc.strerror`` from it and crashed with
``AttributeError`` instead (found by ``mypy --strict``).
"""

from __future__ import annotations

from vq_admin.launcher import registry
from vq_admin.context import RunContext
from vq_admin.lanes.conclude import conclude
from vq_admin.report.outcome import Outcome
from vq_admin.report.receipt import Receipt
from vq_admin.state.records import StateDir, Verified, utc_now

SHA = "a" * 40


def test_a_refused_registry_write_is_reported_not_a_crash(tmp_path, monkeypatch):
    def plan_verified(*args: object) -> tuple[dict[str, object], object]:
        def apply() -> None:
            raise registry.RegistryError("registry/cluster is group-writable")
        return {"entry": "registry/cluster/vibeqc/" + SHA + ".json", "created": True, "conflict": None}, apply

    monkeypatch.setattr(registry, "plan_verified", plan_verified)
    state = StateDir(tmp_path / "state")
    ctx = RunContext(None, state, None, None)  # type: ignore[arg-type]  # conclude reads options and state only
    receipt = Receipt("runtime", "cluster", "vibeqc", SHA, None, utc_now())
    concluded = conclude(ctx, receipt, Outcome.OK, Verified(sha=SHA, launcher="/x", launcher_sha256="b" * 64))
    assert concluded.not_stored == [
        "the registry entry of the verified launcher: registry/cluster is group-writable"]
    assert any("could not store the registry entry" in e and "group-writable" in e for e in concluded.errors)


def test_a_refused_lane_record_is_named_not_a_crash(tmp_path, monkeypatch):
    def record_run(*args: object) -> None:
        raise ValueError("hosts/cluster is a symlink")

    state = StateDir(tmp_path / "state")
    monkeypatch.setattr(state, "record_run", record_run)
    ctx = RunContext(None, state, None, None)  # type: ignore[arg-type]  # conclude reads options and state only
    receipt = Receipt("helper", "cluster", None, SHA, None, utc_now())
    concluded = conclude(ctx, receipt, Outcome.OK, Verified(sha=SHA))
    assert concluded.not_stored == ["the lane records (last.json, LAST OK, LAST GOOD): hosts/cluster is a symlink"]
    assert concluded.stored is not False
    assert any("could not store the lane records" in e and "was stored" in e for e in concluded.errors)
    assert (tmp_path / "state" / "admin.log").read_text().count("\n") == 1
