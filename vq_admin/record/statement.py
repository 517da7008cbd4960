"""An entry of the host's record: an in-toto Statement v1 (CONTRACT section 12).

An entry that records a verified generation has the launcher (its path and
SHA-256) as its subject and a SLSA verification summary
(``https://slsa.dev/verification_summary/v1``) as its predicate: verifier
vq-admin and its version, the resource the source commit, the policy the
profile's verify command (its words' SHA-256), ``verificationResult``
``PASSED``, and under ``vqAdmin`` the run itself (:class:`Run`).  A driver's
roots, a forgotten driver and a quarantine or its lift have a vq-admin
predicate type of their own.  In-toto readers ignore members they do not
know, so the ``vqAdmin`` member keeps the summary a valid one.

The statement's bytes are :meth:`Statement.to_text`: one line of JSON, keys
sorted, and a newline; what is signed and kept on the host is exactly that.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Literal, TypeAlias

import msgspec

from ..core import protocol
from ..core.bounds import loads_json
from ..document import Document, DocumentError, FullSha, Sha256
from ..state.confirmation import JobResult

SUMMARY = "https://slsa.dev/verification_summary/v1"
ROOTS = "urn:vq-admin:record:roots:v1"
FORGET = "urn:vq-admin:record:forget-driver:v1"
QUARANTINE = protocol.QUARANTINE_PREDICATE
VERIFIER_ID = "urn:vq-admin:verifier"
#: A driver's id: ``user@host/<8 hex>`` (the hex created once in its state directory).
DRIVER_ID_RE = re.compile(r"\A[^@/\s]+@[^@/\s]+/[0-9a-f]{8}\Z")
DriverId = Annotated[str, msgspec.Meta(pattern=DRIVER_ID_RE.pattern)]
#: The longest statement read.
MAX_STATEMENT = 1 << 16


class Subject(Document, frozen=True, kw_only=True):
    """An in-toto resource descriptor: a launcher path and its SHA-256."""

    name: str
    digest: dict[str, Sha256]


class Verifier(Document, frozen=True, kw_only=True):
    id: str
    version: dict[str, str]


class Policy(Document, frozen=True, kw_only=True):
    """The profile's verify command: its words and their SHA-256 (of the words as one JSON list)."""

    name: str
    digest: dict[str, Sha256]


class Confirmed(JobResult, frozen=True, kw_only=True):
    """Generation *sha*'s confirmation job (CONTRACT section 13) as Slurm reported it for the job the run
    submitted: ``passed``, or ``unconfirmed`` with the *reason*."""

    sha: FullSha
    status: Literal["passed", "unconfirmed"]


class Run(Document, frozen=True, kw_only=True):
    """vq-admin's own account of the run an entry records (*confirm*: the confirmation it ran or holds)."""

    run_id: str | None
    lane: Literal["runtime", "helper"]
    verb: str
    outcome: str
    host: str
    program: str | None
    sha: FullSha
    started_at: str
    finished_at: str
    driver: DriverId
    by: str
    tag: str | None = None
    launcher: str | None = None
    launcher_sha256: Sha256 | None = None
    archive_sha256: Sha256 | None = None
    tree_sha256: Sha256 | None = None
    verifier_receipt_sha256: Sha256 | None = None
    confirm: Confirmed | None = None

    def unconfirmed(self, required: bool) -> str | None:
        """Why this entry is not evidence of a confirmed generation: its own SHA's confirmation failed, or
        (*required*: the reader's profile has ``confirm_command``) it carries no passed one of its SHA."""
        c = self.confirm if self.confirm is not None and self.confirm.sha == self.sha else None
        if c is not None and c.status != "passed":
            return f"unconfirmed: its confirmation failed ({c.reason or 'not passed'})"
        return "unconfirmed: it carries no passed confirmation" if required and c is None else None


