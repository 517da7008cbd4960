"""Immutable records for the per-job launcher path, which loads neither msgspec nor :mod:`vq_admin.document`
nor ``typing`` (docs/bindings.md, "The per-job cost"); everything else uses :class:`vq_admin.document.Document`.

A subclass names its members in ``FIELDS`` (and ``__slots__ = FIELDS``) and annotates their types; the
record is built by keyword, compared and hashed by value, and never changed."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the launcher path imports this module
if TYPE_CHECKING:
    from typing import Any


class PlainRecord:
    """Base of a frozen record of plain values."""

    FIELDS: tuple[str, ...] = ()
    __slots__ = ()

    def __init__(self, **values: object):
        for name in self.FIELDS:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    __delattr__ = __setattr__  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in self.FIELDS))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.FIELDS)})"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}
