"""Frozen records exchanged between vq-admin and its providers.

Requests go into hooks; :class:`ProviderCommand` comes back out; evidence
(:class:`VerifyReceipt`, :class:`HelperIdentity`) is parsed strictly from what
a provider's command printed.  Every record validates itself on construction,
so a provider that returns something malformed fails at the hook boundary with
a message naming the field, never later in a lane.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from vq_admin_identifiers import ENV_NAME_RE, FULL_SHA_RE, SHA256_RE

from .slots import Slot, is_list_slot, is_slot

#: Largest verify receipt accepted, in bytes of UTF-8.
MAX_RECEIPT_BYTES = 1 << 20


class EvidenceError(ValueError):
    """Evidence a provider returned is malformed; the message names the field."""


def is_full_sha(value: object) -> bool:
    """True when *value* is a full 40- or 64-digit hex object name."""
    return isinstance(value, str) and bool(FULL_SHA_RE.match(value))


def _settle_request(request: "RuntimeRequest | HelperRequest") -> None:
    """Check and normalise the fields the runtime and helper requests share (frozen, so set in place)."""
    if not is_full_sha(request.expected_sha):
        raise EvidenceError(f"{type(request).__name__}.expected_sha must be a full SHA")
    object.__setattr__(request, "expected_sha", request.expected_sha.lower())
    object.__setattr__(request, "update_script_args", tuple(request.update_script_args))
    object.__setattr__(request, "settings", MappingProxyType(dict(request.settings or {})))


@dataclass(frozen=True)
class ProviderCommand:
    """One command a provider wants run, as an argv list (never a shell string).

    vq-admin decides *where* it runs (build host, login host or inside a Slurm
    allocation), applies the profile's timeout and records its exit status.
    ``env`` adds environment variables for that command only.  A list slot
    (:mod:`.slots`) is one whole ``argv`` word and never an ``env`` value.
    """

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        argv = tuple(self.argv)
        if not argv or not isinstance(argv[0], str) or not argv[0]:
            raise EvidenceError("ProviderCommand.argv must be a non-empty list of strings")
        for i, word in enumerate(argv):
            _check_word(word, f"ProviderCommand.argv[{i}]")
        env = tuple((str(k), v if is_slot(v) else str(v)) for k, v in self.env)  # a placed slot stays one
        for name, value in env:
            if not ENV_NAME_RE.match(name):
                raise EvidenceError(f"ProviderCommand.env name {name!r} is not a valid variable name")
            if is_list_slot(value):
                raise EvidenceError(f"ProviderCommand.env[{name}] is the list slot {str.__str__(value)!r}: a list "
                                    "slot is placed as one whole argv word, never in env")
            _check_word(value, f"ProviderCommand.env[{name}]")
        object.__setattr__(self, "argv", argv)
        object.__setattr__(self, "env", env)


def _check_word(word: object, what: str) -> None:
    """Refuse an argv word or env value that is not a string, or holds a NUL or newline."""
    if not isinstance(word, str):
        raise EvidenceError(f"{what} is {type(word).__name__}, not str")
    if "\0" in word or "\n" in word:
        raise EvidenceError(f"{what} holds a NUL or newline")


@dataclass(frozen=True)
class RuntimeRequest:
    """What a runtime hook is asked to do.

    ``settings`` holds the profile as configured (command words already split,
    ``provider_options`` as a table of strings); ``where`` is ``"build-host"``,
    ``"login-host"`` or ``"allocation"``.  ``source_archive`` is the verified
    staged archive on the host the command will run on (``None`` for verify);
    in update and install it is a :class:`~.slots.Slot` (text
    ``<stage>/source.tar``) that the provider places and vq-admin fills.
    """

    program: str
    host: str
    expected_sha: str
    tag: str | None
    update_script_args: tuple[str, ...] = ()
    source_archive: str | None = None
    where: str = "login-host"
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _settle_request(self)


@dataclass(frozen=True)
class HelperRequest:
    """What a helper hook is asked to do: install the staged helper source.

    ``stage_dir`` is the verified stage on the host the command runs on; it
    holds ``source.tar``, ``SOURCE-SHA``, ``SOURCE-TREE-SHA256`` and
    ``ARCHIVE-SHA256``.  ``stage_dir`` and ``expected_tree_sha256`` are
    :class:`~.slots.Slot` markers (``<stage>``, ``<tree_sha256>``): the hook
    is called when the plan is made, before the stage exists; the provider
    places them and vq-admin fills them (see :mod:`.slots`).
    """

    host: str
    expected_sha: str
    expected_tree_sha256: str
    stage_dir: str
    update_script_args: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _settle_request(self)
        if not is_slot(self.expected_tree_sha256) and not SHA256_RE.match(self.expected_tree_sha256):
            raise EvidenceError("HelperRequest.expected_tree_sha256 must be 64 lower-case hex digits")


@dataclass(frozen=True)
class PruneRequest:
    """What the prune hook is asked to do: remove releases of ``program``
    outside ``keep``.

    ``keep`` holds every full SHA vq-admin computed must stay (the active one,
    LAST OK, LAST GOOD, the most recent verified ones and every SHA a queued,
    running, suspended or held Slurm job references), lower case, sorted, no
    duplicates.  The command runs on the scheduler login host.

    vq-admin asks the hook once, when the plan is made, before the census
    has found the jobs' SHAs: ``keep`` is then the **list slot**
    ``[<kept sha>]...`` (see :mod:`.slots`), filled with the keep set when
    the command runs.  Place it with :meth:`keep_words` (which also expands
    a plain tuple of SHAs); never iterate ``keep``.
    """

    program: str
    host: str
    keep: "tuple[str, ...] | Slot"
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", MappingProxyType(dict(self.settings or {})))
        if is_slot(self.keep):
            if not is_list_slot(self.keep):
                raise EvidenceError("PruneRequest.keep is a one-word slot; the keep set is a list slot (many=True)")
            return
        if isinstance(self.keep, str):
            raise EvidenceError("PruneRequest.keep is a string; give a tuple of full SHAs (or the list slot)")
        keep = tuple(sorted({str(s).lower() for s in self.keep}))
        for sha in keep:
            if not is_full_sha(sha):
                raise EvidenceError(f"PruneRequest.keep holds {sha!r}, not a full SHA")
        if not keep:
            raise EvidenceError("PruneRequest.keep is empty: the active generation is always kept")
        object.__setattr__(self, "keep", keep)

    def keep_words(self, *before: str, prefix: str = "", suffix: str = "") -> tuple[str, ...]:
        """The argv words that carry the keep set: for each kept SHA, *before* and then the SHA
        inside *prefix*/*suffix* (``keep_words("--keep")``: ``--keep A --keep B``).

        When ``keep`` is the list slot this is one word, ``keep.each(*before, ...)``, which
        vq-admin fills at run time; place it as it is."""
        if isinstance(self.keep, Slot):
            return (self.keep.each(*before, prefix=prefix, suffix=suffix),)
        return tuple(w for sha in self.keep for w in (*before, f"{prefix}{sha}{suffix}"))


def _sha_list(data: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = _field(data, key, (list,), what)
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not FULL_SHA_RE.match(item) or item != item.lower():
            raise EvidenceError(f"{what} field {key!r}[{i}] is {item!r}, not a full lower-case SHA")
        if item in out:
            raise EvidenceError(f"{what} field {key!r} names {item} twice")
        out.append(item)
    return tuple(out)


@dataclass(frozen=True)
class PruneReport:
    """What a prune command prints on stdout: exactly one JSON object
    ``{"removed": [sha, ...], "kept": [sha, ...]}`` (other fields are
    ignored).  Parsed as strictly as the verify receipt; a SHA in both lists
    is malformed."""

    removed: tuple[str, ...]
    kept: tuple[str, ...]

    WHAT = "prune report"

    @classmethod
    def parse(cls, text: str | bytes) -> "PruneReport":
        data = parse_single_json_object(text, cls.WHAT)
        report = cls(removed=_sha_list(data, "removed", cls.WHAT), kept=_sha_list(data, "kept", cls.WHAT))
        both = sorted(set(report.removed) & set(report.kept))
        if both:
            raise EvidenceError(f"{cls.WHAT} lists {both[0]} as both removed and kept")
        return report

    def to_dict(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "kept": list(self.kept)}


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise EvidenceError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise EvidenceError(f"non-standard JSON constant {name}")


#: Longest integer literal accepted in evidence, in digits (a pid or a byte count fits).
MAX_INT_DIGITS = 40


def parse_single_json_object(text: str | bytes, what: str) -> dict[str, Any]:
    """Parse *text* as exactly one JSON object (surrounding whitespace allowed).

    Raises :class:`EvidenceError` for anything else: empty output, two
    documents, a non-object, duplicate keys, NaN, over-deep nesting, invalid
    UTF-8, or more than :data:`MAX_RECEIPT_BYTES`.
    """
    raw = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_RECEIPT_BYTES:
        raise EvidenceError(f"{what} is larger than {MAX_RECEIPT_BYTES} bytes")
    try:
        stripped = raw.decode("utf-8").strip() if isinstance(text, bytes) else text.strip()
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"{what} is not UTF-8: {exc.reason} at byte {exc.start}") from None
    if not stripped:
        raise EvidenceError(f"{what} is empty")

    def bounded_int(literal: str) -> int:
        if len(literal.lstrip("-")) > MAX_INT_DIGITS:
            raise EvidenceError(f"{what} holds an integer of {len(literal.lstrip('-'))} digits "
                                f"(at most {MAX_INT_DIGITS})")
        return int(literal)

    decoder = json.JSONDecoder(object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant,
                               parse_int=bounded_int)
    try:
        value, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as exc:
        raise EvidenceError(f"{what} is not JSON: {exc.msg} at offset {exc.pos}") from None
    except RecursionError:
        raise EvidenceError(f"{what} is nested too deeply") from None
    except EvidenceError:
        raise
    except ValueError as exc:  # e.g. Python's limit on int conversion: evidence, not a crash
        raise EvidenceError(f"{what} is not usable JSON: {str(exc).splitlines()[0][:200]}") from None
    if stripped[end:].strip():
        raise EvidenceError(f"{what} holds more than one JSON document")
    if not isinstance(value, dict):
        raise EvidenceError(f"{what} is a JSON {type(value).__name__}, not an object")
    return value


def _field(data: Mapping[str, Any], key: str, types: tuple[type, ...], what: str, required: bool = True) -> Any:
    if key not in data:
        if required:
            raise EvidenceError(f"{what} has no field {key!r}")
        return None
    value = data[key]
    # bool is a subclass of int: never accept true/false where a number is meant.
    if isinstance(value, bool) and bool not in types:
        raise EvidenceError(f"{what} field {key!r} is a boolean")
    if not isinstance(value, types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise EvidenceError(f"{what} field {key!r} must be {names}, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class VerifyReceipt:
    """The verify receipt a runtime provider's verify command prints.

    Field meanings are those of CONTRACT section 4.  Parsing checks shape and
    types only; whether the receipt *proves* the requested identity is decided
    by vq-admin (``vq_admin.evidence``), which also reads back the SHA-256 of
    ``active_path`` on the login host itself.  A receipt of nothing active
    (``healthy`` false) may give ``source_sha``, ``active_path`` and
    ``active_path_sha256`` as null: they are read as the empty string.
    """

    program: str
    source_sha: str
    tag: str | None
    healthy: bool
    activation: str
    quiescent: bool
    updater_pid: int | None
    active_path: str
    active_path_sha256: str
    health_detail: str = ""

    WHAT = "verify receipt"

    @classmethod
    def parse(cls, text: str | bytes) -> "VerifyReceipt":
        return cls.from_mapping(parse_single_json_object(text, cls.WHAT))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "VerifyReceipt":
        w = cls.WHAT
        healthy = _field(data, "healthy", (bool,), w)
        nothing: tuple[type, ...] = (str,) if healthy else (str, type(None))  # nothing active: null or ""
        return cls(
            program=_field(data, "program", (str,), w),
            source_sha=_field(data, "source_sha", nothing, w) or "",
            tag=_field(data, "tag", (str, type(None)), w),
            healthy=healthy,
            activation=_field(data, "activation", (str,), w),
            quiescent=_field(data, "quiescent", (bool,), w),
            updater_pid=_field(data, "updater_pid", (int, type(None)), w),
            active_path=_field(data, "active_path", nothing, w) or "",
            active_path_sha256=_field(data, "active_path_sha256", nothing, w) or "",
            health_detail=_field(data, "health_detail", (str,), w, required=False) or "",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HelperIdentity:
    """What ``vq-admin-agent identity --json`` reports about the live helper.

    ``record`` is ``"bound"`` when the installed SOURCE-SHA record was written
    for exactly the files present now, ``"stale"`` when the files changed since,
    and ``"missing"`` when no record exists.  Only a bound record identifies a
    source commit.
    """

    version: str
    source_sha: str | None
    tree_sha256: str
    record: str
    path: str
    interpreter: str

    WHAT = "helper identity"

    @classmethod
    def parse(cls, text: str | bytes) -> "HelperIdentity":
        data = parse_single_json_object(text, cls.WHAT)
        w = cls.WHAT
        ident = cls(
            version=_field(data, "version", (str,), w),
            source_sha=_field(data, "source_sha", (str, type(None)), w),
            tree_sha256=_field(data, "tree_sha256", (str,), w),
            record=_field(data, "record", (str,), w),
            path=_field(data, "path", (str,), w),
            interpreter=_field(data, "interpreter", (str,), w),
        )
        if ident.record not in ("bound", "stale", "missing"):
            raise EvidenceError(f"{w} field 'record' is {ident.record!r}")
        if not SHA256_RE.match(ident.tree_sha256):
            raise EvidenceError(f"{w} field 'tree_sha256' is not 64 lower-case hex digits")
        return ident

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
