"""docs/json.md's receipt tables against the receipt's section types (vq_admin.report.sections): each member a
type declares is documented in its section's row, and each member named there is declared."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from vq_admin.report import sections
from vq_admin.report.receipt import Receipt
from vq_admin.report.sections import Readback, Rollback, Section, Stage

DOCS = Path(__file__).parent.parent / "docs" / "json.md"
#: A code span naming one member (``where``), or an object of them (``{"from", "to", "via"}``).
NAME = re.compile(r"\A[a-z][a-z0-9_]*\Z")
QUOTED = re.compile(r'"([a-z][a-z0-9_]*)"')


def section_types() -> dict[str, type[Section]]:
    """Each receipt field whose type is a section, by the field's name."""
    hints = {name: hint for name, hint in Receipt.__annotations__.items()}
    found = {}
    for name, hint in hints.items():
        for candidate in vars(sections).values():
            if isinstance(candidate, type) and issubclass(candidate, Section) and candidate is not Section \
                    and re.search(rf"\b{candidate.__name__}\b", str(hint)):
                found[name] = candidate
    return found


def documented(name: str, text: str | None = None) -> set[str]:
    """The members docs/json.md names in the row of *name* (a table row ``| `name` | ... |``)."""
    text = DOCS.read_text() if text is None else text
    rows = [line for line in text.splitlines() if re.match(rf"\A\| `{name}` \|", line)]
    assert len(rows) == 1, f"docs/json.md has {len(rows)} rows for the receipt's {name!r}"
    names: set[str] = set()
    for span in re.findall(r"`([^`]*)`", rows[0].split("|")[2]):
        if NAME.match(span):
            names.add(span)
        elif span.startswith("{"):
            names.update(QUOTED.findall(span))
    return names


#: Names in a section's row that no type declares: the profile key that asks for it, and a member of a free-form
#: object inside it (``revert``: the agent's own record of what ran).
NOT_DECLARED = {"confirm": {"confirm_command", "argv"}}


def declared(section: type[Section]) -> set[str]:
    """The members *section* declares, with those of the sections it holds."""
    names = set()
    for field in msgspec.structs.fields(section):
        names.add(field.encode_name)
        names.update(*(declared(t) for t in nested(field.type)))
    return names


def nested(hint: object) -> list[type[Section]]:
    if isinstance(hint, type) and issubclass(hint, Section):
        return [hint]
    return [t for arg in getattr(hint, "__args__", ()) for t in nested(arg)]


def test_every_section_type_is_a_receipt_field() -> None:
    found = set(section_types().values())
    found |= {inner for t in found for field in msgspec.structs.fields(t) for inner in nested(field.type)}
    types = {t for t in vars(sections).values() if isinstance(t, type) and issubclass(t, Section) and t is not Section}
    assert found == types, f"section types no receipt field holds: {types - found}"


@pytest.mark.parametrize("name", sorted(section_types()))
def test_each_member_of_a_section_is_documented_and_each_documented_member_declared(name: str) -> None:
    members, shown = declared(section_types()[name]) | NOT_DECLARED.get(name, set()), documented(name)
    assert members - shown == set(), f"receipt {name}: declared but not in docs/json.md: {sorted(members - shown)}"
    assert shown - members == set(), f"receipt {name}: in docs/json.md but not declared: {sorted(shown - members)}"


def test_the_check_fails_for_a_member_added_without_docs() -> None:
    class Grown(Stage, frozen=True, kw_only=True):
        extra: int = 0

    row = "| `stage` | a source archive was staged (`where`, `dir`) |\n"
    assert declared(Grown) - documented("stage", row) == {"extra"}
    row = '| `rollback` | a `vq admin rollback`: `{"from", "to", "via"}` |'
    assert documented("rollback", row) == {"from", "to", "via"}


def test_a_section_writes_what_it_declares_and_nothing_unset() -> None:
    assert Rollback(from_=None, to="a" * 40, via="activate").to_value() == {"from": None, "to": "a" * 40,
                                                                             "via": "activate"}
    assert Readback(read="nothing", proven=False, next_command=None).to_value() == {
        "read": "nothing", "proven": False, "next_command": None}
    with pytest.raises(msgspec.ValidationError, match="unknown field `made_up`"):
        msgspec.convert({"where": "h", "dir": "/d", "made_up": 1}, Stage)
