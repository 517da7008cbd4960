"""The fast, non-cryptographic checksum of allocation transcripts.

``xxh3_64`` (the ``xxhash`` module) when it is importable, else
``blake2b`` with an 8-byte digest from :mod:`hashlib` (standard library),
so the agent runs on a login host whose Python has nothing but its
standard library.  Every record that carries a digest also names the
algorithm (``checksum``), and the driver checks a digest with the
algorithm named, whichever it is.

These digests detect change (the settle) and damage in transit (the
framed stream); they are not security evidence: the source identity uses
SHA-256 throughout.

Standard library (+ ``xxhash`` when present); Python 3.8 and later.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Protocol

XXH3 = "xxh3_64"
BLAKE2B = "blake2b"
ALGORITHMS = (XXH3, BLAKE2B)
#: ``VQ_ADMIN_AGENT_CHECKSUM=blake2b`` forces the fallback (tests, or a site
#: that wants one algorithm everywhere).
ENV_FORCE = "VQ_ADMIN_AGENT_CHECKSUM"


def _xxhash_available() -> bool:
    """Whether ``xxhash`` is importable from a trusted place: its files and every directory above them
    pass the secure-path rule (:mod:`vq_admin.core.securepath`); otherwise it is never imported."""
    import importlib.util
    import os

    from .securepath import path_problem

    try:
        spec = importlib.util.find_spec("xxhash")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not os.path.isabs(spec.origin):
        return False
    places = [spec.origin] + [os.path.join(d, n) for d in spec.submodule_search_locations or [] for n in os.listdir(d)]
    if any(path_problem(p, what="xxhash") for p in places):
        return False  # another user could change it: the fallback, never an import from there
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


def default_algorithm() -> str:
    """``xxh3_64`` when ``xxhash`` is importable, else ``blake2b`` (or the forced one)."""
    import os

    if os.environ.get(ENV_FORCE) == BLAKE2B:
        return BLAKE2B
    return XXH3 if _xxhash_available() else BLAKE2B


class Hasher(Protocol):
    """What :func:`new` returns: ``xxhash.xxh3_64`` or ``hashlib.blake2b``."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def new(algorithm: Optional[str] = None) -> Hasher:
    """A fresh hash object of *algorithm* (default :func:`default_algorithm`)."""
    algorithm = algorithm or default_algorithm()
    if algorithm == XXH3:
        import xxhash

        return xxhash.xxh3_64()
    if algorithm == BLAKE2B:
        return hashlib.blake2b(digest_size=8)
    raise ValueError(f"unknown checksum {algorithm!r} (known: {', '.join(ALGORITHMS)})")
