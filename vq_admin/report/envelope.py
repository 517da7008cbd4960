"""The one envelope of every ``--json`` document vq-admin prints on stdout::

    {"schema": "vq-admin/status/1", "outcome": "ok", "exit_code": 0, ..., "errors": []}

``schema`` is one of :data:`SCHEMAS`; ``exit_code`` is always the code of ``outcome`` (the closed set of
:class:`vq_admin.report.outcome.Outcome`), and the process exits with it; ``errors`` says what went wrong,
in the order it was found.  Only this module spells those four keys for stdout: data that would shadow
one is a programming error (:class:`EnvelopeError`), never a silent overwrite.  Standard library only
and no ``typing`` at run time: the per-job ``vq admin launcher`` path uses it.
"""

from __future__ import annotations

import json
import sys

from ..core.identifiers import SCHEMA_RE
from .outcome import Outcome

TYPE_CHECKING = False  # not typing's: the per-job launcher path never imports typing
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, TextIO

    from ..document import JsonObject

#: The keys that open every document, in this order.
HEAD = ("schema", "outcome", "exit_code")
#: The key that closes every document.
TAIL = "errors"
#: Keys a verb's data may not use: the envelope owns them.
RESERVED = frozenset(HEAD + (TAIL,))

#: The schema of every JSON document, by what prints it.  The contract fixes
#: ``receipt``, ``history`` and ``fleet``; every other verb has ``vq-admin/<verb>/1``.
SCHEMAS = {
    "receipt": "vq-admin/receipt/1",        # update, rollback, prune, provider install
    "plan": "vq-admin/plan/1",              # update, rollback, prune --dry-run
    "fleet": "vq-admin/fleet/1",            # update PROGRAM --all
    "history": "vq-admin/history/1",
    "status": "vq-admin/status/1",
    "status-all": "vq-admin/status-all/1",  # status --all
    "providers": "vq-admin/providers/1",
    "check": "vq-admin/check/1",
    "check-connect": "vq-admin/check-connect/1",  # check --connect
    "references": "vq-admin/references/1",
    "jobs": "vq-admin/jobs/1",              # jobs (recorded uses and the scheduler's jobs)
    "quarantine": "vq-admin/quarantine/1",  # quarantine (and --lift)
    "launcher-binding": "vq-admin/launcher-binding/1",  # launcher
    "conformance": "vq-admin/conformance/1",  # provider test
    "verify": "vq-admin/verify/1",          # verify (read-only drift check)
    "attest": "vq-admin/attest/1",          # attest (an entry of the host's record)
    "error": "vq-admin/error/1",            # a usage error or refusal before any verb's own data exists
}


class EnvelopeError(ValueError):
    """A document that is not an envelope, or data that would shadow an envelope key: a bug."""


def _outcome(outcome: Outcome | str) -> Outcome:
    try:
        return outcome if isinstance(outcome, Outcome) else Outcome(outcome)
    except ValueError:
        raise EnvelopeError(f"outcome {outcome!r} is not one of {', '.join(o.value for o in Outcome)}") from None


def document(schema: str, outcome: Outcome | str, data: Mapping[str, Any] | None = None,
             errors: Iterable[str] = ()) -> JsonObject:
    """The envelope: ``schema``, ``outcome``, ``exit_code``, then *data* in its order, then ``errors``
    (checked: :func:`check`)."""
    data = data or {}
    shadowed = sorted(RESERVED.intersection(data))
    if shadowed:
        raise EnvelopeError(f"{schema}: data key(s) {', '.join(shadowed)} belong to the envelope")
    found = _outcome(outcome)
    return check({"schema": schema, "outcome": found.value, "exit_code": found.exit_code, **data, TAIL: list(errors)})


def check(doc: object) -> JsonObject:
    """*doc* itself when it is a well-formed envelope; else :class:`EnvelopeError` saying why."""
    if not isinstance(doc, dict):
        raise EnvelopeError(f"a JSON document must be an object, not {type(doc).__name__}")
    keys = list(doc)
    if tuple(keys[:3]) != HEAD or keys[-1] != TAIL:  # no keys: no HEAD either
        raise EnvelopeError(f"keys {keys[:3]} ... {keys[-1:]} do not open with {list(HEAD)} and close with {TAIL!r}")
    if not isinstance(doc["schema"], str) or not SCHEMA_RE.match(doc["schema"]):
        raise EnvelopeError(f"schema {doc['schema']!r} does not match {SCHEMA_RE.pattern}")
    if _outcome(doc["outcome"]).exit_code != doc["exit_code"] or isinstance(doc["exit_code"], bool):
        raise EnvelopeError(f"exit_code {doc['exit_code']!r} is not the code of outcome {doc['outcome']!r}")
    if not isinstance(doc[TAIL], list) or not all(isinstance(e, str) for e in doc[TAIL]):
        raise EnvelopeError(f"errors must be a list of strings, not {doc[TAIL]!r}")
    return doc


def _sorted(value: Any) -> Any:
    """Objects below the envelope with their keys sorted (a stable, diffable document)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted(v) for v in value]
    return value


def ordered(doc: Mapping[str, Any]) -> JsonObject:
    """*doc* in envelope order: the head keys present, the rest sorted, ``errors`` last; nested keys sorted."""
    out = {k: doc[k] for k in HEAD if k in doc}
    out.update((k, _sorted(doc[k])) for k in sorted(doc) if k not in RESERVED)
    if TAIL in doc:
        out[TAIL] = _sorted(doc[TAIL])
    return out


def dumps(doc: Mapping[str, Any]) -> str:
    """The text of one document (ASCII, indented, newline-terminated), in envelope order."""
    return json.dumps(ordered(doc), indent=2, ensure_ascii=True) + "\n"


def hold_interrupts() -> None:
    """A run's one answer is about to be written: where the console script handles signals
    (:mod:`vq_admin.interrupts`, never imported here: the launcher path does not load it), a signal from
    now on changes nothing, so it can never add a second document."""
    interrupts = sys.modules.get("vq_admin.interrupts")
    if interrupts is not None:
        interrupts.hold()


def write(doc: Mapping[str, Any], stream: TextIO | None = None) -> int:
    """Print *doc*, which must be an envelope (:func:`check`); return its exit code."""
    hold_interrupts()
    stream = stream or sys.stdout
    stream.write(dumps(check(ordered(doc))))  # dumps orders it again: ordered twice is ordered once
    stream.flush()
    return int(doc["exit_code"])


def emit(schema: str, outcome: Outcome | str, data: Mapping[str, Any] | None = None, errors: Iterable[str] = (),
         stream: TextIO | None = None) -> int:
    """Print the envelope of *data* (:func:`document`) on stdout; return its exit code."""
    return write(document(schema, outcome, data, errors), stream)
