"""The read-only runtime verify and the launcher read-back, in one agent call.

``vq-admin-agent verify-readback -- VERIFY_ARGV...`` runs the provider's
read-only verify command (an argv, never through a shell), reads the
``active_path`` its receipt names and hashes that file, and prints one JSON
object::

    {"verify": {"exit_code": 0, "stdout": "...", "stderr": "...", "seconds": 0.03},
     "readback": {"path": "...", "exists": true, "regular": true, "sha256": "...", ...} | null,
     "readback_exit": 0 | 1 | null, "readback_seconds": 0.001}

so the driver's already-current check costs one ssh round trip.  The driver
still parses and checks the verify receipt itself (``vq_admin.lanes.verify``);
the agent only reads: it never trusts, changes or removes anything.
``readback`` is null when the verify's stdout is not a JSON object naming an
absolute ``active_path`` (the driver then reports the receipt's problem).

``hash-file PATH`` (the read-back alone) is :func:`hash_answer`.

Standard library only; of the agent only the protocol's JSON codec,
:mod:`.spawn` (the agent's one process runner) and :mod:`vq_admin.core.securepath` (a
launcher another user could replace is answered with exit 77 and
``untrusted``, never hashed).
"""

from __future__ import annotations

import os
import stat
import sys
import time

from ..core import protocol
from ..core.exits import EXIT_FAILED, EXIT_USAGE, REFUSED as EXIT_UNSAFE
TYPE_CHECKING = False  # not typing's: the agent's fast path never imports typing
if TYPE_CHECKING:
    from ..core.protocol import Hashed, VerifyReadback, VerifyRun

#: Largest verify stdout passed back (a verify receipt is a few hundred bytes).
STDOUT_LIMIT = 4 << 20
#: The tail of the verify's stderr passed back.
STDERR_TAIL = 64 << 10


def hash_answer(path: str) -> tuple[Hashed, int]:
    """The ``hash-file`` answer for *path* (following symlinks) and its exit status: 77 (``untrusted``
    names the offender and the fix, no hash) when another user could replace the launcher (the
    secure-path rule, CONTRACT section 10)."""
    try:
        st = os.stat(path)
        real = os.path.realpath(path)
        lst = os.lstat(path)
    except OSError as exc:
        return {"path": path, "exists": False, "error": exc.strerror}, EXIT_FAILED
    if not stat.S_ISREG(st.st_mode):
        return {"path": path, "exists": True, "regular": False, "error": "not a regular file"}, EXIT_FAILED
    from ..core.filehash import file_sha256
    from ..core.securepath import path_problem

    untrusted = path_problem(path, what="launcher")  # it, its real path and every directory above both
    if untrusted:
        return {"path": path, "exists": True, "regular": True, "untrusted": untrusted, "error": untrusted}, EXIT_UNSAFE
    try:
        digest = file_sha256(path)
    except OSError as exc:
        return {"path": path, "exists": True, "regular": True, "error": exc.strerror}, EXIT_FAILED
    return {
        "path": path,
        "exists": True,
        "regular": True,
        "is_symlink": stat.S_ISLNK(lst.st_mode),
        "realpath": real,
        "size": st.st_size,
        "executable": bool(st.st_mode & 0o111),
        "sha256": digest,
    }, 0


def _text(data: bytes) -> str:
    """Bytes as JSON-safe text; the driver recovers them with ``surrogateescape``."""
    return data.decode("utf-8", "surrogateescape")


def active_path_of(stdout: bytes) -> str | None:
    """The absolute ``active_path`` the verify receipt names, or ``None``."""
    try:
        value = protocol.decode(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # nested too deep: the driver fails it (1)
        return None
    path = value.get("active_path") if isinstance(value, dict) else None
    return path if isinstance(path, str) and path.startswith("/") and "\0" not in path else None


def verify_readback(argv: list[str], env: dict[str, str] | None = None, timeout: float | None = None,
                    ) -> VerifyReadback:
    """Run the verify *argv* (with *env* added to this environment; at most *timeout* seconds: then its
    process group is ended and ``verify.timed_out`` names the bound), then hash the launcher its receipt names."""
    from . import spawn

    started = time.monotonic()
    timed_out = None
    try:
        code, out, err = spawn.run_captured(argv, dict(os.environ, **env) if env else None, timeout)
    except OSError as exc:  # as a shell would report it: 127 not found, 126 not executable
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        out, err = b"", f"{argv[0]}: {exc.strerror}\n".encode()
    except spawn.TimeoutExpired as exc:
        code, out, err, timed_out = None, exc.output or b"", exc.stderr or b"", timeout
    verify: VerifyRun = {"exit_code": code, "stdout": _text(out[:STDOUT_LIMIT]),
                         "stdout_truncated": len(out) > STDOUT_LIMIT, "stderr": _text(err[-STDERR_TAIL:]),
                         "seconds": round(time.monotonic() - started, 6)}
    answer: VerifyReadback = {"verify": verify, "readback": None, "readback_exit": None, "readback_seconds": None}
    if timed_out is not None:
        verify["timed_out"] = timed_out
    elif len(out) <= STDOUT_LIMIT:  # a receipt read whole
        path = active_path_of(out)
        if path is not None:
            started = time.monotonic()
            answer["readback"], answer["readback_exit"] = hash_answer(path)
            answer["readback_seconds"] = round(time.monotonic() - started, 6)
    return answer


def main(argv: list[str]) -> int:
    """``verify-readback [--lease-of PROGRAM [--record-after N]] [--] ARGV...``; exit 0 when the answer was
    printed.

    With ``--lease-of`` (``vq admin verify``, which takes no lease) the answer also says who holds that
    program's runtime lease now (``lease``: :func:`vq_admin.agent.lease.peek`, read without taking it)."""
    program, after = None, None
    if argv[:1] == [protocol.LEASE_OF] and len(argv) > 1:  # the fast path's: the verb table's is the same
        program, argv = argv[1], argv[2:]
        if argv[:1] == [protocol.RECORD_AFTER] and len(argv) > 1 and argv[1].isdigit():
            after, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0].startswith("-"):
        print("usage: vq-admin-agent verify-readback [--lease-of PROGRAM] -- VERIFY_COMMAND [ARG...]",
              file=sys.stderr)
        return EXIT_USAGE
    answer = verify_readback(argv)
    if program is not None:
        from .lease import peek

        try:
            answer["lease"] = peek(program)
        except (OSError, ValueError) as exc:  # a program name the lease refuses, an unreadable directory
            answer["lease"] = {"held": False, "error": str(exc)}
        if after is not None:  # the host's record rides on the read-only verify (vq admin verify)
            from .record import read_after

            answer["record"] = read_after(program, after)
    sys.stdout.write(protocol.encode(answer))
    sys.stdout.flush()
    return 0
