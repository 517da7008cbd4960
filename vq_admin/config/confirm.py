"""The confirmation keys of a runtime profile (CONTRACT section 13): ``confirm_command``,
``confirm_sbatch_args`` (the allow-list of ``update_allocation``'s, :mod:`.sbatch_args`),
``confirm_timeout_seconds`` and ``confirm_metrics``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..document import JsonObject

KEYS = {"confirm_command", "confirm_sbatch_args", "confirm_timeout_seconds", "confirm_metrics"}
BETTER = ("lower", "higher", "equal")


@dataclass(frozen=True)
class Metric:
    """One declared metric: which way is better and the relative tolerance."""

    name: str
    better: str
    tolerance: float

    def word(self) -> str:
        """As the agent's ``--metric`` takes it: ``NAME=BETTER:TOLERANCE``."""
        return f"{self.name}={self.better}:{self.tolerance:g}"


@dataclass(frozen=True)
class Confirm:
    """How a new generation is proven by a batch job."""

    command: tuple[str, ...]
    sbatch_args: tuple[str, ...] = ()
    timeout_seconds: float = 900.0
    metrics: tuple[Metric, ...] = ()

    def settings(self) -> JsonObject:
        return {"command": list(self.command), "sbatch_args": list(self.sbatch_args),
                "timeout_seconds": self.timeout_seconds,
                "metrics": {m.name: {"better": m.better, "tolerance": m.tolerance} for m in self.metrics}}
