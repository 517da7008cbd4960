"""``verify``: read-only report of what IS active, as one JSON object on stdout.

The receipt (CONTRACT section 4; its fields in README.md, "verify") is built only from the
runtime root, never from the request: ``--program``, ``--expected-sha`` and ``--tag`` are
mentioned in ``health_detail`` but never copied into a field.  When nothing is active it
still prints a receipt and exits 0; usage errors exit 2 and print nothing on stdout.
"""

from __future__ import annotations

import argparse
import json
import os

from . import build, fsutil
from .layout import Layout, probe_quiescent, release_named

#: Seconds the health command (one start of the launcher) may take.
HEALTH_TIMEOUT = 60

TYPE_CHECKING = False  # not typing's: this command runs on every update and loads no more than it needs
if TYPE_CHECKING:
    from typing import TypedDict

    class Receipt(TypedDict):
        """The verify receipt as :class:`vq_admin_hookspecs.VerifyReceipt` reads it (CONTRACT section 4); this host
        command does not import that package, which loads pluggy."""

        program: str
        source_sha: str
        tag: str | None
        healthy: bool
        activation: str
        quiescent: bool
        updater_pid: int | None
        active_path: str
        active_path_sha256: str
        health_detail: str


def _meta(release: str, name: str, problems: list[str]) -> str | None:
    try:
        return fsutil.read_small(os.path.join(release, name)).strip()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"cannot read {name}: {exc}")
        return None


def inspect(lyt: Layout) -> Receipt:
    """Build the verify receipt for the runtime root *lyt*."""
    quiescent, pid = probe_quiescent(lyt)
    receipt: Receipt = {
        "program": "", "source_sha": "", "tag": None, "healthy": False, "activation": "none",
        "quiescent": quiescent, "updater_pid": pid, "active_path": "", "active_path_sha256": "",
        "health_detail": "",
    }
    problems: list[str] = []
    notes: list[str] = [] if quiescent else [f"a deploy holds {lyt.lock_path} (pid {pid})"]
    sha = _active_sha(lyt, receipt, notes, problems)
    if sha is not None:
        _read_release(lyt, sha, receipt, notes, problems)
    receipt["health_detail"] = "; ".join(notes + problems)
    receipt["healthy"] = not problems and receipt["activation"] == "atomic"
    return receipt


def _active_sha(lyt: Layout, receipt: Receipt, notes: list[str], problems: list[str]) -> str | None:
    """The SHA ``current`` activates (a real ``releases/<full sha>`` directory: ``atomic``), or ``None``, the
    problem named."""
    if not fsutil.is_real_dir(lyt.root):
        problems.append(f"nothing active: {lyt.root} is not a real directory")
        return None
    try:
        target = os.readlink(lyt.current)
    except FileNotFoundError:
        problems.append(f"nothing active: {lyt.current} does not exist")
        return None
    except OSError:
        problems.append(f"{lyt.current} is not a symlink; no atomic activation")
        return None
    sha = release_named(lyt, target)
    if sha is None or not fsutil.is_real_dir(lyt.release(sha)):
        receipt["activation"] = "unknown"
        problems.append(f"{lyt.current} -> {target!r} is not a real releases/<full sha> directory")
        return None
    receipt["activation"] = "atomic"
    notes.append(f"current -> {target}")
    return sha


def _read_release(lyt: Layout, sha: str, receipt: Receipt, notes: list[str], problems: list[str]) -> None:
    """What the active release records of itself, its launcher's SHA-256, and one start of the launcher."""
    release = lyt.release(sha)
    source_sha = _meta(release, "SOURCE-SHA", problems)
    program = _meta(release, "PROGRAM", problems)
    receipt.update({"source_sha": source_sha or "", "program": program or "",
                    "tag": _meta(release, "TAG", problems) or None})
    if source_sha is not None and source_sha != sha:
        problems.append(f"SOURCE-SHA {source_sha} differs from the release directory name {sha}")
    validated = _meta(release, "VALIDATED", problems)
    if validated:
        notes.append(f"marker: {validated}")
    if not program:
        problems.append("no launcher: the release names no program")
        return
    launcher = receipt["active_path"] = lyt.launcher(sha, program)
    try:
        receipt["active_path_sha256"] = fsutil.sha256_file(launcher)
    except OSError as exc:
        problems.append(f"cannot hash the launcher {launcher}: {exc.strerror or exc}")
        return
    ok, detail, output = build.check(launcher, os.path.join(release, "source"), HEALTH_TIMEOUT)
    if ok:
        notes.append(detail)
        return
    lines = output.strip().splitlines()
    problems.append(detail + (f": {' / '.join(lines[-3:])[-300:]}" if lines else ""))


def run(ns: argparse.Namespace) -> int:
    """Entry point of the ``verify`` verb: print the receipt, exit 0."""
    receipt = inspect(Layout(ns.root))
    requested = f"requested {ns.program} {ns.expected_sha} tag {ns.tag or '-'}"
    receipt["health_detail"] = f"{receipt['health_detail']}; {requested}".lstrip("; ")
    print(json.dumps(receipt))
    return 0
