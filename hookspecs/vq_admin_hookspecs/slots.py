"""Slot markers: values a provider receives that are known only at run time.

vq-admin calls each argv-building hook **once per run, when it makes the
plan**, before anything has run.  Some request fields then hold values that
only the run itself produces: the stage directory the archive is staged
into, or (for the helper) the tree digest the stage proves.  Those fields
hold a :class:`Slot` instead of the value.

A ``Slot`` is a ``str`` whose text is the marker, for example ``<stage>`` or
``<stage>/source.tar``: the exact text ``--dry-run`` prints in the plan.
The provider contract for a slot is:

* **place it, do not inspect it**: put the value into the returned
  :class:`~.records.ProviderCommand`, unchanged, as a whole argv word or
  env value (``("--source-archive", request.source_archive)``), or inside
  one word (``"--source-archive=" + request.source_archive``); at most one
  slot per word;
* never open, validate, parse, split or rewrite it: its text is a marker,
  not a path or a digest.  Its real value is guaranteed to be the one the
  field documents (the verified stage on the host the command runs on);
* a provider that never looks at such a field needs nothing.

vq-admin fills every placed slot with the run's value just before it runs
the command, so the receipt's argv is the planned argv with its slots
filled, and nothing else.  A provider written for plain strings (the
built-in ``command`` provider is one) keeps working: placing a string
argument is placing the slot.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

#: A slot's name: what the run fills it with (``stage``, ``tree_sha256``, ...).
SLOT_NAME_RE = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")
#: A slot's label, shown between ``<`` and ``>`` (``each kept launcher``, ``success|failed``).
SLOT_LABEL_RE = re.compile(r"\A[a-z0-9][a-z0-9_ |]{0,39}\Z")


class Slot(str):
    """A run-time value in a planned argv word: ``prefix + "<" + label + ">" + suffix``.

    :param name: what fills it (a keyword of vq-admin's step execution).
    :param label: the text between the angle brackets (default: *name*).
    :param prefix: literal text before the marker in the same word.
    :param suffix: literal text after the marker in the same word.
    """

    name: str
    label: str
    prefix: str
    suffix: str

    def __new__(cls, name: str, *, label: str | None = None, prefix: str = "", suffix: str = "") -> "Slot":
        label = name if label is None else label
        if not SLOT_NAME_RE.match(name):
            raise ValueError(f"slot name {name!r} is not a lower-case identifier")
        if not SLOT_LABEL_RE.match(label):
            raise ValueError(f"slot label {label!r} is not a plain label")
        for part in (prefix, suffix):
            if "\0" in part or "\n" in part or "<" + label + ">" in part:
                raise ValueError(f"slot {name!r}: its affix {part!r} holds a NUL, a newline or the marker")
        self = super().__new__(cls, f"{prefix}<{label}>{suffix}")
        self.name, self.label, self.prefix, self.suffix = name, label, prefix, suffix
        return self

    @property
    def marker(self) -> str:
        """``<label>``, the part of the word a value replaces."""
        return f"<{self.label}>"

    def fill(self, value: str) -> str:
        """The word with *value* in place of the marker."""
        return f"{self.prefix}{value}{self.suffix}"

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles stay slots
        return (_make, (self.name, self.label, self.prefix, self.suffix))

    def __repr__(self) -> str:
        return f"Slot({self.name!r}, text={str.__str__(self)!r})"


def _make(name: str, label: str, prefix: str, suffix: str) -> Slot:
    return Slot(name, label=label, prefix=prefix, suffix=suffix)


def is_slot(value: object) -> bool:
    """True when *value* is a slot marker (a value known only at run time)."""
    return isinstance(value, Slot)


def find_slot(word: str, offered: "tuple[Slot, ...] | list[Slot]") -> Slot | None:
    """The slot *word* holds, as placed by a provider: *word* itself when it is a
    :class:`Slot`, else a new slot with the word's text around the marker of
    one of the *offered* slots (``"--archive=" + slot``).  ``None`` when the
    word holds none.  A word holding two markers is a provider error."""
    if isinstance(word, Slot):
        return word
    found: Slot | None = None
    for slot in offered:
        # the provider placed the whole slot text (marker and the slot's own affixes)
        text = str.__str__(slot)
        at = word.find(text)
        if at < 0:
            continue
        if found is not None or word.find(text, at + 1) >= 0:
            raise ValueError(f"argv word {word!r} holds more than one slot marker")
        found = Slot(slot.name, label=slot.label, prefix=word[:at] + slot.prefix,
                     suffix=slot.suffix + word[at + len(text):])
    return found


def place(words: "tuple[str, ...] | list[str]", offered: "tuple[Slot, ...] | list[Slot]") -> list[str]:
    """*words* with every word that holds an offered slot made a :class:`Slot` (see :func:`find_slot`)."""
    return [find_slot(word, offered) or word for word in words]


def place_env(env: Mapping[str, str], offered: "tuple[Slot, ...] | list[Slot]") -> dict[str, str]:
    """As :func:`place`, for environment values."""
    return {name: find_slot(value, offered) or value for name, value in env.items()}
