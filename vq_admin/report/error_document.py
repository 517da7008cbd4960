"""The one JSON document of a run that ended with an error before any verb printed its own: a lane
verb's receipt (:func:`vq_admin.lanes.runner.error_document`), else the envelope's error document."""

from __future__ import annotations

import argparse
from typing import Any

from .outcome import VqAdminError


def error_document(args: argparse.Namespace | None, error: VqAdminError) -> dict[str, Any]:
    if args is not None and getattr(args, "verb", None) in ("update", "rollback", "prune"):
        from ..lanes.runner import error_document as lane_error_document

        return lane_error_document(args, error)
    from .envelope import SCHEMAS, document

    return document(SCHEMAS["error"], error.outcome, None, [error.message])
