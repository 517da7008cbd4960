"""Driver side of the agent's framed allocation stream.

:func:`stream_call` runs ``alloc-run`` or ``alloc-reconcile`` through a
transport and reads its records as they arrive (see
:mod:`vq_admin.core.frames`): the job id is known the moment the agent
reports it, even if the connection drops later.  The transcripts are
streamed, in constant memory, into the driver's copy next to the receipt
(:class:`TranscriptSink`), which also checksums them, collects
``VQ-DEPLOY-METRIC`` lines from the whole stream and keeps the tail that the
receipt's ``command_output`` carries.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Sequence

from ..ssh import process
from ..core import checksum
from ..core.failpoints import failpoint
from ..core.frames import FrameError, read_frames
from ..document import Count, Document, DocumentError, JsonObject, JsonValue
from ..report.receipt import OUTPUT_KEPT, head_and_tail, parse_metrics
from ..report.sections import Metrics
from ..core import atomic
from ..report.outcome import VqAdminError
from ..ssh.transport import Transport, describe_interruption
from ..plan import SlotValue, Step, execute_stream

if TYPE_CHECKING:
    from ..state.records import StateDir

#: What is told of each record of the stream as it arrives: its kind and its value, as the agent sent it.
OnRecord = Callable[[str, JsonObject], None]
METRIC_PREFIX = b"VQ-DEPLOY-METRIC "
MAX_METRIC_LINE = 64 << 10


class TranscriptSink:
    """One transcript (``stdout`` or ``stderr``) arriving in chunks.

    Written to a temporary file in *directory* and renamed into place by
    :meth:`commit`, so the driver's copy is never half-written.  A state
    filesystem that is full or failing only ends the copy: :attr:`error` says
    why, and the checksum, metrics and tail go on from the stream itself.
    """

    def __init__(self, directory: Path | OSError, name: str, keep: int = OUTPUT_KEPT,
                 algorithm: str = checksum.XXH3):
        """*directory* is where the copy goes, or the error that stopped its creation."""
        self.directory = Path(directory.filename or "") if isinstance(directory, OSError) else Path(directory)
        self.name = name
        self.keep = keep
        self.bytes = 0
        self.algorithm = algorithm
        self._hash = checksum.new(algorithm)
        self._head = bytearray()  # the first keep // 2 bytes: with the tail, what the receipt shows
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self._line = bytearray()
        self._line_dropped = False
        self.metrics: Metrics = {}
        self.error: str | None = None
        self._tmp = ""  # atomic.temp_name: with our pid, a later run removes it if we are killed
        self._fh: IO[bytes] | None = None
        try:
            if isinstance(directory, OSError):
                raise directory
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, self._tmp = atomic.open_temp(str(self.directory / name))
            self._fh = os.fdopen(fd, "wb")
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """The copy cannot be written (a full or failing state filesystem): drop it, say why."""
        self.error = exc.strerror or str(exc)
        self.discard()

    def use_checksum(self, algorithm: str) -> None:
        """Checksum with *algorithm* (the one the agent names); only before any data arrived."""
        if algorithm != self.algorithm and not self.bytes:
            self._hash, self.algorithm = checksum.new(algorithm), algorithm

    def write(self, chunk: bytes) -> None:
        if self._fh is not None:
            try:
                self._fh.write(chunk)
            except OSError as exc:
                self._fail(exc)
        self._hash.update(chunk)
        if len(self._head) < self.keep // 2:
            self._head += chunk[: self.keep // 2 - len(self._head)]
        self.bytes += len(chunk)
        self._tail.append(chunk)
        self._tail_bytes += len(chunk)
        while self._tail and self._tail_bytes - len(self._tail[0]) >= self.keep:
            self._tail_bytes -= len(self._tail.popleft())
        self._scan_lines(chunk)

    def _scan_lines(self, chunk: bytes) -> None:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            piece = chunk[start:] if nl < 0 else chunk[start:nl]
            if not self._line_dropped:
                if len(self._line) + len(piece) > MAX_METRIC_LINE:
                    self._line_dropped, self._line = True, bytearray()
                elif self._line or piece.startswith(METRIC_PREFIX[: len(piece)]):
                    self._line += piece
                else:
                    self._line_dropped = True
            if nl < 0:
                return
            self._end_line()
            start = nl + 1

    def _end_line(self) -> None:
        if not self._line_dropped and self._line.startswith(METRIC_PREFIX):
            self.metrics.update(parse_metrics(self._line.decode("utf-8", "replace")))
        self._line, self._line_dropped = bytearray(), False

    @property
    def digest(self) -> str:
        """The hex digest of everything written, in :attr:`algorithm`."""
        return self._hash.hexdigest()

    def digest_as(self, algorithm: str) -> str:
        """The digest in *algorithm*; a different one re-reads the committed copy."""
        if algorithm == self.algorithm:
            return self.digest
        h = checksum.new(algorithm)
        try:
            with open(self.directory / self.name, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            return "(the driver's copy is unreadable)"
        return h.hexdigest()

    @property
    def truncated(self) -> bool:
        return self.bytes > self.keep

    def text(self) -> str:
        """Everything written, or its head and tail (:attr:`keep` bytes in all) around a marker."""
        data = b"".join(self._tail)
        if not self.truncated:
            return data.decode("utf-8", "replace")
        half = self.keep // 2
        return head_and_tail(bytes(self._head), data[-(self.keep - half):], self.bytes)

    def commit(self) -> Path | None:
        """Close and rename into ``<directory>/<name>``; returns the final path (``None``: not stored,
        :attr:`error` says why)."""
        self._end_line()
        if self._fh is None:
            return None
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            final = self.directory / self.name
            atomic.commit(self._tmp, str(final))
        except OSError as exc:
            self._fail(exc)
            return None
        return final

    def discard(self) -> None:
        if self._fh is not None and not self._fh.closed:
            try:
                self._fh.close()
            except OSError:
                pass  # what it could not flush is dropped with it
        self._fh = None
        try:
            if self._tmp:
                atomic.discard(self._tmp)
        except OSError:
            pass


class Settle(Document, frozen=True, kw_only=True):
    """How the agent settled the transcripts (the ``settle`` of its summary; docs/allocation-transcripts.md)."""

    settled: bool = False
    reason: str | None = None
    observations: Count = 0
    seconds: float | None = None
    checksum: str | None = None


class Cancel(Document, frozen=True, kw_only=True):
    """How the agent ended a job or build at its bound (``scancel``, or the build's process group)."""

    ok: bool = False
    message: str | None = None


class Summary(Document, frozen=True, kw_only=True):
    """The agent's ``summary`` record of ``alloc-run``/``alloc-reconcile``, ``detach-run``/``detach-reconcile``
    and the confirmation job's calls (:func:`vq_admin.agent.allocation.base_summary` and what they add)."""

    job_id: str | None = None
    submitted: bool | None = None
    sbatch_exit_code: int | None = None
    sbatch_stderr: str = ""
    exit_code: int | None = None
    exit_signal: int | None = None
    pid: int | None = None
    job_state: str | None = None
    job_exit_code: str | None = None
    never_started: bool | None = None
    established: bool = False
    timed_out: bool = False
    cancel: Cancel | None = None
    fenced: bool = False
    notes: tuple[str, ...] = ()
    settle: Settle = Settle()


class Sent(Document, frozen=True, kw_only=True):
    """What the agent says it streamed of one transcript (the ``end`` record's ``sent``)."""

    bytes: Count = 0
    checksum: str | None = None
    digest: str | None = None
    settled_digest: str | None = None


@dataclass
class StreamCall:
    """What one framed agent call delivered."""

    argv: list[str]
    where: str
    exit_code: int | None = None
    interrupted: str | None = None  # None | "transport" | "timeout"
    seconds: float = 0.0
    stderr: str = ""
    records: dict[str, JsonObject] = field(default_factory=dict)  #: the last record of each kind
    ended: bool = False
    frame_error: str | None = None
    step: Any = None  # the plan step this call was recorded in

    @property
    def summary(self) -> Summary | None:
        """The agent's ``summary`` record (``None``: none arrived); one that is not one ends the stream."""
        value = self.records.get("summary")
        return None if value is None else Summary.from_value(value, f"the summary from {self.where}")

    def answered(self, name: str) -> JsonValue:
        """The member *name* of the agent's summary as it sent it (``None``: absent, or no summary arrived)."""
        return self.records.get("summary", {}).get(name)

    @property
    def sent(self) -> dict[str, Sent]:
        """What the agent says it sent of each transcript (empty: the ``end`` record did not arrive)."""
        sent = self.records.get("end", {}).get("sent")
        return {name: Sent.from_value(value, f"the end record from {self.where}")
                for name, value in (sent if isinstance(sent, dict) else {}).items()}

    @property
    def complete(self) -> bool:
        """The agent finished and everything it sent arrived."""
        return self.exit_code == 0 and self.interrupted is None and self.ended and "summary" in self.records

    def describe(self) -> str:
        if self.interrupted == "timeout":
            return f"timed out after {self.seconds:.0f} s on {self.where}"
        if self.interrupted == "transport":
            tail = self.stderr.strip().splitlines()[-1:] or ["(no message)"]
            return f"{describe_interruption(self.where, self.exit_code)}: {tail[0]}"
        if self.frame_error:
            return f"unreadable answer from {self.where}: {self.frame_error}"
        return f"exit status {self.exit_code} on {self.where}"


def _on_record(call: StreamCall, sinks: dict[str, TranscriptSink], kind: str, value: JsonObject,
               observer: OnRecord | None = None) -> None:
    call.records[kind] = value
    try:  # a summary or end record that is not one is an unreadable answer
        summary, _ = call.summary, call.sent
    except DocumentError as exc:
        del call.records[kind]  # never read again
        raise FrameError(str(exc)) from None
    if observer is not None:
        observer(kind, value)
    if kind == "summary" and summary is not None:  # the agent names its checksum before the transcripts follow
        algorithm = summary.settle.checksum
        if algorithm in checksum.ALGORITHMS:
            for sink in sinks.values():
                sink.use_checksum(algorithm)


def discard(sinks: dict[str, TranscriptSink]) -> None:
    """Drop the transcript copies of a call that is not kept (and their directory, when nothing else is in it)."""
    for sink in sinks.values():
        sink.discard()
    for directory in {sink.directory for sink in sinks.values()}:
        try:
            directory.rmdir()  # only when nothing else is in it
        except OSError:
            pass


def framed_step(step: Step, transport: Transport, values: dict[str, SlotValue], timeout: float, state: StateDir,
                receipt_id: str, *, prefix: str = "", on_record: OnRecord | None = None,
                starting: Callable[[], None] | None = None) -> tuple[StreamCall, dict[str, TranscriptSink]]:
    """Run *step* (exactly its planned argv, slots filled from *values*) as one framed agent call on *transport*
    into fresh transcript sinks (``PREFIXstdout``, ``PREFIXstderr`` in the receipt's transcript directory);
    *starting* (the attempt record) runs once the step has started and was not refused, just before the call.
    The step gets the call's exit status, time and status; the caller settles it."""
    sinks: dict[str, TranscriptSink] = {}

    def stream(argv: list[str]) -> StreamCall:
        # the attempt record, the transcript directory and the sinks' temporary files exist only once
        # the step runs: a step refused, or killed, at its start leaves none of them behind
        try:
            if starting is not None:
                starting()
        except OSError as exc:
            raise VqAdminError(f"cannot record the attempt in the state directory {state.root}: "
                               f"{exc.strerror or exc}; no job was submitted") from None
        try:
            directory: Path | OSError = state.transcript_dir(receipt_id)
        except OSError as exc:  # a full or failing state filesystem: the sinks say so, the call goes on
            directory = exc
        sinks.update((name, TranscriptSink(directory, prefix + name)) for name in ("stdout", "stderr"))
        return stream_call(transport, argv, timeout=timeout, sinks=sinks, on_record=on_record)

    try:
        call = execute_stream(step, transport, stream, values=values)
    except BaseException:
        discard(sinks)
        raise
    call.step = step
    step.exit_code, step.seconds = call.exit_code, call.seconds
    step.status = "ok" if call.complete else "interrupted" if call.interrupted or call.frame_error else "failed"
    if not call.complete:
        step.detail = call.describe() + (f": {call.stderr.strip()[-300:]}" if call.stderr.strip() else "")
    return call, sinks


def stream_call(transport: Transport, argv: Sequence[str], *, timeout: float,
                sinks: dict[str, TranscriptSink],
                on_record: OnRecord | None = None) -> StreamCall:
    """Run *argv* through *transport*, feeding records and transcript chunks as they arrive.

    It runs through :func:`vq_admin.ssh.process.run` in stream mode: the whole call is
    bounded by *timeout* (the local process group is ended at the bound:
    ``interrupted = "timeout"``); ssh's own exit 255, or the ssh client ended by a
    signal, is ``interrupted = "transport"``.
    """
    argv = [str(a) for a in argv]
    call = StreamCall(argv, transport.where)
    full = transport.wrap(argv, {})
    fault = failpoint("call", transport.where, *argv)
    if fault == "drop-before":
        call.exit_code, call.interrupted = process.FAULT_OUTCOMES[fault]
        call.stderr = "vq-admin test fault: connection dropped before the command ran"
        return call

    def read(stdout: IO[bytes]) -> bool:
        try:
            call.ended = read_frames(stdout, lambda kind, value: _on_record(call, sinks, kind, value, on_record),
                                     lambda name, chunk: sinks[name].write(chunk))
        except FrameError as exc:  # not the agent's stream: stop following it (the process group is killed)
            call.frame_error = str(exc)
            return True
        return False

    # SIGTERM/SIGINT of vq-admin ends the local ssh at once (the runner kills its group), never waiting for the job
    done = process.run(full, timeout=timeout, read_stdout=read, stderr_tail=True)
    call.seconds = done.seconds
    call.stderr = done.stderr[-(64 << 10):].decode("utf-8", "replace")
    if done.ended == process.NOT_STARTED:
        call.exit_code, call.stderr = done.returncode, done.stderr.decode("utf-8", "replace").strip()
        return call
    if call.frame_error is None and done.ended == process.TIMED_OUT:
        call.interrupted = "timeout"
    else:
        call.exit_code = done.returncode
        call.interrupted = process.classify_exit(done.returncode, transport.transport_exit)
    if fault in process.FAULT_OUTCOMES:  # a test fault after the call really ran (failpoint "call")
        call.exit_code, call.interrupted = process.FAULT_OUTCOMES[fault]
    return call
