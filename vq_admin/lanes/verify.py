"""Runtime verification on the login host: the provider's verify receipt,
every check of CONTRACT section 4, and vq-admin's own read-back of the
launcher's SHA-256.  Used before a build ("already current?"), after it, and
as the read-back that resolves an interrupted transport.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vq_admin_hookspecs import RuntimeRequest, VerifyReceipt

from ..config import HostConfig, RuntimeProfile
from ..context import RunContext
from ..evidence import Check, all_ok, parse_receipt, readback_check, receipt_checks
from ..plan import Plan, Step, execute


@dataclass
class Verification:
    step: str
    receipt: VerifyReceipt | None = None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    interrupted: bool = False
    #: set when the verifier printed something that is not one valid receipt (bounded, escaped)
    not_receipt: dict[str, Any] | None = None

    @property
    def proven(self) -> bool:
        return not self.interrupted and self.error is None and self.receipt is not None and all_ok(self.checks)

    def failed_checks(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "proven": self.proven,
            "receipt": self.receipt.to_dict() if self.receipt else None,
            "checks": [c.to_dict() for c in self.checks],
            "error": self.error,
            "interrupted": self.interrupted,
            **({"output": self.not_receipt} if self.not_receipt else {}),
        }


def plan_verify(ctx: RunContext, plan: Plan, name: str, host: HostConfig, profile: RuntimeProfile,
                request: RuntimeRequest) -> tuple[Step, Step]:
    """Add the verify step and its hash read-back step to *plan*."""
    command = ctx.providers.runtime_verify(profile.provider, request)
    where = ctx.login(host).where
    verify = plan.add(name, where, command.argv, "read-only verify receipt on the login host", dict(command.env))
    readback = plan.add(f"{name}-readback", where, [*host.agent, "hash-file", "<active_path>"],
                        "SHA-256 of the receipt's launcher, read back on the login host")
    return verify, readback


def run_verify(ctx: RunContext, host: HostConfig, profile: RuntimeProfile, request: RuntimeRequest,
               verify_step: Step, readback_step: Step) -> Verification:
    login = ctx.login(host)
    timeout = profile.verify_timeout_seconds
    result = execute(verify_step, login, verify_step.planned_argv, timeout=timeout)
    found = Verification(step=verify_step.name)
    if result.interrupted:
        found.interrupted, found.error = True, result.describe()
        readback_step.status = "skipped"
        return found
    receipt, error = parse_receipt(result.stdout)
    if receipt is None and result.stdout.strip():
        found.not_receipt = output_excerpt(result.stdout, error)
    if result.exit_code != 0:
        found.error = f"verify command exited {result.exit_code}: {result.error_text()[-500:]}"
        if receipt is None:
            readback_step.status = "skipped"
            return found
    if receipt is None:
        found.error = error
        verify_step.status = "failed"
        verify_step.detail = error
        readback_step.status = "skipped"
        return found
    found.receipt = receipt
    found.checks = receipt_checks(receipt, request.program, request.expected_sha, request.tag)
    if not receipt.active_path.startswith("/"):
        found.checks.append(readback_check(receipt, None, "active_path is not absolute; not read back"))
        readback_step.status = "skipped"
        return found
    hashed = execute(readback_step, login, [*host.agent, "hash-file", receipt.active_path], timeout=timeout)
    if hashed.interrupted:
        found.interrupted, found.error = True, hashed.describe()
        return found
    data, read_error = _parse_hash(hashed.stdout)
    if hashed.exit_code != 0 and read_error is None:
        read_error = (data or {}).get("error") or f"hash-file exited {hashed.exit_code}"
    found.checks.append(readback_check(receipt, data, read_error))
    return found


def _parse_hash(stdout: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "the agent's hash-file answer is not JSON"
    if not isinstance(value, dict):
        return None, "the agent's hash-file answer is not an object"
    return value, None


#: How much of a verifier's unusable output a receipt keeps.
OUTPUT_EXCERPT = 2048


def output_excerpt(stdout: bytes, error: str | None) -> dict[str, Any]:
    """The verifier's output that is not a receipt, bounded and escaped for the receipt."""
    head = stdout[:OUTPUT_EXCERPT]
    return {"bytes": len(stdout), "truncated": len(stdout) > OUTPUT_EXCERPT,
            "excerpt": head.decode("ascii", "backslashreplace").encode("unicode_escape").decode("ascii")
            .replace("\\\\x", "\\x"),
            "parse_error": error}
