"""Refuse to run a command file another user could have replaced (as sshd StrictModes does).

vq-admin runs configured commands (provider commands, the agent, a preparer)
with the operator's rights.  On a ``transport = "local"`` host it runs them
itself, so before running one it applies the secure-path rule
(:mod:`vq_admin.core.securepath`, the one definition shared with the agent)
to *every* absolute path among the command's words, interpreter and script
alike (``/bin/bash /site/deploy.sh``): each must be owned by you or root and
not writable by group or others, and so must every directory above it (a
sticky directory such as ``/tmp`` excepted).  Anything else is refused
(exit 77) naming the path, its owner and mode, and the fix, before the
command runs.  Over ssh the agent on the far host applies the same rule.
"""

from __future__ import annotations

from typing import Sequence

from .core.securepath import command_problem as _words_problem


def command_problem(argv: Sequence[str] | str) -> str | None:
    """``None`` when the command *argv* is safe to run, else why not.

    A single string is taken as one word (the command file itself)."""
    words = [argv] if isinstance(argv, str) else list(argv)
    return _words_problem(words)
