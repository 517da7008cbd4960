"""``vq admin update HOST``: the helper lane (see issue 5; not built yet)."""

from __future__ import annotations

import argparse

from ..outcome import UsageError


def run_helper(args: argparse.Namespace, host: str, sha: str | None) -> int:
    raise UsageError("the helper lane (vq admin update HOST) is not available in this version")
