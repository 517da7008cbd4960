"""What counts as an immutable per-SHA launcher (standard library only).

Shared by the verify checks and by :mod:`vq_admin.bindings`, which the queue
driver imports for every job.  A launcher is immutable for a full SHA when its
absolute, normalised path

* is ``.../releases/<full sha>/source/.venv/bin/python``, or
* has a file name that carries the full SHA (e.g. ``vibeqc-<full sha>``),

and no component of it is the stable ``current`` link.  Everything else
(a path through ``current``, a stable wrapper without the SHA, a bare
interpreter such as ``/usr/bin/python3``) is mutable or unrecognised.
"""

from __future__ import annotations

import posixpath

from ..core.names import is_full_sha

STABLE_LINK_NAMES = frozenset({"current"})


def launcher_problem(path: object, sha: str) -> str | None:
    """``None`` when *path* is an immutable launcher for *sha*, else the reason."""
    if not isinstance(path, str) or not path:
        return "no launcher path"
    sha = sha.lower()
    if not is_full_sha(sha):
        return f"{sha!r} is not a full SHA"
    if "\0" in path or "\n" in path:
        return "launcher path holds a control character"
    if not path.startswith("/"):
        return f"launcher {path} is not an absolute path"
    if posixpath.normpath(path) != path:
        return f"launcher {path} is not a normalised path"
    parts = path.split("/")[1:]
    through = STABLE_LINK_NAMES.intersection(parts)
    if through:
        return f"launcher {path} goes through the stable link {sorted(through)[0]!r}, which moves on activation"
    if parts[-6:] == ["releases", sha, "source", ".venv", "bin", "python"] or sha in parts[-1]:
        return None
    return (
        f"launcher {path} is not an immutable per-SHA launcher for {sha} "
        "(expected .../releases/<full sha>/source/.venv/bin/python or a file name carrying the full SHA)"
    )
