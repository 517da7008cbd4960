"""``vq-admin-agent session``: a run's first call on a login host, in one Python start.

The driver runs ``AGENT... session`` as the first (and, for an already-current
update, only) ssh session of a run; that ssh client is the run's connection
master.  The command line holds only words every shell reads literally (the
agent's validated path and this verb); everything else comes on stdin as one
JSON request line, so the login shell parses nothing that could mean
something else there::

    {"shell_probe": {"argv": true, "expected": "..."},                 (optional; or
                    {"command": "printf ...", "expected": "..."})
     "lease": {"root": ..., "lane": ..., "host": ..., "program": ...,
               "holder": {"driver_host", "user", "pid", "since", "run_id"}},
     "check_paths": ["/abs/word", ...],                                 (optional)
     "identity": true,                                                  (optional)
     "verify": {"argv": [...], "env": {...}}}                           (optional)

In order, each only when everything before it passed:

1. ``shell_probe``: with ``"argv": true`` the probe's words came on this
   session's own command line (``session --probe WORD...``, quoted for a
   POSIX shell by the driver), so the login shell sshd ran for this very
   session, with the startup files it read, is the one judged, and no second
   shell starts; with ``"command"`` the account's login shell (``getpwuid``)
   runs ``-c COMMAND``.  Unless the words joined as ``WORD|`` (or the
   command's output) are exactly ``expected`` (what a POSIX shell gives)
   nothing else is done, and the driver refuses (77);
2. ``lease``: the host-side lease, exactly as the ``lease`` verb takes it
   (:mod:`.lease`); held elsewhere or not takeable: nothing else is done;
3. ``check_paths``: the ``check-paths`` rule (:mod:`.checkpaths`); a refused
   path: the verify is not run;
4. ``identity``: this helper's identity, as ``identity --json`` prints it
   (the helper lane's pre-identity);
5. ``verify``: the read-only verify and the launcher read-back, as
   ``verify-readback`` does (:mod:`.verify_readback`).

One JSON line answers with one member per part done.  When the lease is
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

from . import protocol

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (a bare start)
    from typing import Any, BinaryIO, Callable, Dict, List, Optional, TextIO

#: Largest request line (verify argv, environment, command words).
REQUEST_LIMIT = 1 << 20
EXIT_USAGE = 2
PROBE_TIMEOUT = 30.0


def login_shell() -> str:
    """The login shell sshd hands commands to (``/bin/sh`` when the account names none)."""
    import pwd

    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    return shell or "/bin/sh"


def probe_shell(probe: Dict[str, Any]) -> Dict[str, Any]:
    """Run the driver's quoting probe through the login shell; ``posix`` true when it came back exact."""
    from .spawn import TimeoutExpired, run_captured

    shell = login_shell()
    command, expected = probe.get("command"), probe.get("expected")
    answer: Dict[str, Any] = {"shell": shell, "posix": False}
    if not isinstance(command, str) or not isinstance(expected, str):
        answer["error"] = "bad shell_probe request"
        return answer
    try:
        code, out, err = run_captured([shell, "-c", command], timeout=PROBE_TIMEOUT)
    except (OSError, TimeoutExpired) as exc:
        answer["error"] = f"cannot run {shell}: {getattr(exc, 'strerror', None) or exc}"
        return answer
    answer.update(exit_code=code, stdout=out[:4096].decode("utf-8", "surrogateescape"),
                  stderr=err[-2048:].decode("utf-8", "surrogateescape"),
                  posix=code == 0 and out == expected.encode("utf-8", "surrogateescape"))
    return answer


def probe_words(words: Optional[List[str]], expected: Any) -> Dict[str, Any]:
    """Judge the probe words that reached this session's argv through the login shell."""
    answer: Dict[str, Any] = {"shell": login_shell(), "posix": False, "via": "the session's command line"}
    if not isinstance(expected, str):
        answer["error"] = "bad shell_probe request"
        return answer
    if words is None:
        answer["error"] = "no probe words reached the agent's command line"
        return answer
    got = "".join(word + "|" for word in words)
    answer.update(exit_code=0, stdout=got, stderr="", posix=got == expected)
    return answer


