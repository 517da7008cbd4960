"""The one way the driver reads and writes a document.

A document (a receipt and its sections, a state record, an agent answer that
is a document, an entry of the host's record, a command's ``--json`` output)
is a :class:`Document`: a frozen msgspec ``Struct`` whose field annotations are
its checks.  Types, ranges (``Meta(ge=...)``) and patterns (:data:`FullSha`,
:data:`Sha256`) are checked by one strict conversion that names the field it
refused (``Expected `int`, got `str` - at `$.deploy.exit_code```); a rule
that needs more than one field goes in ``__post_init__`` and raises
``ValueError``.

``from_json`` reads through the one bounded parser,
:func:`vq_admin.core.bounds.loads_json` (size, nesting depth, integer digits,
duplicate keys); ``to_value`` and ``to_json`` write.  The agent (Python 3.8,
standard library) writes its answers with :mod:`vq_admin.core.protocol`'s
codec; the driver reads them here.  The per-job launcher path imports nothing
of this (docs/bindings.md).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Self, TypeVar

import msgspec

from .core.bounds import InputError, loads_json
from .core.identifiers import SHA256_RE, SHA_RE

#: A full git object name as stored: 40 or 64 lower-case hex digits.
FullSha = Annotated[str, msgspec.Meta(pattern=SHA_RE.pattern)]  # \A...\Z: "$" would let a trailing newline by
#: A SHA-256 digest: 64 lower-case hex digits.
Sha256 = Annotated[str, msgspec.Meta(pattern=SHA256_RE.pattern)]
#: A count, a size or a number of seconds that cannot be negative.
Count = Annotated[int, msgspec.Meta(ge=0)]
#: JsonValue: where a document's shape is free-form (a provider's metrics, a nested document another module
#: types): the bounded parser's alias; msgspec cannot check a recursive alias, so it checks nothing there.
if TYPE_CHECKING:
    from .core.bounds import JsonObject as JsonObject, JsonValue as JsonValue
else:
    JsonValue = Any
    JsonObject = dict[str, JsonValue]
#: The largest document :meth:`Document.from_json` reads unless told otherwise.
DEFAULT_LIMIT = 1 << 20


def _text(value: object) -> str:
    """A ``str`` subclass (a planned argv's :class:`~vq_admin_hookspecs.Slot`) is written as its text."""
    if isinstance(value, str):
        return str.__str__(value)
    raise TypeError(f"a document cannot hold a {type(value).__name__}")


_T = TypeVar("_T")


def given(value: _T | msgspec.UnsetType) -> _T | None:
    """An optional member as a value: one the document does not hold (``UNSET``) is ``None``."""
    return None if value is msgspec.UNSET else value


class DocumentError(InputError):
    """A document that is not what its type says; ``str()`` is one line naming the document and the field."""


class Document(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every document type: frozen, keyword-only, checked on conversion.

    Members a document does not declare are ignored when reading (a newer
    writer may add some); every declared member is written, ``None`` included."""

    @classmethod
    def from_value(cls, value: object, what: str) -> Self:
        """*value* (parsed JSON) as this type, or :class:`DocumentError` naming *what* and the field."""
        try:
            return msgspec.convert(value, cls, strict=True)
        except msgspec.ValidationError as exc:
            raise DocumentError(f"{what}: {exc}") from None

    @classmethod
    def from_json(cls, data: bytes | str, what: str, *, limit: int = DEFAULT_LIMIT) -> Self:
        """Parse one JSON document (bounded: :func:`~vq_admin.core.bounds.loads_json`) as this type."""
        return cls.from_value(loads_json(data, what, limit=limit), what)

    def to_value(self) -> dict[str, Any]:
        """This document as plain JSON values (tuples stay tuples; ``json`` writes them as arrays)."""
        value: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_text)
        return value

    def to_json(self) -> str:
        """One line of JSON, keys sorted."""
        return json.dumps(self.to_value(), sort_keys=True, separators=(",", ":"))

    def replace(self, **changes: Any) -> Self:
        """A copy with *changes* (checked again by ``__post_init__``, if the type has one)."""
        return msgspec.structs.replace(self, **changes)
