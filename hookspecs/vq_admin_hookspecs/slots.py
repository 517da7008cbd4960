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

A **list slot** (``Slot(name, many=True)``) stands for zero or more whole
argv words: a list known only at run time (the keep set of a prune).  Its
text is ``[<label>]...``, the usage-synopsis notation for "repeated".  A
provider places it as **one whole argv word** (never inside a word, never
in ``env``) and never iterates, indexes or joins it (iterating one, as a
``for`` loop or a join does, raises ``TypeError``).  When each value needs
words of its own in front of it (``--keep SHA --keep SHA``), the provider
places ``slot.each("--keep")`` instead, whose text is
``[--keep <label>]...``; ``prefix``/``suffix`` put literal text around each
value inside its word (``slot.each(prefix="--keep=")``, text
``[--keep=<label>]...``).

vq-admin fills every placed slot with the run's value just before it runs
the command (a list slot with a list: each value becomes its own word,
behind the ``each`` words), so the receipt's argv is the planned argv with
its slots filled, and nothing else.  A provider written for plain strings
(the built-in ``command`` provider is one) keeps working: placing a string
argument is placing the slot.  Only the keep set of a prune is a list
slot; :meth:`~.records.PruneRequest.keep_words` places it.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

#: A slot's name: what the run fills it with (``stage``, ``tree_sha256``, ...).
SLOT_NAME_RE = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")
#: A slot's label, shown between ``<`` and ``>`` (``each kept launcher``, ``success|failed``).
SLOT_LABEL_RE = re.compile(r"\A[a-z0-9][a-z0-9_ |]{0,39}\Z")
#: A word a list slot puts in front of each of its values (``--keep``): no space, bracket or marker.
EACH_WORD_RE = re.compile(r"\A[^\s\0<>\[\]]{1,64}\Z")


class Slot(str):
    """A run-time value in a planned argv word: ``prefix + "<" + label + ">" + suffix``.

    :param name: what fills it (a keyword of vq-admin's step execution).
    :param label: the text between the angle brackets (default: *name*).
    :param prefix: literal text before the marker in the same word.
    :param suffix: literal text after the marker in the same word.
    :param many: a **list slot**: zero or more whole words, filled with a list
        (text ``[<label>]...``); *prefix*/*suffix* then go around each value.
    :param before: (list slots only) the words put in front of each value
        (see :meth:`each`).
    """

    name: str
    label: str
    prefix: str
    suffix: str
    many: bool
    before: tuple[str, ...]

    def __new__(cls, name: str, *, label: str | None = None, prefix: str = "", suffix: str = "",
                many: bool = False, before: "tuple[str, ...] | list[str]" = ()) -> "Slot":
        label = name if label is None else label
        if not SLOT_NAME_RE.match(name):
            raise ValueError(f"slot name {name!r} is not a lower-case identifier")
        if not SLOT_LABEL_RE.match(label):
            raise ValueError(f"slot label {label!r} is not a plain label")
        for part in (prefix, suffix):
            if not isinstance(part, str) or "\0" in part or "\n" in part or "<" + label + ">" in part:
                raise ValueError(f"slot {name!r}: its affix {part!r} holds a NUL, a newline or the marker")
        before = tuple(before)
        if before and not many:
            raise ValueError(f"slot {name!r}: words before each value belong to a list slot (many=True)")
        for word in before:
            if not isinstance(word, str) or not EACH_WORD_RE.match(word):
                raise ValueError(f"slot {name!r}: {word!r} cannot stand before each value "
                                 "(one word without spaces, brackets or angle brackets)")
        if many and any(c in prefix + suffix for c in " \t[]"):
            raise ValueError(f"slot {name!r}: a list slot's affixes hold no space or bracket")
        item = f"{prefix}<{label}>{suffix}"
        self = super().__new__(cls, "[" + " ".join([*before, item]) + "]..." if many else item)
        self.name, self.label, self.prefix, self.suffix = name, label, prefix, suffix
        self.many, self.before = bool(many), before
        return self

    @property
    def marker(self) -> str:
        """``<label>``, the part of the word a value replaces."""
        return f"<{self.label}>"

    def fill(self, value: str) -> str:
        """The word with *value* in place of the marker (a one-word slot)."""
        if self.many:
            raise TypeError(f"slot {self.name!r} is a list slot: it is filled with a list of words (fill_words)")
        return f"{self.prefix}{value}{self.suffix}"

    def fill_words(self, values: "tuple[str, ...] | list[str]") -> list[str]:
        """The words a list slot stands for, filled with *values* (a list or tuple of strings):
        for each value, the :meth:`each` words, then the value inside its affixes."""
        if not self.many:
            raise TypeError(f"slot {self.name!r} stands for one word: it is filled with one string (fill)")
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
            raise TypeError(f"list slot {self.name!r} is filled with a list of strings, not {type(values).__name__}")
        return [word for value in values for word in (*self.before, f"{self.prefix}{value}{self.suffix}")]

    def each(self, *before: str, prefix: str = "", suffix: str = "") -> "Slot":
        """This list slot with *before* in front of each value, and *prefix*/*suffix* around each
        value inside its word: ``keep.each("--keep")`` is filled as ``--keep A --keep B``
        (text ``[--keep <kept sha>]...``).  Place the result as one whole argv word."""
        if not self.many:
            raise TypeError(f"slot {self.name!r} stands for one word; each() belongs to a list slot")
        return Slot(self.name, label=self.label, prefix=prefix, suffix=suffix, many=True, before=before)

    def __iter__(self) -> Any:
        if self.many:
            raise TypeError(f"{str.__str__(self)!r} is a list slot (known only at run time): place it as one "
                            "whole argv word (or its each(...)), never iterate it")
        return str.__iter__(self)

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles stay slots
        return (_make, (self.name, self.label, self.prefix, self.suffix, self.many, self.before))

    def __repr__(self) -> str:
        return f"Slot({self.name!r}, text={str.__str__(self)!r})"


