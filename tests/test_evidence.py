"""The verify receipt parser and the immutable-launcher rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support import NOTHING_ACTIVE
from vq_admin.evidence import receipt_checks
from vq_admin.launcher.immutable import launcher_problem
from vq_admin_hookspecs import EvidenceError, VerifyReceipt

SHA = "ab" * 20
GOOD = {"program": "vibeqc", "source_sha": SHA, "tag": None, "healthy": True, "activation": "atomic", "quiescent": True,
        "updater_pid": None, "active_path": f"/apps/releases/{SHA}/source/.venv/bin/python",
        "active_path_sha256": "f" * 64}


def test_a_good_receipt_passes_every_check():
    receipt = VerifyReceipt.parse(json.dumps(GOOD))
    assert all(c.ok for c in receipt_checks(receipt, "vibeqc", SHA, None))


@pytest.mark.parametrize("text,message", [
    ("", "empty"),
    (json.dumps(GOOD) + json.dumps(GOOD), "more than one JSON document"),
    ("[1, 2]", "not an object"),
    ('{"program": "a", "program": "b"}', "appears twice"),
    (json.dumps(dict(GOOD, healthy="yes")), "'healthy' must be bool"),
    (json.dumps(dict(GOOD, updater_pid=True)), "'updater_pid' is a boolean"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "quiescent"}), "no field 'quiescent'"),
    (json.dumps(dict(GOOD, active_path=None)), "'active_path' must be str, not NoneType"),  # healthy: no null
    (json.dumps(dict(NOTHING_ACTIVE, program=None)), "'program' must be str, not NoneType"),
    ('{"x": NaN}', "non-standard JSON constant"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_malformed_receipts_are_evidence_errors(text, message):
    with pytest.raises(EvidenceError, match=message):
        VerifyReceipt.parse(text)


def test_a_receipt_of_nothing_active_parses_and_proves_nothing():
    """CONTRACT section 4 (version 3): with healthy false the three fields may be null, read as ""."""
    receipt = VerifyReceipt.parse(json.dumps(NOTHING_ACTIVE))
    assert (receipt.source_sha, receipt.active_path, receipt.active_path_sha256) == ("", "", "")
    failed = {c.name for c in receipt_checks(receipt, "vibeqc", SHA, None) if not c.ok}
    assert failed == {"source_sha", "healthy", "activation", "active_path", "active_path_sha256_form"}


def test_non_utf8_and_huge_receipts_are_refused():
    with pytest.raises(EvidenceError, match="not UTF-8"):
        VerifyReceipt.parse(b'{"program": "\xff"}')
    with pytest.raises(EvidenceError, match="larger than"):
        VerifyReceipt.parse(b" " * (2 << 20))


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.binary(max_size=400), st.text(max_size=400),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                              lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(sorted(GOOD)), c,
                                                                                  max_size=10),
                              max_leaves=20).map(json.dumps)))
def test_fuzzed_receipts_parse_or_raise_evidence_errors(raw):
    try:
        receipt = VerifyReceipt.parse(raw)
    except EvidenceError:
        return
    checks = receipt_checks(receipt, "vibeqc", SHA, None)
    assert all(isinstance(c.ok, bool) for c in checks)


@pytest.mark.parametrize("path,ok", [
    (f"/apps/releases/{SHA}/source/.venv/bin/python", True),
    (f"/apps/bin/vibeqc-{SHA}", True),
    ("/apps/current/source/.venv/bin/python", False),
    (f"/apps/current/bin/vibeqc-{SHA}", False),
    ("/apps/bin/vibeqc", False),
    ("/usr/bin/python3", False),
    (f"/apps/releases/{SHA[:12]}/source/.venv/bin/python", False),
    (f"relative/releases/{SHA}/source/.venv/bin/python", False),
    (f"/apps/releases/../releases/{SHA}/source/.venv/bin/python", False),
    (f"/apps/releases/{'cd' * 20}/source/.venv/bin/python", False),
])
def test_the_immutable_launcher_rule(path, ok):
    assert (launcher_problem(path, SHA) is None) is ok


def test_the_contract_packages_public_helpers_stay():
    # vq-admin-hookspecs is installed alone by provider authors: its public members are its API, whether
    # or not this tree calls them (removing one needs a major version, docs/providers.md)
    from vq_admin_hookspecs import PruneReport, Slot

    assert VerifyReceipt.from_mapping(GOOD) == VerifyReceipt.parse(json.dumps(GOOD))
    with pytest.raises(EvidenceError):
        VerifyReceipt.from_mapping({**GOOD, "healthy": "yes"})
    report = PruneReport.parse(json.dumps({"removed": [SHA], "kept": ["cd" * 20]}))
    assert report.to_dict() == {"removed": [SHA], "kept": ["cd" * 20]}
    assert Slot("stage", prefix="--stage=").marker == "<stage>"
