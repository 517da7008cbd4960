"""The confirmation keys of a runtime profile (CONTRACT section 13): ``confirm_command``,
``confirm_sbatch_args`` (the allow-list of ``update_allocation``'s, :mod:`.sbatch_args`),
``confirm_timeout_seconds`` and ``confirm_metrics``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

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

    def settings(self) -> dict[str, Any]:
        return {"command": list(self.command), "sbatch_args": list(self.sbatch_args),
                "timeout_seconds": self.timeout_seconds,
                "metrics": {m.name: {"better": m.better, "tolerance": m.tolerance} for m in self.metrics}}


def parse(table: Mapping[str, Any], key: str) -> Confirm | None:
    """The profile *table*'s confirmation (``None`` without ``confirm_command``); errors name the dotted key."""
    from . import ConfigError, _timeout, parse_command
    from ..core.identifiers import ENV_NAME_RE
    from .sbatch_args import sbatch_arg_problem

    command = parse_command(table, "confirm_command", key)
    if command is None:
        stray = sorted(KEYS & set(table))
        if stray:
            raise ConfigError(f"{key}.{stray[0]}", "needs confirm_command")
        return None
    if "activate_command" not in table and table.get("provider", "command") == "command":
        raise ConfigError(f"{key}.confirm_command", "needs activate_command (a failed confirmation is reverted by "
                                                    "re-activating the previous generation; a plugin "
                                                    "provider's activate hook serves)")
    args = table.get("confirm_sbatch_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{key}.confirm_sbatch_args", "must be a list of strings")
    for arg in args:  # the allow-list of update_allocation.sbatch_args
        problem = sbatch_arg_problem(arg)
        if problem:
            raise ConfigError(f"{key}.confirm_sbatch_args", problem)
    raw = table.get("confirm_metrics", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}.confirm_metrics", "must be a table of { better = \"lower\"|\"higher\"|\"equal\", "
                                                    "tolerance = 0.10 }")
    metrics = []
    for name, spec in raw.items():
        where = f"{key}.confirm_metrics.{name}"
        if not ENV_NAME_RE.match(name):
            raise ConfigError(where, "a metric name is letters, digits and '_' (as VQ-DEPLOY-METRIC lines name it)")
        if not isinstance(spec, dict) or set(spec) - {"better", "tolerance"} or spec.get("better") not in BETTER:
            raise ConfigError(where, "must be { better = \"lower\"|\"higher\"|\"equal\", tolerance = 0.10 }")
        tol = spec.get("tolerance", 0.0)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or not 0 <= tol < 1:
            raise ConfigError(f"{where}.tolerance", f"must be a relative tolerance from 0 to below 1, not {tol!r}")
        metrics.append(Metric(name, spec["better"], float(tol)))
    return Confirm(command=command, sbatch_args=tuple(args),
                   timeout_seconds=_timeout(table, "confirm_timeout_seconds", key, 900.0), metrics=tuple(metrics))
