"""The members of the typed documents of ``history``, ``status`` and ``references`` are the ones the
documentation's field tables name (docs/json.md; a census generation's in docs/bindings.md)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from vq_admin.commands.history import HostRun
from vq_admin.commands.status import HostStatus, LaneStatus, LastOkRow, Status, StatusAll
from vq_admin.launcher.references import Census, Generation, JobMatch
from vq_admin.state.history import Run

DOCS = Path(__file__).resolve().parent.parent / "docs"


def row(doc: str, schema: str) -> str:
    """The paragraph or table row of *doc* that describes *schema*."""
    found = [line for line in (DOCS / doc).read_text().split("\n\n") if f"`{schema}`" in line
             and ("|" in line or "JSON (schema" in line)]
    assert found, f"{doc} has no row for {schema}"
    return found[0]


@pytest.mark.parametrize("doc, schema, types", [
    ("json.md", "vq-admin/history/1", (Run, HostRun)),
    ("json.md", "vq-admin/status/1", (Status, HostStatus, LaneStatus)),
    ("json.md", "vq-admin/status-all/1", (StatusAll, LastOkRow)),
    ("json.md", "vq-admin/references/1", (Census, JobMatch)),
    ("bindings.md", "vq-admin/references/1", (Generation,)),
])
def test_every_member_is_documented(doc: str, schema: str, types: tuple[type, ...]) -> None:
    text = row(doc, schema)
    for kind in types:
        for field in msgspec.structs.fields(kind):
            assert re.search(rf"\b{re.escape(field.encode_name)}\b", text), f"{kind.__name__}.{field.name}: {doc}"
