"""The run's first agent call, started before the driver has planned anything.

An already-current update is one ssh session (:mod:`vq_admin.lanes.first_call`):
``AGENT... session --probe WORD...`` with its request on stdin.  The ssh
handshake and the login shell's start on the host need nothing but the host's
ssh settings and the agent's words, both known once the configuration is read;
the request (the lease's holder record, the command words to check, the
verify) needs the plan.  So :func:`start` starts that ssh process (the run's
connection master) as soon as the runtime host is known, and
:meth:`vq_admin.lease.Lease.open_session` sends the request on its stdin once
the plan is ready (:func:`take`), while the handshake went on meanwhile.
For a plain ``update PROGRAM HOST --expected-sha SHA`` the console script
started it even earlier, right after reading the configuration and before the
command line was parsed (:mod:`vq_admin.ssh.early_start`, the same :func:`start`).

Until the request is sent nothing runs on the host but the agent's
``session`` waiting for it.  A run that ends before sending it (a refusal, a
usage error, an exception, a signal) closes its stdin (:func:`end`, which
:meth:`vq_admin.ssh.transport.Session.close` calls, or the pipe closing with the driver):
the agent reads end-of-file before any request, which is "nothing asked": no
lease taken, nothing recorded, exit 0.  The process is always waited for
(bounded; killed past the bound), so none is left behind.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Sequence

from . import process
from ..core import protocol
from .argv import probe_suffix
from .transport import SshTransport, literal_words

if TYPE_CHECKING:
    from ..config import HostConfig
    from ..context import RunContext

@dataclass
class EarlySession:
    command: str  # the remote command line (what the login shell is given)
    proc: "process.LongLived"
    stderr: IO[bytes]


_EARLY: dict[int, EarlySession] = {}
#: Seconds :func:`end` waits for an unused session to end after its stdin closed.
END_TIMEOUT = 10.0


def session_command(transport: SshTransport, argv: Sequence[str]) -> list[str]:
    """The ssh argv of ``AGENT... session`` as the run's connection master, with the login-shell
    probe's words (``--probe``, quoted for a POSIX shell) while the login shell is not yet known."""
    full = transport.master_wrap(argv)
    if not transport.shell_checked:
        full[-1] += probe_suffix()
    return full


def start(transport: SshTransport, agent: Sequence[str]) -> None:
    """Start ``AGENT... session`` on *transport* now, its request to follow (at most one per transport;
    nothing when the agent's words are not literal: that run takes its lease the old way)."""
    if id(transport) in _EARLY or transport.shell_checked or not literal_words(agent):
        return
    full = session_command(transport, protocol.session(agent))
    stderr = tempfile.TemporaryFile()
    try:
        proc = process.spawn(full, stderr=stderr)
    except OSError:
        stderr.close()  # the lease's own start reports it
        return
    _EARLY[id(transport)] = EarlySession(full[-1], proc, stderr)
    transport.on_session_close.append(lambda: end(transport))


def take(transport: SshTransport, command: str) -> EarlySession | None:
    """The early session of *transport* when it runs exactly *command*; the caller owns it then."""
    early = _EARLY.get(id(transport))
    if early is None or early.command != command:
        return None
    del _EARLY[id(transport)]
    return early


def end(transport: SshTransport) -> None:
    """End an early session that was never given its request: its stdin closes (nothing asked)."""
    early = _EARLY.pop(id(transport), None)
    if early is not None:
        for stream in (early.proc.stdin, early.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        process.end(early.proc, END_TIMEOUT)
        early.stderr.close()


def start_for(ctx: "RunContext", host: "HostConfig") -> None:
    """:func:`start` on *host*'s login host when it is reached over ssh."""
    login = ctx.login(host)
    if isinstance(login, SshTransport):
        start(login, host.agent)