def _make(name: str, label: str, prefix: str, suffix: str, many: bool = False,
          before: "tuple[str, ...]" = ()) -> Slot:
    return Slot(name, label=label, prefix=prefix, suffix=suffix, many=many, before=before)


def is_slot(value: object) -> bool:
    """True when *value* is a slot marker (a value known only at run time)."""
    return isinstance(value, Slot)


def is_list_slot(value: object) -> bool:
    """True when *value* is a list slot (zero or more whole words known only at run time)."""
    return isinstance(value, Slot) and value.many


def find_slot(word: str, offered: "tuple[Slot, ...] | list[Slot]") -> Slot | None:
    """The slot *word* holds, as placed by a provider: *word* itself when it is a
    :class:`Slot`, else a new slot with the word's text around the marker of
    one of the *offered* slots (``"--archive=" + slot``).  ``None`` when the
    word holds none.  A word holding two markers, or a list slot's text with
    anything else, is a provider error (a list slot is a whole word)."""
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
        if slot.many:
            if word != text:
                raise ValueError(f"argv word {word!r} holds the list slot {text!r} inside it: a list slot is "
                                 "placed as one whole argv word")
            found = slot
            continue
        found = Slot(slot.name, label=slot.label, prefix=word[:at] + slot.prefix,
                     suffix=slot.suffix + word[at + len(text):])
    return found


def place(words: "tuple[str, ...] | list[str]", offered: "tuple[Slot, ...] | list[Slot]") -> list[str]:
    """*words* with every word that holds an offered slot made a :class:`Slot` (see :func:`find_slot`)."""
    return [find_slot(word, offered) or word for word in words]


def place_env(env: Mapping[str, str], offered: "tuple[Slot, ...] | list[Slot]") -> dict[str, str]:
    """As :func:`place`, for environment values (a list slot is never an environment value)."""
    placed = {name: find_slot(value, offered) or value for name, value in env.items()}
    for name, value in placed.items():
        if is_list_slot(value):
            raise ValueError(f"env {name}: the list slot {str.__str__(value)!r} is placed as argv words, never in env")
    return placed
