"""``vq-admin-agent session``: a run's first call on a login host, in one Python start.

The driver runs ``AGENT... session`` as the first (and, for an already-current
update, only) ssh session of a run; that ssh client is the run's connection
master.  The command line holds only words every shell reads literally (the
agent's validated path and this verb); everything else comes on stdin as one
JSON request line, so the login shell parses nothing that could mean
something else there::

    {"protocol": 1,
     "shell_probe": {"argv": true, "expected": "..."},                  (optional)
     "lease": {"lane": ..., "host": ..., "program": ...,
               "holder": {"driver_host", "user", "pid", "since", "run_id"}},
     "check_paths": ["/abs/word", ...],                                 (optional)
     "identity": true,                                                  (optional)
     "record": {"program": P or null, "after": N},                      (optional)
     "verify": {"argv": [...], "env": {...}, "timeout": SECONDS}}       (optional)

``protocol`` is :data:`.protocol.SESSION_PROTOCOL` of the driver; an agent
of another version answers only its own (``{"protocol": N}``) and does
nothing (the driver refuses, 77, naming the command that updates the
helper).  Then, in order, each only when everything before it passed:

1. ``shell_probe``: the probe's words came on this session's own command
   line (``session --probe WORD...``, quoted for a POSIX shell by the
   driver), so the login shell sshd ran for this very session, with the
   startup files it read, is the one judged, and no second shell starts.
   Unless the words joined as ``WORD|`` are exactly ``expected`` (what a
   POSIX shell gives) nothing else is done, and the driver refuses (77);
2. ``lease``: the host-side lease, exactly as the ``lease`` verb takes it
   (:mod:`.lease`); held elsewhere or not takeable: nothing else is done;
3. ``check_paths``: the ``check-paths`` rule (:mod:`.checkpaths`); a refused
   path: the verify is not run;
4. ``identity``: this helper's identity, as ``identity --json`` prints it
   (the helper lane's pre-identity);
5. ``verify``: the read-only verify and the launcher read-back, as
   ``verify-readback`` does (:mod:`.verify_readback`), bounded by
   ``timeout`` (the profile's ``verify_timeout_seconds``): at the bound the
   verify's process group is ended and the answer says so;
6. ``record``: the entries of the host's record numbered after ``after``
   (:func:`.record.read_after`), read under the lease.

While the lease is held, each further line on stdin
``{"append": {"statement": ..., "sig": ...}}`` appends one entry to the
record of the lease's program (:func:`.record.serve_line`) and is answered
by one line (``appended`` or ``append_error``): the run's entry rides on the
session it already has.

The answer is two JSON lines: the first with ``protocol``, ``shell`` and
``lease`` as soon as the lease is decided (the driver's short lease wait
covers only that), the second with one member per later part done (none
when the lease was not held).  When the lease is
held, the agent then holds it until its stdin closes (the driver closed it,
died, or the connection dropped), removes the holder record and exits 0:
the lease ends with the run however the run ends.  Stdin is watched from the
moment the lease is taken, so a run that ends while a part is still running
(a verify that hangs, an ssh client killed) frees the lease at once; the
read-only part left running no longer holds it (its answer then says
``"released"``).

The driver may start this session before its request is ready (the ssh
handshake overlaps its planning): until the line comes, nothing is done.
End-of-file before any request is "nothing asked": no lease, no record,
exit 0.

Exit status: 0 answered (whatever the parts found) or nothing asked, 2 a
request that is not one JSON object line.  Run as the console script
(:func:`.entry.run`), the process ends as soon as the lease is released and
the answer is out (``os._exit`` after flushing: the interpreter's teardown
frees nothing the lease needs).

Standard library only; nothing of the verb table (:mod:`.cli`, argparse) is
imported: JSON goes through the protocol's codec, the verify through
:mod:`.spawn`, and the watch of stdin is a thread.
"""

from __future__ import annotations

import os
import sys

from ..core import exits, protocol

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (a bare start)
    from typing import BinaryIO, List, Optional, TextIO, Tuple

    from ..core.protocol import SessionAnswer, SessionRequest, ShellAnswer, VerifyReadback

#: Largest request line (verify argv, environment, command words).
REQUEST_LIMIT = 1 << 20


