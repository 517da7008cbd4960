"""The receipt: one versioned JSON object per run (CONTRACT section 6)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .outcome import Outcome
from .plan import Plan

if TYPE_CHECKING:
    from .transport import RunResult

SCHEMA = "vq-admin/receipt/1"
PLAN_SCHEMA = "vq-admin/plan/1"
METRIC_RE = re.compile(r"^VQ-DEPLOY-METRIC ([A-Za-z0-9_.-]{1,64})=(.*)$", re.MULTILINE)


def parse_metrics(*texts: str) -> dict[str, Any]:
    """``VQ-DEPLOY-METRIC name=value`` lines; finite numbers become numbers, anything else stays text."""
    metrics: dict[str, Any] = {}
    for text in texts:
        for name, raw in METRIC_RE.findall(text):
            raw = raw.strip()
            value: Any = raw
            for convert in (int, float):
                try:
                    value = convert(raw)
                    break
                except ValueError:
                    continue
            if isinstance(value, float) and not math.isfinite(value):
                value = raw  # "nan", "inf", "1e999": JSON has no such number; keep the text
            metrics[name] = value
    return metrics


@dataclass
class Receipt:
    lane: str
    host: str
    program: str | None
    expected_sha: str | None
    tag: str | None
    started_at: str
    plan: Plan = field(default_factory=Plan)
    id: str | None = None
    outcome: Outcome | None = None
    finished_at: str | None = None
    deploy: dict[str, Any] = field(default_factory=dict)
    command_output: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_complete: bool = False
    verify: dict[str, Any] = field(default_factory=dict)
    mirror: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    readback: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def record_command(self, result: "RunResult", where: str) -> None:
        """A provider command run to its end on a fixed host: exit status, output, metrics."""
        stdout, stderr = result.text(), result.stderr.decode("utf-8", "replace")
        complete = result.interrupted is None and not result.stdout_truncated
        self.deploy = {"exit_code": result.exit_code, "where": where, "interrupted": result.interrupted}
        self.command_output = {
            "complete": complete,
            "reason": None if complete else "unavailable",
            "log_dir": None,
            "observations": 0,
            "stdout": stdout,
            "stderr": stderr,
        }
        self.metrics = parse_metrics(stdout, stderr)
        self.metrics_complete = complete

    def finish(self, outcome: Outcome, finished_at: str) -> "Receipt":
        self.outcome = outcome
        self.finished_at = finished_at
        return self

    def to_dict(self) -> dict[str, Any]:
        assert self.outcome is not None
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "id": self.id,
            "outcome": self.outcome.value,
            "exit_code": self.outcome.exit_code,
            "lane": self.lane,
            "host": self.host,
            "program": self.program,
            "expected_sha": self.expected_sha,
            "tag": self.tag,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "steps": self.plan.to_list(),
            "deploy": self.deploy,
            "command_output": self.command_output,
            "metrics": self.metrics,
            "metrics_complete": self.metrics_complete,
            "verify": self.verify,
            "mirror": self.mirror,
            "source": self.source,
            "errors": self.errors,
            "readback": self.readback,
        }
        data.update(self.extra)
        return data

    def plan_dict(self) -> dict[str, Any]:
        """What ``--dry-run`` prints: the plan, nothing executed."""
        return {
            "schema": PLAN_SCHEMA,
            "dry_run": True,
            "lane": self.lane,
            "host": self.host,
            "program": self.program,
            "expected_sha": self.expected_sha,
            "tag": self.tag,
            "steps": [dict(s.to_dict(), status="planned") for s in self.plan.steps],
            **self.extra,
        }
