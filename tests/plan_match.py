"""Compare a receipt's executed steps with the dry-run plan of the same run.

The rule under test: a receipt is the plan with each step's result filled in,
so every executed step's argv is its planned argv (as ``--dry-run`` prints
it) with the slot markers (``<stage>``, ``<tree_sha256>``, ...) filled, and
the same marker is filled with the same value in every step of one run.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"<([a-z0-9][a-z0-9_ |]*)>")


def fill_word(planned: str, actual: str, values: dict[str, str]) -> bool:
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


def slot_values(plan_steps: list[dict], ran_steps: list[dict], *, names: set[str] | None = None) -> dict[str, str]:
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
        assert len(want["argv"]) == len(step["argv"]), (step["name"], want["argv"], step["argv"])
        for p, a in zip(want["argv"], step["argv"], strict=True):
            assert fill_word(p, a, values), (step["name"], p, a, values)
        for key, p in (want.get("env") or {}).items():
            assert fill_word(p, step["env"][key], values), (step["name"], key, p, step["env"][key])
        compared.add(step["name"])
    if names is not None:
        assert compared == names, (sorted(compared), sorted(names))
    return values
