"""The verify receipt and every check on it (CONTRACT section 4).

A run succeeds only when every check passes, including the read-back of the
launcher's SHA-256 on the login host, which vq-admin does itself: a
provider's word for the hash is compared, never trusted.
"""

from __future__ import annotations

from dataclasses import dataclass

from vq_admin_hookspecs import EvidenceError, VerifyReceipt

from .core import protocol
from .core.identifiers import SHA256_RE
from .launcher.immutable import launcher_problem


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def receipt_checks(receipt: VerifyReceipt, program: str, sha: str, tag: str | None) -> list[Check]:
    """Every check that needs only the receipt and the request."""
    sha = sha.lower()
    path_problem = launcher_problem(receipt.active_path, sha)
    return [
        Check("program", receipt.program == program, f"receipt names {receipt.program!r}, requested {program!r}"),
        Check("source_sha", receipt.source_sha.lower() == sha,
              f"receipt source_sha {receipt.source_sha!r}, requested {sha}"),
        Check("tag", receipt.tag == tag, f"receipt tag {receipt.tag!r}, requested {tag!r}"),
        Check("healthy", receipt.healthy is True, f"healthy is {receipt.healthy!r}: {receipt.health_detail}"),
        Check("activation", receipt.activation == "atomic", f"activation is {receipt.activation!r}, must be 'atomic'"),
        Check("quiescent", receipt.quiescent is True, f"quiescent is {receipt.quiescent!r}"),
        Check("updater_pid", receipt.updater_pid is None, f"updater_pid is {receipt.updater_pid!r}, must be null"),
        Check("active_path", path_problem is None,
              path_problem or f"{receipt.active_path} is an immutable per-SHA launcher"),
        Check(
            "active_path_sha256_form",
            bool(SHA256_RE.match(receipt.active_path_sha256)),
            f"active_path_sha256 {receipt.active_path_sha256!r} must be 64 lower-case hex digits",
        ),
    ]


#: The check a launcher fails when another user could replace it (or a directory above it): the run is
#: refused (77), never recorded as verified.
LAUNCHER_TRUST = "launcher_trust"


def readback_check(receipt: VerifyReceipt, hashed: protocol.Hashed | None, error: str | None) -> Check:
    """Compare the receipt's launcher hash with what the login host read (a launcher another user
    could replace fails :data:`LAUNCHER_TRUST`, whatever its hash)."""
    if hashed is not None and isinstance(hashed.get("untrusted"), str):
        return Check(LAUNCHER_TRUST, False, hashed["untrusted"])
    if error is not None or hashed is None:
        return Check("active_path_sha256", False, f"could not read back {receipt.active_path}: {error}")
    actual = hashed.get("sha256")
    if not isinstance(actual, str):
        return Check("active_path_sha256", False, f"read-back of {receipt.active_path} gave no sha256")
    return Check(
        "active_path_sha256",
        actual == receipt.active_path_sha256,
        f"login host reads {actual} at {receipt.active_path}; receipt says {receipt.active_path_sha256}",
    )


def parse_receipt(stdout: bytes) -> tuple[VerifyReceipt | None, str | None]:
    """Parse a verify command's stdout; returns (receipt, error)."""
    try:
        return VerifyReceipt.parse(stdout), None
    except EvidenceError as exc:
        return None, str(exc)


def all_ok(checks: list[Check]) -> bool:
    return bool(checks) and all(c.ok for c in checks)
