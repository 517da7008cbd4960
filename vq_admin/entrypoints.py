"""Entry points of one group, read from the installed distributions' metadata
files, without :mod:`importlib.metadata`.

Every update with a plugin provider looks its provider up, and importing
``importlib.metadata`` (email, zipfile, csv, pathlib, ...) costs more than the
rest of an already-current run's imports together.  This reads what it reads:
for each directory on ``sys.path``, each ``*.dist-info`` / ``*.egg-info``
directory's ``entry_points.txt`` (an INI file: ``[group]`` then ``name =
value`` lines) and, only for a distribution that offers the group, the
``Name:`` and ``Version:`` headers of its ``METADATA`` / ``PKG-INFO``.
Nothing is imported until :func:`load` is called for one chosen entry point.
"""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

#: ``module[:attr[.attr...]] [extras]``, as the entry-point specification writes it.
_VALUE_RE = re.compile(r"\A(?P<module>[\w.]+)\s*(?::\s*(?P<attr>[\w.]+)\s*)?(?:\[[^\]]*\]\s*)?\Z")
_METADATA_FILES = {".dist-info": "METADATA", ".egg-info": "PKG-INFO"}


class EntryPoint(NamedTuple):
    name: str
    value: str
    distribution: str
    version: str


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """``(name, value)`` pairs of ``[group]`` in an ``entry_points.txt``."""
    found, inside = [], False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == group
            continue
        if inside:
            name, sep, value = line.partition("=")
            if sep:
                found.append((name.strip(), value.strip()))
    return found


def _headers(path: str) -> dict[str, str]:
    """The first ``Name:`` and ``Version:`` headers of a metadata file."""
    found: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the end of the headers
                key, sep, value = line.partition(":")
                if sep and key in ("Name", "Version") and key not in found:
                    found[key] = value.strip()
    except OSError:
        pass
    return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def entry_points(group: str) -> list[EntryPoint]:
    """Every entry point of *group* offered by a distribution on ``sys.path``, in path order."""
    found: list[EntryPoint] = []
    seen: set[str] = set()
    for entry in sys.path:
        directory = os.path.realpath(entry or os.getcwd())
        if directory in seen:
            continue
        seen.add(directory)
        try:
            names = sorted(os.listdir(directory))
        except OSError:  # missing, not a directory (a zip file), unreadable
            continue
        for name in names:
            suffix = next((s for s in _METADATA_FILES if name.endswith(s)), None)
            if suffix is None:
                continue
            info = os.path.join(directory, name)
            text = _read(os.path.join(info, "entry_points.txt"))
            pairs = _section(text, group) if text else []
            if not pairs:
                continue
            headers = _headers(os.path.join(info, _METADATA_FILES[suffix]))
            dist = headers.get("Name") or name[: -len(suffix)].split("-")[0] or "?"
            version = headers.get("Version") or "?"
            found.extend(EntryPoint(ep, value, dist, version) for ep, value in pairs)
    return found


def load(value: str) -> object:
    """Import the object an entry point's *value* names (``module[:attr.attr]``)."""
    match = _VALUE_RE.match(value)
    if match is None:
        raise ValueError(f"entry point value {value!r} is not module[:attribute]")
    import importlib

    target: object = importlib.import_module(match.group("module"))
    for attr in filter(None, (match.group("attr") or "").split(".")):
        target = getattr(target, attr)
    return target
