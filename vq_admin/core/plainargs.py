"""The hand parser of the two command lines served before argparse is loaded.

``vq admin launcher PROGRAM HOST ...`` (per job, :mod:`vq_admin.entry`) and
``vq admin update PROGRAM HOST --expected-sha SHA ...`` (cron's run, whose ssh
process starts first: :mod:`vq_admin.ssh.early_start`) read their few options here,
with ``os``-level code only.  It takes a command line only when it is plainly
well-formed, and the verb's argparse would read it the same way; for anything
else it returns ``None`` and the caller hands the words to the full parser
(:mod:`vq_admin.cli`), which then decides, and words any usage error, exactly
as for every other verb.  So it can make a command line slower, never read it
differently.

Plainly well-formed: operands are the words that do not start with ``-``;
each option is one of the verb's, spelled in full; an option that takes a
value is given at most once, as ``--opt VALUE`` (VALUE not starting with
``-``, which argparse would read as an option) or ``--opt=VALUE`` (VALUE not
empty and not ``--``, which argparse drops); a flag has no ``=``; with
*together*, the operands are one run of words (``update``'s ``PROGRAM HOST``
is one argparse positional of several words, which an option between them
would cut).  Not taken: ``--`` and ``-``, abbreviations, unknown options,
``--help``.  tests/test_plainargs.py checks against the verbs' argparse
that whatever is taken is read the same way.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the per-job launcher path imports this module
if TYPE_CHECKING:
    from collections.abc import Mapping


def plain_words(words: list[str], valued: Mapping[str, str], flags: Mapping[str, str], *, together: bool = False
                ) -> tuple[list[str], dict[str, str], set[str]] | None:
    """``(operands, {key: value}, {flag keys given})`` for *words*, where *valued* and *flags* map
    each option to its key; ``None`` unless the words are plainly well-formed (see the module)."""
    operands: list[str] = []
    values: dict[str, str] = {}
    given: set[str] = set()
    cut = False  # with *together*: an option came after the first operand
    rest = iter(words)
    for word in rest:
        if not word.startswith("-"):
            if cut:
                return None
            operands.append(word)
            continue
        cut = together and bool(operands)
        if word in flags:  # a flag's name holds no "="
            given.add(flags[word])
            continue
        name, eq, value = word.partition("=")
        key = valued.get(name)
        if key is None or key in values:
            return None
        if not eq:
            value = next(rest, "-")  # no word left: as a missing value
            if value.startswith("-"):
                return None
        elif value in ("", "--"):
            return None
        values[key] = value
    return operands, values, given


class LauncherArgs:
    """The parsed ``launcher`` verb: the attributes ``argparse`` would give it."""

    def __init__(self, program: str, host: str, values: dict[str, str | bool]):
        self.verb = self.func = "launcher"
        self.program, self.host = program, host
        self.expected_sha = _text(values, "expected_sha")
        self.path = _text(values, "path")
        self.pin = _text(values, "pin")
        self.config = _text(values, "config")
        self.state_dir = _text(values, "state_dir")
        self.job = _text(values, "job")
        self.json = bool(values.get("json"))
        self.check_on_host = bool(values.get("check_on_host"))


def _text(values: dict[str, str | bool], key: str) -> str | None:
    value = values.get(key)
    return value if isinstance(value, str) else None
