"""Compare a receipt's executed steps with the dry-run plan of the same run.

The rule under test: a receipt is the plan with each step's result filled in,
so every executed step's argv is its planned argv (as ``--dry-run`` prints
it) with the slot markers (``<stage>``, ``<tree_sha256>``, ...) filled, and
the same marker is filled with the same value in every step of one run.

A list slot prints as one word ``[W... <label>]...`` (``[--keep <kept sha>]...``,
``[<progress>]...``) and stands for zero or more groups of words, each the
words ``W...`` then one value; its value is the list of those values.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"<([a-z0-9][a-z0-9_ |]*)>")
LIST_MARKER = re.compile(r"\A\[((?:[^\s<>\[\]]+ )*)([^\s<>\[\]]*)<([a-z0-9][a-z0-9_ |]*)>([^\s<>\[\]]*)\]\.\.\.\Z")


def fill_list(planned: str, actual: list[str], values: dict[str, object]) -> bool:
    """True when the words *actual* are the list slot *planned* filled; records the list of values."""
    found = LIST_MARKER.match(planned)
    assert found is not None, planned
    before, prefix, label, suffix = found.group(1).split(), found.group(2), found.group(3), found.group(4)
    size = len(before) + 1
    if len(actual) % size:
        return False
    items = []
    for at in range(0, len(actual), size):
        group = actual[at:at + size]
        item = group[-1]
        if group[:-1] != before or not (item.startswith(prefix) and item.endswith(suffix)):
            return False
        value = item[len(prefix):len(item) - len(suffix)]
        if not value or "<" in value or ">" in value:
            return False
        items.append(value)
    return values.setdefault(label, items) == items


def fill_word(planned: str, actual: str, values: dict[str, object]) -> bool:
    """True when *actual* is *planned* with its marker (if any) filled; records the value."""
    found = MARKER.search(planned)
    if found is None:
        return planned == actual
    head, tail = planned[:found.start()], planned[found.end():]
    if not (actual.startswith(head) and actual.endswith(tail) and len(actual) > len(head) + len(tail)):
        return False
    value = actual[len(head):len(actual) - len(tail)]
    if "<" in value or ">" in value:  # an unfilled marker ran
        return False
    label = found.group(1)
    return values.setdefault(label, value) == value


def slot_values(plan_steps: list[dict], ran_steps: list[dict], *, names: set[str] | None = None) -> dict[str, object]:
    """Assert every executed step of *ran_steps* (receipt ``steps``) named in *plan_steps* (the dry
    run's ``steps``) ran its planned argv with slots filled; return the filled values by marker."""
    planned = {s["name"]: s for s in plan_steps}
    values: dict[str, str] = {}
    compared = set()
    for step in ran_steps:
        if step["status"] in ("planned", "skipped") or step["name"] not in planned:
            continue
        if names is not None and step["name"] not in names:
            continue
        want = planned[step["name"]]
        assert want["where"] == step["where"], step["name"]
        wanted, actual = list(want["argv"]), list(step["argv"])
        lists = [i for i, word in enumerate(wanted) if LIST_MARKER.match(word)]
        assert len(lists) <= 1, (step["name"], "compares at most one list slot per argv", wanted)
        if lists:  # the words around it match one to one; it takes what is left between them
            at, tail = lists[0], len(wanted) - lists[0] - 1
            taken = actual[at:len(actual) - tail]
            assert len(actual) >= len(wanted) - 1, (step["name"], wanted, actual)
            assert fill_list(wanted[at], taken, values), (step["name"], wanted[at], taken, values)
            wanted, actual = wanted[:at] + wanted[at + 1:], actual[:at] + actual[len(actual) - tail:]
        assert len(wanted) == len(actual), (step["name"], want["argv"], step["argv"])
        for p, a in zip(wanted, actual, strict=True):
            assert fill_word(p, a, values), (step["name"], p, a, values)
        for key, p in (want.get("env") or {}).items():
            assert fill_word(p, step["env"][key], values), (step["name"], key, p, step["env"][key])
        compared.add(step["name"])
    if names is not None:
        assert compared == names, (sorted(compared), sorted(names))
    return values