def _take_lease(request: Dict[str, Any]) -> "tuple[Dict[str, Any], Optional[int], Optional[str]]":
    """``(answer, fd holding the lock or None, lock path)``."""
    from . import lease, securepath

    try:
        name = lease.lock_name(request.get("lane"), request.get("host"), request.get("program"))  # type: ignore[arg-type]
        root = request.get("root")
        if root is not None and (not isinstance(root, str) or not os.path.isabs(root)):
            raise ValueError(f"root {root!r} is not an absolute path")
        holder = request.get("holder")
        if not isinstance(holder, dict):
            raise ValueError("no holder record")
    except (ValueError, TypeError) as exc:
        return {"held": False, "exit": EXIT_USAGE, "error": f"lease: {exc}"}, None, None
    directory = lease.lease_dir(root)
    path = os.path.join(directory, name)
    try:
        lease.prepare_dir(directory)
        fd = lease.open_lock(path)
    except securepath.Untrusted as exc:
        return {"held": False, "exit": 4, "error": f"refused: {exc}"}, None, path
    except lease.LeaseError as exc:
        return {"held": False, "exit": 1, "error": f"lease: {exc}"}, None, path
    try:
        if not lease.try_lock(fd, path):
            os.close(fd)
            found = lease.current_holder(path)
            return ({"held": False, "exit": lease.EXIT_HELD, "lock": path, "holder": found,
                     "message": lease.describe(found)}, None, path)
    except lease.LeaseError as exc:
        os.close(fd)
        return {"held": False, "exit": 1, "error": f"lease: {exc}"}, None, path
    record = dict(holder, agent_pid=os.getpid(), agent_host=os.uname().nodename)
    try:
        lease._write_atomic(path + ".holder", protocol.encode(record).encode())
    except OSError as exc:
        os.close(fd)
        return {"held": False, "exit": 1, "error": f"lease: cannot write {path}.holder: {exc.strerror}"}, None, path
    return {"held": True, "lock": path, "holder": record}, fd, path


def answer_request(request: Dict[str, Any], on_lease: "Callable[[int, str], None]",
                   probe: Optional[List[str]] = None) -> Dict[str, Any]:
    """Do the request's parts in order; *on_lease* gets the lock's descriptor and path once held;
    *probe* is the probe words of the command line (``session --probe WORD...``), if any."""
    answer: Dict[str, Any] = {}
    asked = request.get("shell_probe")
    if asked is not None:
        if isinstance(asked, dict) and asked.get("argv") is True:
            answer["shell"] = probe_words(probe, asked.get("expected"))
        else:
            answer["shell"] = probe_shell(asked if isinstance(asked, dict) else {})
        if not answer["shell"]["posix"]:
            return answer
    wanted = request.get("lease")
    if wanted is not None:
        answer["lease"], fd, path = _take_lease(wanted if isinstance(wanted, dict) else {})
        if fd is None or path is None:
            return answer
        on_lease(fd, path)
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
        from .verify_readback import verify_readback

        argv = verify.get("argv")
        env = verify.get("env") or {}
        if (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            answer["verify"] = verify_readback(argv, env)
        else:
            answer["verify"] = {"error": "bad verify request"}
    return answer


class Held:
    """The lease this session holds, released once: when stdin closes, whatever the session is
    doing then (a verify still running keeps running, read-only, but no longer holds the lease:
    the lock's descriptor is close-on-exec, so no child shares it), or when the session fails."""

    def __init__(self, fd: int, path: str) -> None:
        import threading

        self.fd, self.path = fd, path
        self._once = threading.Lock()
        self._released = False
        self._watcher: Optional[threading.Thread] = None

    def release(self) -> None:
        with self._once:
            if self._released:
                return
            self._released = True
            try:
                os.unlink(f"{self.path}.holder")
            except OSError:
                pass
            os.close(self.fd)  # releases the flock

    def watch(self, stdin: BinaryIO) -> None:
        """Hold until *stdin* closes (the driver closed it, died, or the connection dropped), in a
        thread, so the lease ends then even while a part of the request is still running."""
        import threading

        def run() -> None:
            try:
                while stdin.read(65536):
                    pass
            except (OSError, ValueError):
                pass
            finally:
                self.release()

        self._watcher = threading.Thread(target=run, daemon=True)
        self._watcher.start()

    def join(self) -> None:
        """Wait until the watcher has seen stdin close and released the lease (when one was started)."""
        if self._watcher is not None:
            self._watcher.join()

    @property
    def released(self) -> bool:
        return self._released


def serve(stdin: BinaryIO, out: TextIO, err: TextIO, probe: Optional[List[str]] = None) -> int:
    line = stdin.readline(REQUEST_LIMIT + 1)
    if not line:  # stdin closed before any request (the run ended before sending it): nothing asked
        return 0
    try:
        request = protocol.decode(line.decode("utf-8")) if line.endswith(b"\n") else None
    except (UnicodeDecodeError, ValueError):
        request = None
    if not isinstance(request, dict):
        err.write("vq-admin-agent: session: stdin must start with one JSON request object line\n")
        return EXIT_USAGE
    held: List[Held] = []

    def on_lease(fd: int, path: str) -> None:
        held.append(Held(fd, path))
        held[0].watch(stdin)

    try:
        answer = answer_request(request, on_lease, probe)
        if held and held[0].released and isinstance(answer.get("lease"), dict):
            answer["lease"]["released"] = "stdin closed before the answer"
        out.write(protocol.encode(answer))
        out.flush()
    except BaseException:
        for lease in held:
            lease.release()
        raise
    for lease in held:
        lease.join()
        lease.release()
    return 0


def main(argv: List[str]) -> int:
    if argv and argv[0] != protocol.PROBE:
        print("usage: vq-admin-agent session [--probe WORD...]  (one JSON request line on stdin)", file=sys.stderr)
        return EXIT_USAGE
    return serve(sys.stdin.buffer, sys.stdout, sys.stderr, argv[1:] if argv else None)