def probe_words(words: Optional[List[str]], expected: object) -> ShellAnswer:
    """Judge the probe words that reached this session's argv through the login shell."""
    import pwd

    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
    except KeyError:
        shell = "/bin/sh"
    answer: ShellAnswer = {"shell": shell, "posix": False, "via": "the session's command line"}
    if not isinstance(expected, str):
        answer["error"] = "bad shell_probe request"
        return answer
    if words is None:
        answer["error"] = "no probe words reached the agent's command line"
        return answer
    got = "".join(word + "|" for word in words)
    answer.update({"exit_code": 0, "stdout": got, "stderr": "", "posix": got == expected})
    return answer


def first_part(request: SessionRequest, probe: Optional[List[str]]) -> Tuple[SessionAnswer, Optional[int]]:
    """The first answer line (protocol, shell probe, lease) and the lease's descriptor when it is held
    (-1: no lease was asked; ``None``: nothing else is done); *probe* is the probe words of the command
    line (``session --probe WORD...``), if any."""
    answer: SessionAnswer = {"protocol": protocol.SESSION_PROTOCOL}
    if request.get("protocol") != protocol.SESSION_PROTOCOL:
        return answer, None
    asked = request.get("shell_probe")
    if asked is not None:
        answer["shell"] = probe_words(probe, asked.get("expected") if isinstance(asked, dict) else None)
        if not answer["shell"]["posix"]:
            return answer, None
    wanted = request.get("lease")
    if wanted is None:  # nothing to hold: the later parts go on all the same
        return answer, -1
    from . import lease

    answer["lease"], fd = lease.take(wanted if isinstance(wanted, dict) else {})
    return answer, fd


def second_part(request: SessionRequest) -> SessionAnswer:
    """The second answer line: the command-file check, the identity and the bounded verify."""
    answer: SessionAnswer = {}
    words = request.get("check_paths")
    if words is not None:
        from . import checkpaths

        paths = [w for w in words if isinstance(w, str)] if isinstance(words, list) else []
        checked, refused = checkpaths.check(paths)
        answer["check_paths"] = {"checked": checked, "refused": refused}
        if refused:
            return answer
    if request.get("identity") is True:
        from .identity import identity

        try:
            answer["identity"] = identity()
        except OSError as exc:
            answer["identity_error"] = f"{exc.strerror or exc}"
    verify = request.get("verify")
    if isinstance(verify, dict):
        answer["verify"] = _verify(verify.get("argv"), verify.get("env") or {}, verify.get("timeout"))
    if "record" in request:
        from . import record

        try:
            answer["record"] = record.read_after(*record.request_program(request["record"]))
        except ValueError as exc:
            answer["record"] = {"entries": [], "error": str(exc)}
    return answer


def _verify(argv: object, env: object, timeout: object) -> VerifyReadback:
    """The bounded verify and its read-back, when the request's words are an argv, an environment and a bound."""
    from .verify_readback import verify_readback

    if (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
            and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
            and isinstance(timeout, (int, float)) and timeout > 0):
        return verify_readback(argv, env, float(timeout))
    return {"error": "bad verify request"}


def serve(stdin: BinaryIO, out: TextIO, err: TextIO, probe: Optional[List[str]] = None) -> int:
    line = stdin.readline(REQUEST_LIMIT + 1)
    if not line:  # stdin closed before any request (the run ended before sending it): nothing asked
        return 0
    request: Optional[SessionRequest]
    try:
        request = protocol.decode(line.decode("utf-8")) if line.endswith(b"\n") else None
    except (UnicodeDecodeError, ValueError):
        request = None
    if not isinstance(request, dict):
        err.write("vq-admin-agent: session: stdin must start with one JSON request object line\n")
        return exits.EXIT_USAGE
    answer, fd = first_part(request, probe)
    out.write(protocol.encode(answer))
    out.flush()
    if fd is None:
        return 0
    if fd < 0:
        out.write(protocol.encode(second_part(request)))
        out.flush()
        return 0
    from .lease import Held  # held: the request's lease was a LeaseRequest object (lease.take checked it)

    held = Held(fd, answer["lease"]["lock"], stdin, out, request["lease"].get("program"))
    try:
        rest = second_part(request)
        if held.released:
            rest["released"] = "stdin closed before the answer"
        out.write(protocol.encode(rest))
        out.flush()
    except BaseException:
        held.release()
        raise
    finally:
        held.answered.set()
    held.watcher.join()  # stdin closed: the lease is released
    return 0


def main(argv: List[str]) -> int:
    if argv and argv[0] != protocol.PROBE:
        print("usage: vq-admin-agent session [--probe WORD...]  (one JSON request line on stdin)", file=sys.stderr)
        return exits.EXIT_USAGE
    return serve(sys.stdin.buffer, sys.stdout, sys.stderr, argv[1:] if argv else None)
