"""The ``check-paths`` rule, shared by the verb and by ``session`` (standard library only).

Every absolute word is checked with the secure-path rule (:mod:`vq_admin.core.securepath`);
a word that is not an absolute path is looked up in PATH and not checked.  A
word naming nothing yet passes when its existing directories pass and the
nearest one is writable by nobody else at all (a sticky ``/tmp`` would let
another user create it first).
"""

from __future__ import annotations

import os

from ..core import securepath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Tuple

    from ..core.protocol import Refused


def check(paths: List[str]) -> Tuple[List[str], List[Refused]]:
    """``(checked, refused)``: the absolute words checked, and ``{"path", "problem"}`` for each refused."""
    checked: List[str] = []
    refused: List[Refused] = []
    for path in paths:
        if not path.startswith("/"):
            continue
        checked.append(path)
        problem = securepath.path_problem(path, what="command file", missing_ok=True)
        if problem is None and not os.path.lexists(path):
            problem = securepath.creatable_problem(path)
        if problem:
            refused.append({"path": path, "problem": problem})
    return checked, refused
