"""Build ``vq-admin-agent.pyz`` (``python3 -m vq_admin.agent.pyz [OUT]``, default
``./vq-admin-agent.pyz``): the helper as one file, for a login host that has a Python (3.8 or
later) and nothing else.

The archive (:mod:`zipapp` layout, its first line ``#!/usr/bin/env python3``) holds exactly
``vq_admin/__init__.py``, ``vq_admin/core/*.py`` and ``vq_admin/agent/*.py`` of the tree it is
built from, plus a ``__main__.py`` that calls :func:`vq_admin.agent.cli.main`: no bytecode, no
driver module, no third-party package.  Member timestamps are fixed, so the same tree builds the
same bytes.
"""

from __future__ import annotations

import os
import sys
import zipfile
from typing import BinaryIO, List, Optional

from ..core import atomic

INTERPRETER = "/usr/bin/env python3"
MAIN = (
    "# vq-admin-agent.pyz entry point (written by vq_admin.agent.pyz)\n"
    "import sys\n"
    "sys.dont_write_bytecode = True\n"
    "from vq_admin.agent.cli import main\n"
    "sys.exit(main())\n"
)
#: A fixed member timestamp: the archive's bytes depend on the sources only.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def members(tree: str) -> List[str]:
    """Paths (relative to *tree*, the directory above ``vq_admin``) that go into the archive."""
    found = ["vq_admin/__init__.py"]
    for package in ("core", "agent"):
        names = sorted(n for n in os.listdir(os.path.join(tree, "vq_admin", package)) if n.endswith(".py"))
        found += [f"vq_admin/{package}/{n}" for n in names if n != "__main__.py"]
    return found


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def build(out: str, tree: Optional[str] = None, interpreter: str = INTERPRETER) -> str:
    """Write the archive to *out* (atomically: temp file + rename); returns *out*."""
    if tree is None:
        tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    def fill(fh: BinaryIO) -> None:
        fh.write(b"#!" + interpreter.encode("utf-8") + b"\n")
        with zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for rel in members(tree):
                with open(os.path.join(tree, rel), "rb") as src:
                    _add(zf, rel, src.read())
            _add(zf, "__main__.py", MAIN.encode())

    atomic.write(out, fill, mode=0o755)  # a new temporary file, never through a planted symlink
    return out


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or (args and args[0].startswith("-")):
        print("usage: python3 -m vq_admin.agent.pyz [OUT]", file=sys.stderr)
        return 2
    out = build(args[0] if args else "vq-admin-agent.pyz")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
