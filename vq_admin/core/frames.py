"""The framed stdout of ``alloc-run`` and ``alloc-reconcile``.

The agent reports progress and streams the settled transcripts on one
stdout, so the transcripts are read while the attempt is still protected
from other runs' retention, and the driver learns the job id the moment it
exists (before any drop of the connection).  Each record is one line
``<kind> <payload>\\n``:

=========  ==================================================================
``attempt`` JSON: the attempt directory, once created (or opened)
``job``     JSON: the Slurm job id, the moment sbatch printed it
``summary`` JSON: exit status, job end, settle result, retention
``out N``   followed by exactly N raw bytes of the ``stdout`` transcript
``err N``   followed by exactly N raw bytes of the ``stderr`` transcript
``end``     JSON: bytes and checksum of everything sent per file; last record
``progress`` JSON: queue state, transcript's last line, settle observations;
            only with ``alloc-run --progress`` (see :mod:`.progress`)
=========  ==================================================================

A stream without ``end`` was cut short.  Writes after the reader has gone
(a dropped ssh session) are silently dropped: the agent still finishes its
work, and a later ``alloc-reconcile`` streams the same files again.

Standard library (+ ``xxhash`` when importable, else ``blake2b``: see
:mod:`.checksum`); shared by the agent (writer) and the driver (reader).
Python 3.8 and later.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import IO, TYPE_CHECKING, Callable, Mapping

from . import checksum
from .bounds import loads_json

if TYPE_CHECKING:
    from .bounds import JsonObject

CHUNK = 1 << 20
DATA_KINDS = {"out": "stdout", "err": "stderr"}
JSON_KINDS = ("attempt", "job", "summary", "end", "progress")
MAX_LINE = 1 << 20


class FrameError(ValueError):
    """The stream is not in this format."""


class FrameWriter:
    """Writes records to a file descriptor (stdout by default); thread-safe."""

    def __init__(self, fd: int = 1):
        self.fd = fd
        self.broken = False
        self._lock = threading.Lock()

    def _write(self, data: bytes) -> None:
        if self.broken:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError:  # the reader has gone (BrokenPipeError, ConnectionResetError among them)
            self.broken = True

    def record(self, kind: str, payload: Mapping[str, object]) -> None:
        line = f"{kind} {json.dumps(payload, sort_keys=True, ensure_ascii=True)}\n".encode("ascii")
        with self._lock:
            self._write(line)

    def stream_file(self, kind: str, dir_fd: int, name: str, limit: int | None, algorithm: str) -> dict[str, object]:
        """Send file *name* below *dir_fd* (at most *limit* bytes) as ``kind`` records.

        Returns ``{"bytes", "checksum", "digest", "error"}`` for what was sent
        (``checksum`` names the *algorithm* of ``digest``, :mod:`.checksum`'s).
        """
        h = checksum.new(algorithm)

        def result(error: str | None) -> dict[str, object]:
            return {"bytes": sent, "checksum": algorithm, "digest": h.hexdigest(), "error": error}

        sent = 0
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except OSError as exc:
            return result(exc.strerror or str(exc))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return result("not a regular file")
            while limit is None or sent < limit:
                chunk = os.read(fd, CHUNK if limit is None else min(CHUNK, limit - sent))
                if not chunk:
                    break
                h.update(chunk)
                sent += len(chunk)
                with self._lock:
                    self._write(f"{kind} {len(chunk)}\n".encode("ascii"))
                    self._write(chunk)
            return result(None)
        except OSError as exc:
            return result(exc.strerror or str(exc))
        finally:
            os.close(fd)


def read_frames(stream: IO[bytes], on_record: Callable[[str, JsonObject], None],
                on_data: Callable[[str, bytes], None]) -> bool:
    """Read records from *stream* until EOF; True when the ``end`` record arrived.

    ``on_data`` gets ``("stdout" | "stderr", chunk)``.  Raises
    :class:`FrameError` on anything that is not this format.
    """
    ended = False
    while True:
        line = stream.readline(MAX_LINE)
        if not line:
            return ended
        if ended:
            raise FrameError("data after the end record")
        if not line.endswith(b"\n"):
            if len(line) >= MAX_LINE:
                raise FrameError("record line too long")
            return ended  # cut in the middle of a line
        kind, _, payload = line[:-1].decode("ascii", "replace").partition(" ")
        if kind in DATA_KINDS:
            if not payload.isdigit():
                raise FrameError(f"bad length in {kind!r} record")
            remaining = int(payload)
            while remaining:
                chunk = stream.read(min(CHUNK, remaining))
                if not chunk:
                    return False
                on_data(DATA_KINDS[kind], chunk)
                remaining -= len(chunk)
        elif kind in JSON_KINDS:
            try:
                value = loads_json(payload, f"{kind} record", limit=MAX_LINE)
            except ValueError:
                raise FrameError(f"{kind} record is not JSON") from None
            if not isinstance(value, dict):
                raise FrameError(f"{kind} record is not an object")
            on_record(kind, value)
            ended = kind == "end"  # not ended before: data after the end record raised above
        else:
            raise FrameError(f"unknown record {kind[:40]!r}")