class Summary(Document, frozen=True, kw_only=True, rename="camel"):
    """The SLSA verification summary (v1) of a verified generation."""

    verifier: Verifier
    time_verified: str
    resource_uri: str
    policy: Policy
    vq_admin: Run
    verification_result: Literal["PASSED"] = "PASSED"
    verified_levels: tuple[str, ...] = ()
    slsa_version: str = "1.0"


class Root(Document, frozen=True, kw_only=True):
    """A generation a driver's queue may still be handed without a pin."""

    kind: str  # last-ok, last-good, used
    sha: FullSha
    launcher: str | None = None
    launcher_sha256: Sha256 | None = None


class _Driver(Document, frozen=True, kw_only=True):
    """What a driver's own entry says of itself: the driver, who ran it, the host and program, and when."""

    driver: DriverId
    by: str
    host: str
    program: str | None
    at: str


class Roots(_Driver, frozen=True, kw_only=True):
    roots: tuple[Root, ...]


class Forget(_Driver, frozen=True, kw_only=True):
    """A retired driver's roots dropped (``prune --forget-driver``), by *driver*."""

    forgotten: DriverId


class Quarantine(_Driver, frozen=True, kw_only=True):
    """A generation quarantined (``action`` quarantine) or lifted (``lift``), by *driver*."""

    sha: FullSha
    action: Literal["quarantine", "lift"]
    reason: str | None = None


Predicate: TypeAlias = Summary | Roots | Forget | Quarantine
PREDICATES: dict[str, type[Predicate]] = {SUMMARY: Summary, ROOTS: Roots, FORGET: Forget, QUARANTINE: Quarantine}


class Statement(Document, frozen=True, kw_only=True, rename={"type_": "_type", "predicate_type": "predicateType"}):
    """An in-toto Statement v1 whose predicate is one of :data:`PREDICATES` (by ``predicateType``)."""

    subject: tuple[Subject, ...]
    predicate_type: str
    predicate: Predicate
    type_: Literal["https://in-toto.io/Statement/v1"] = "https://in-toto.io/Statement/v1"

    def __post_init__(self) -> None:
        if not isinstance(self.predicate, PREDICATES.get(self.predicate_type, ())):
            raise ValueError(f"predicateType {self.predicate_type} does not match its predicate")

    def to_text(self) -> bytes:
        """The statement's bytes as kept on the host and signed: one JSON line, keys sorted, a newline."""
        return (self.to_json() + "\n").encode()

    @property
    def summary(self) -> Summary | None:
        return self.predicate if isinstance(self.predicate, Summary) else None

    @classmethod
    def parse(cls, data: bytes | str, what: str) -> Statement:
        """Read an entry's statement: the predicate's type chosen by ``predicateType``."""
        value = loads_json(data, what, limit=MAX_STATEMENT)
        if not isinstance(value, dict) or (kind := PREDICATES.get(str(value.get("predicateType")))) is None:
            raise DocumentError(f"{what}: not an in-toto statement of a predicate type vq-admin writes")
        predicate = kind.from_value(value.get("predicate"), f"{what} (predicate)")
        try:
            head = msgspec.convert({**value, "predicate": {}}, _Head, strict=True)
            return Statement(subject=head.subject, predicate_type=head.predicate_type, predicate=predicate)
        except (msgspec.ValidationError, ValueError) as exc:
            raise DocumentError(f"{what}: {exc}") from None


class _Head(Document, frozen=True, kw_only=True, rename={"type_": "_type", "predicate_type": "predicateType"}):
    type_: Literal["https://in-toto.io/Statement/v1"]
    subject: tuple[Subject, ...]
    predicate_type: str
    predicate: dict[str, object]


def policy_of(argv: tuple[str, ...] | list[str]) -> Policy:
    """The policy descriptor of a verify command's words."""
    words = json.dumps(list(argv), separators=(",", ":")).encode()
    return Policy(name="verify_command", digest={"sha256": hashlib.sha256(words).hexdigest()})
