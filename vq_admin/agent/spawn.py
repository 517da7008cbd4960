"""The agent's one process runner: every command the agent runs starts here.

:func:`run_captured` runs a command to its end and captures its output;
:func:`start` starts one that outlives the call (the fixed-host build's job
script, sbatch while its job id is read).  Both are :mod:`subprocess`: an
argv, never a shell; stdin ``/dev/null``; no descriptor but 0, 1 and 2
passed on; ``SIGPIPE`` and ``SIGXFSZ`` at their defaults in the command.
A bound that passes raises :class:`TimeoutExpired` (the command killed and
reaped, as ``subprocess.run`` does).

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import subprocess
from subprocess import TimeoutExpired as TimeoutExpired

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Dict, Optional, Sequence, Tuple, Union

    Target = Union[int, IO[bytes]]


def run_captured(argv: "Sequence[str]", env: "Optional[Dict[str, str]]" = None,
                 timeout: "Optional[float]" = None) -> "Tuple[int, bytes, bytes]":
    """``(exit code, stdout, stderr)`` of *argv* (a negative code: killed by that signal), run with
    *env* as its whole environment (``None``: this process's); raises ``OSError`` when it cannot start
    and :class:`TimeoutExpired` past *timeout* seconds."""
    done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def start(argv: "Sequence[str]", *, stdout: "Target", stderr: "Target", cwd: "Optional[str]" = None,
          new_session: bool = False) -> "subprocess.Popen[bytes]":
    """Start *argv* (stdout :data:`subprocess.PIPE` or a descriptor/file); the caller waits for it."""
    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd,
                            close_fds=True, start_new_session=new_session)


PIPE = subprocess.PIPE
