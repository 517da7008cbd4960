"""The names ``vq-site-example`` accepts, one definition each.

Standard library ``re`` only; :mod:`vq_site_example.args` (the whole grammar)
uses these.  The ``verify`` verb, run for every update, reads its few options
(:func:`vq_site_example.verify.parse`) with :mod:`vq_site_example.namecheck`,
the same rules as plain string checks (no ``re``), proven equal to these by
``tests/test_site_example_verify.py``.
"""

from __future__ import annotations

import re

#: Program names (same rule as vq-admin's configuration).
PROGRAM_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: A full git object name: 40 (SHA-1) or 64 (SHA-256) hex digits.
FULL_SHA_RE = re.compile(r"\A(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})\Z")
#: Tags as recorded in the release: a conservative subset of git ref names.
TAG_RE = re.compile(r"\A(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/+-]{0,127}\Z")
#: ``--note`` text: one printable line.
NOTE_RE = re.compile(r"\A[^\x00-\x1f\x7f]{1,200}\Z")
