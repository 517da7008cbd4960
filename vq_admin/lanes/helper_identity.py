"""Reading the live helper's identity on the login host, and the bounded re-read.

The helper lane decides success only from what the *live* helper reports:
the configured ``agent`` words run on the login host exactly as the driver
runs them, with ``identity --json`` appended, parsed strictly as a
:class:`~vq_admin_hookspecs.HelperIdentity`.  It matches when its record is
``bound`` and its ``source_sha`` and ``tree_sha256`` equal the requested ones.

Shared filesystems lag, so a *well-formed* mismatch is re-read up to
:data:`REREADS` more times, :data:`REREAD_INTERVAL` seconds apart.  A
malformed answer (the agent missing or failing, output that is not an
identity) and an interrupted transport are final at once: waiting does not
make a broken helper well formed, and an ssh failure is an unknown outcome
for the caller to report, not a reason to keep polling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from vq_admin_hookspecs import EvidenceError, HelperIdentity

from ..core.failpoints import failpoint
from ..config import HostConfig
from ..context import RunContext
from ..document import JsonObject
from ..plan import Plan, Step, execute
from ..ssh.transport import RunResult

#: Re-reads after the first read of a well-formed mismatch.
REREADS = 5
#: Seconds between two reads.
REREAD_INTERVAL = 2.0
#: Seconds one identity read may take (it digests the helper's files).
IDENTITY_TIMEOUT = 300.0


def reread_policy() -> tuple[int, float]:
    """``(re-reads, interval)``; the failpoints ``helper-rereads`` and ``helper-reread-interval`` (inert
    outside tests) override them, so tests need not wait ten seconds."""
    count, interval = REREADS, REREAD_INTERVAL
    try:
        count = max(0, min(50, int(failpoint("helper-rereads") or count)))
        interval = max(0.0, min(60.0, float(failpoint("helper-reread-interval") or interval)))
    except ValueError:
        pass
    return count, interval


@dataclass
class IdentityRead:
    """One read of the live helper's identity."""

    step: str
    identity: HelperIdentity | None = None
    error: str | None = None
    interrupted: bool = False
    mismatches: list[str] = field(default_factory=list)

    @property
    def matched(self) -> bool:
        return self.identity is not None and not self.mismatches and not self.interrupted

    def to_dict(self) -> JsonObject:
        return {
            "step": self.step,
            "identity": self.identity.to_dict() if self.identity else None,
            "matched": self.matched,
            "mismatches": list(self.mismatches),
            "error": self.error,
            "interrupted": self.interrupted,
        }


def compare(identity: HelperIdentity, sha: str, tree: str) -> list[str]:
    """Every way *identity* differs from the requested source (empty: a match)."""
    problems = []
    if identity.record != "bound":
        problems.append(f"its install record is {identity.record!r}, not 'bound' (the files do not prove a commit)")
    if (identity.source_sha or "").lower() != sha:
        problems.append(f"it reports source SHA {identity.source_sha}, requested {sha}")
    if identity.tree_sha256 != tree:
        problems.append(f"its files digest to {identity.tree_sha256}, requested tree {tree}")
    return problems


def read_identity(ctx: RunContext, host: HostConfig, step: Step, sha: str | None, tree: str | None) -> IdentityRead:
    """Run *step* (its planned identity argv, ``protocol.identity``) on the login host and judge the answer."""
    result = execute(step, ctx.login(host), timeout=IDENTITY_TIMEOUT)
    return judge_identity(step, result, sha, tree)


def judge_identity(step: Step, result: RunResult, sha: str | None, tree: str | None) -> IdentityRead:
    """The identity answer in *result* (from :func:`read_identity`, or from the run's first agent
    call, :mod:`.first_call`), judged against *sha* and *tree*."""
    found = IdentityRead(step=step.name)
    if result.interrupted:
        found.interrupted, found.error = True, result.describe()
        return found
    if result.exit_code != 0:
        found.error = f"the agent exited {result.exit_code}: {result.error_text()[-300:]}"
        return found
    try:
        found.identity = HelperIdentity.parse(result.stdout)
    except EvidenceError as exc:
        found.error = f"the agent's answer is not a helper identity: {exc}"
        step.status, step.detail = "failed", found.error
        return found
    if sha is not None and tree is not None:
        found.mismatches = compare(found.identity, sha, tree)
    return found


@dataclass
class Readback:
    attempts: list[IdentityRead]
    rereads: int
    interval: float

    @property
    def final(self) -> IdentityRead:
        return self.attempts[-1]

    def to_dict(self) -> JsonObject:
        return {"reads": len(self.attempts), "max_rereads": self.rereads, "interval_seconds": self.interval,
                "matched": self.final.matched, "attempts": [a.to_dict() for a in self.attempts]}


def readback(ctx: RunContext, host: HostConfig, plan: Plan, first: Step, sha: str, tree: str,
             sleep: Callable[[float], None] = time.sleep) -> Readback:
    """Read the live identity; re-read a well-formed mismatch, bounded."""
    rereads, interval = reread_policy()
    attempts = [read_identity(ctx, host, first, sha, tree)]
    previous = first
    while not attempts[-1].matched and attempts[-1].identity is not None and len(attempts) <= rereads:
        sleep(interval)
        step = plan.again(first, f"{first.name}-reread-{len(attempts)}",
                          f"re-read {len(attempts)} of at most {rereads}: a shared filesystem may lag", after=previous)
        attempts.append(read_identity(ctx, host, step, sha, tree))
        previous = step
    return Readback(attempts, rereads, interval)
