"""The deploy step inside a Slurm allocation (``update_allocation``).

(Issue 3 builds this; until then such a profile is refused before anything runs.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vq_admin_hookspecs import ProviderCommand

from ..outcome import UsageError
from ..transport import RunResult

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate


def plan(update: "RuntimeUpdate", command: ProviderCommand, purpose: str) -> None:
    raise UsageError("update_allocation is not supported by this version yet")


def deploy(update: "RuntimeUpdate", command: ProviderCommand) -> RunResult:
    raise UsageError("update_allocation is not supported by this version yet")
