"""``vq-admin-agent lease``: the host-side lease of one lane, held for as long as the work.

A lease is an exclusive, non-blocking ``flock(2)`` on a file in the agent's
own state directory of the login host's account,
``${XDG_STATE_HOME:-~/.local/state}/vq-admin-agent/locks/``: the file is
``runtime.<program>.lock`` (``helper.lock`` for the helper lane), so every
driver that logs in as that account finds the same lease, whatever its
configuration calls the host and whatever its ``scratch_root``.  The
directory and every directory above it must pass the secure-path rule
(:mod:`vq_admin.core.securepath`); it is created owner-only when missing.  Next to the
file, ``<file>.holder`` records who holds it (driver host, user, pid, start
time, run id, this agent's pid and its parent's), written atomically.

Once the lock is held, one JSON line ``{"held": true, ...}`` is printed and
the agent then blocks reading its stdin; each line it reads there is a record
entry of the run, appended under the lease (:func:`.record.serve_line`) and
answered with one line.  When stdin closes (the driver
closed it, the driver died, the ssh connection dropped) the holder record is
removed and the process exits, and the kernel frees the lock with it.

What a run leaves running holds the lease's second lock, ``<file>.work``,
for as long as it can change the runtime: the supervisor of a detached build
(from before it starts the provider until the provider ended) and the
``sbatch --wait`` of an allocation job (until the job ended); its record is
``<file>.work.holder``.  Taking the lease checks that lock too, so a second
run from any driver is 75 until the last of them ends, and a driver's death
frees only what it alone held (its session).

Never waits for a held lock: contention prints ``{"held": false, "holder":
{...}, "message": ...}`` and exits 75 (EX_TEMPFAIL); the message names what
holds it on this host (the agent, build or job, with its pid), whether the
run that started it still has its session here, and how it ends.  Only a
lock held without a live holder record (work starting or ending) is asked
for again for a few seconds (:func:`contended`), then named from
``/proc/locks``.  :func:`peek` reads who holds it without taking it
(``vq admin verify``).
A lock that cannot be taken for another reason (a filesystem without working
``flock``: NFS without local locks, Lustre without the ``flock`` mount
option) exits 1 with a message naming the path and the reason; an unsafe
directory exits 4.

Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time

from ..core import atomic, default_paths as paths, procs, protocol, securepath
from ..core.exits import EXIT_HELD, EXIT_UNSAFE
from ..core.names import is_name

# Annotations only (never evaluated): the lease is on the per-run path of the session verb, which
# stays near a bare interpreter start, so typing is not imported at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from argparse import Namespace
    from typing import BinaryIO, Optional, TextIO, Tuple

    from ..core.protocol import Holder, LeaseAnswer, LeaseRequest

LANES = ("runtime", "helper")
#: Largest line read on a held lease's stdin (a record entry: its statement and signature, as JSON text).
LINE_LIMIT = 1 << 20
WORK = ".work"
#: How long a contender waits for the holder record of a lock it just found held.
HOLDER_SETTLE_SECONDS = 1.0
#: How long a contender asks again for a held lock whose holder record is missing (work starting or
#: ending, a session between its flock and its record): it may free, or its record appear.
MISSING_SETTLE_SECONDS = 5.0
FLOCK_HINT = ("the lease directory (the account's ~/.local/state) must be on a filesystem where flock(2) works "
              "between every login host that shares it: a local filesystem, NFS with working locks between "
              "clients, or Lustre mounted with -o flock")


class LeaseError(Exception):
    """The lock could not be taken for a reason other than "held" (exit 1)."""


class WorkHeld(OSError):
    """What an earlier run left running still holds the lease's work lock (nothing is started)."""


def lock_name(lane: str, program: Optional[str]) -> str:
    if lane not in LANES:
        raise ValueError(f"lane {lane!r} is not one of {', '.join(LANES)}")
    if program is not None and not is_name(program):
        raise ValueError(f"program {program!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    if lane == "runtime" and not program:
        raise ValueError("the runtime lane's lease needs --program")
    if lane == "helper" and program:
        raise ValueError("the helper lane's lease takes no --program")
    return f"{lane}.{program}.lock" if program else f"{lane}.lock"


def read_holder(path: str) -> Optional[Holder]:
    try:
        with open(path + ".holder", "rb") as fh:
            holder: Optional[Holder] = protocol.decode(fh.read(65536).decode())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def current_holder(path: str, key: str = "agent_pid", settle: float = HOLDER_SETTLE_SECONDS,
                   ) -> Optional[Holder]:
    """The holder record of a held lock, once it names a live process under *key* (bounded wait).

    Between a holder's ``flock`` and its record's rename there is a short
    window; a record naming a dead process is the previous holder's.
    """
    deadline = time.monotonic() + settle
    while True:
        found = read_holder(path)
        if found is not None and procs.process_alive(found.get(key)):
            return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def contended(fd: int, path: str, key: str = "agent_pid", stale_ok: bool = False) -> Optional[Holder]:
    """What holds the lock of *path* that *fd* could not take: its record (naming a live process under
    *key*; with *stale_ok*, its last record too); a missing record is waited for, and the lock asked
    for again, up to :data:`MISSING_SETTLE_SECONDS`; then ``{"lock_holders": [...]}``, the processes
    ``/proc/locks`` names.  ``None`` when *fd* took the lock meanwhile (it freed)."""
    deadline = time.monotonic() + MISSING_SETTLE_SECONDS
    while True:
        found = current_holder(path, key) or (read_holder(path) if stale_ok else None)
        if found:
            return found
        if try_lock(fd, path):
            return None
        if time.monotonic() >= deadline:
            return {"lock_holders": procs.flock_holders(path), "settled": MISSING_SETTLE_SECONDS}
        time.sleep(0.1)


def _missing(holder: Holder) -> str:
    """A held lock without its record: the processes that hold it, as ``/proc/locks`` shows them."""
    found = ", ".join(f"pid {h.get('pid')} ({h.get('command') or 'command unknown'}, started "
                      f"{h.get('started') or 'at an unknown time'})" for h in holder.get("lock_holders") or ())
    settled = holder.get("settled")
    return (f"held by {found or 'a process this host does not show (on another host sharing this home?)'}, whose "
            "holder record is missing (the run or work is starting or ending"
            + (f": asked again for {settled:g} s)" if isinstance(settled, (int, float)) else ")"))


def peek(program: str) -> LeaseAnswer:
    """Who holds the runtime lease of *program* now, read without taking any lock (``vq admin verify``
    takes none): the lease, else its work lock, held when ``/proc/locks`` shows a ``flock`` on it (without
    ``/proc/locks``: when its holder record names a live process).  ``{"held": false}`` otherwise, and
    when the lease directory fails the secure-path rule (its records are not evidence then)."""
    directory = paths.agent_lock_dir()
    if securepath.path_problem(directory, what="lease directory"):
        return {"held": False}
    path = os.path.join(directory, lock_name("runtime", program))
    for lock, key, say in ((path, "agent_pid", describe), (path + WORK, "pid", describe_work)):
        holders = procs.flock_holders(lock) if os.path.exists("/proc/locks") else None
        found = current_holder(lock, key, settle=0.0)
        if holders == [] or (holders is None and not found):
            continue
        holder: Holder = found or read_holder(lock) or {"lock_holders": holders or []}
        return {"held": True, "lock": lock, "holder": holder, "message": say(holder)}
    return {"held": False}


def _ago(since: Optional[str]) -> str:
    from ..core.stamps import parse_utc  # contention only

    at = parse_utc(since)
    return "" if at is None else f" ({time.time() - at:.0f} s ago)"


def _connection(holder: Holder) -> str:
    """How the session agent's connection stands, judged from its ancestors (the shell and sshd that ran
    it, or the local driver): one of them stopped is a frozen connection."""
    pid = holder.get("agent_ppid")
    for _ in range(4):
        state = procs.process_state(pid) if isinstance(pid, int) and pid > 1 else None
        if state is None:
            break
        if state[0] in "Tt":
            return (f"; its connection is frozen (pid {pid}, which serves it, is stopped), so the driver that "
                    f"started it has given up on it (ssh's ServerAlive ends that side): the lease ends when pid "
                    f"{pid} is continued or ended (kill {pid}), not by itself")
        pid = state[1]
    if procs.process_state(holder.get("agent_ppid", 0)) is None:
        return (f"; the connection that started it is gone: the lease ends when the agent "
                f"(pid {holder.get('agent_pid')}) exits")
    return "; its run is under way: the lease ends when that run ends or its connection drops"


def describe(holder: Optional[Holder]) -> str:
    if not holder:
        return "holder not recorded"
    if "lock_holders" in holder:
        return _missing(holder)
    return (f"held by the agent pid {holder.get('agent_pid')} on {holder.get('agent_host')} for run "
            f"{holder.get('run_id')} of {holder.get('user')}@{holder.get('driver_host')} pid {holder.get('pid')}, "
            f"since {holder.get('since')}{_ago(holder.get('since'))}" + _connection(holder))


def describe_work(work: Optional[Holder]) -> str:
    """What holds the work lock: a detached build or an allocation job an earlier run left running."""
    if not work:
        return "held by a build or job whose record is missing"
    if "lock_holders" in work:
        return _missing(work)
    run: Holder = work.get("session") or {}
    started = (f"run {run.get('run_id')} of {run.get('user')}@{run.get('driver_host')} pid {run.get('pid')}"
               if run else "a run")
    session = run.get("agent_pid")
    driver = ("whose session on this host (agent pid {}) is still open".format(session)
              if procs.process_alive(session) else "whose driver has ended (its session here is gone)")
    job = work.get("job_id") or "(id not yet recorded)"
    if work.get("kind") == "confirm":
        return (f"held by the confirmation job {job} (attempt {work.get('attempt')}, supervisor pid {work.get('pid')} "
                f"on {work.get('host')}) that {started} submitted, {driver}; it ends when the job has ended and, "
                f"if it failed, the previous generation is re-activated (squeue -j {job})")
    if work.get("kind") == "job":
        return (f"held by the allocation job {job} (attempt {work.get('attempt')}, sbatch --wait pid "
                f"{work.get('pid')} on {work.get('host')}) that {started} submitted, {driver}; it ends when the "
                f"job ends (squeue -j {job}; scancel {job} to end it)")
    return (f"held by the build pid {work.get('pid')} (attempt {work.get('attempt')}, supervisor pid "
            f"{work.get('supervisor_pid')} on {work.get('host')}, since {work.get('since')}{_ago(work.get('since'))}) "
            f"that {started} started, {driver}; it ends when the build ends")


def write_holder(path: str, record: Holder) -> None:
    """Replace the holder record of the lock *path* (:func:`read_holder`'s), atomically (a temporary file
    renamed over it).

    Not ``fsync``-ed: the record means something only while the process it names runs (a reader
    checks that, :func:`current_holder`), and a crash of the host ends that process and frees its
    flock, so a record lost or emptied by a crash is only the stale record of a lease nobody
    holds.  Other processes see it as soon as it is renamed; an fsync would cost every run a
    disk flush (several ms on a local disk, more on a shared scratch filesystem).
    """
    atomic.write(path + ".holder", protocol.encode(record).encode(), sync=False)


def open_lock(path: str) -> int:
    """Open (or create) the lock file without following a symlink."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LeaseError(f"lock file {path} is a symbolic link; refusing to follow it") from None
        raise LeaseError(f"cannot open lock file {path}: {exc.strerror}") from None


def try_lock(fd: int, path: str) -> bool:
    """True when the exclusive lock is now held; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise LeaseError(f"cannot take flock on {path}: {exc.strerror or exc}; {FLOCK_HINT}") from None


def work_holder(path: str) -> Optional[Holder]:
    """``None`` when nothing holds the work lock of the lease *path*, else its record (``{}``: none yet)."""
    fd = open_lock(path + WORK)
    try:
        if try_lock(fd, path + WORK):
            return None
        return contended(fd, path + WORK, key="pid", stale_ok=True)
    finally:
        os.close(fd)  # releases it when it was free


def hold_work(program: str) -> Tuple[int, str]:
    """Take the work lock of *program*'s runtime lease for a build or job about to start: ``(fd, lease
    path)``; the holder keeps *fd* open until the work has ended.  Raises :class:`WorkHeld`."""
    directory = paths.agent_lock_dir()
    securepath.make_private_dir(directory, what="lease directory")
    path = os.path.join(directory, lock_name("runtime", program))
    fd = open_lock(path + WORK)
    if not try_lock(fd, path + WORK):
        found = current_holder(path + WORK, key="pid") or read_holder(path + WORK)
        os.close(fd)
        raise WorkHeld(f"the host-side lease {path} is {describe_work(found)}; nothing was started")
    return fd, path


def record_work(path: str, record: Holder) -> None:
    """Record what holds the work lock of the lease *path* (with the session that started it)."""
    record = {**record, "session": read_holder(path) or {}, "host": os.uname().nodename}
    write_holder(path + WORK, record)


def end_work(fd: int, path: str) -> None:
    """The work that held the work lock of the lease *path* (through *fd*) has ended: its record goes, and
    the lock with *fd* (unless another process still shares it)."""
    release(fd, path + WORK)


def take(request: LeaseRequest) -> Tuple[LeaseAnswer, Optional[int]]:
    """Take the lease a ``lease`` or ``session`` request names: ``(answer, fd holding it or None)``;
    the answer's ``exit`` is 75 held (by a session, or by work an earlier run left running), 4 an
    unsafe directory, 2 a bad request, 1 any other reason."""
    holder = request.get("holder")
    try:
        name = lock_name(request.get("lane"), request.get("program"))  # type: ignore[arg-type]
        if not isinstance(holder, dict):
            raise ValueError("no holder record")
    except (ValueError, TypeError) as exc:
        return {"held": False, "exit": 2, "error": f"lease: {exc}"}, None
    directory = paths.agent_lock_dir()
    path = os.path.join(directory, name)
    fd = -1
    try:
        securepath.make_private_dir(directory, what="lease directory")
        fd = open_lock(path)
        found = None if try_lock(fd, path) else contended(fd, path)
        answer: LeaseAnswer
        if found is not None:
            answer = {"held": False, "exit": EXIT_HELD, "lock": path, "holder": found, "message": describe(found)}
        else:
            work = work_holder(path)
            if work is None:
                record: Holder = {**holder, "agent_pid": os.getpid(), "agent_ppid": os.getppid(),
                                  "agent_host": os.uname().nodename}
                write_holder(path, record)
                return {"held": True, "lock": path, "holder": record}, fd
            answer = {"held": False, "exit": EXIT_HELD, "lock": path + WORK, "holder": work,
                      "message": describe_work(work)}
    except securepath.Untrusted as exc:
        answer = {"held": False, "exit": EXIT_UNSAFE, "error": f"refused: {exc}"}
    except LeaseError as exc:
        answer = {"held": False, "exit": 1, "error": f"lease: {exc}"}
    except OSError as exc:
        answer = {"held": False, "exit": 1, "error": f"lease: cannot write {path}.holder: {exc.strerror}"}
    if fd >= 0:
        os.close(fd)
    return answer, None


def release(fd: int, path: str) -> None:
    """Remove the holder record, then close *fd* (which frees the lock)."""
    try:
        os.unlink(path + ".holder")
    except OSError:
        pass
    os.close(fd)


class Held:
    """The lease a session (or the ``lease`` verb) holds until *stdin* closes (the driver closed it, died,
    or the connection dropped), watched in a thread from the start, so the lease ends then whatever the
    session is doing (a verify still running keeps running, read-only, but no longer holds the lease: the
    lock's descriptor is close-on-exec, so no child shares it); released once, then or when the session
    fails.  Each line read meanwhile is a record entry of the run, appended under the lease and answered
    on *out* (:func:`.record.serve_line`) once :attr:`answered` is set."""

    def __init__(self, fd: int, path: str, stdin: BinaryIO, out: TextIO, program: Optional[str]) -> None:
        import threading

        self.fd, self.path, self.out, self.program = fd, path, out, program
        self.answered = threading.Event()  # the session's own answer is out: append answers may follow
        self.released = False
        self._once = threading.Lock()
        self.watcher = threading.Thread(target=self._watch, args=(stdin,), daemon=True)
        self.watcher.start()

    def _watch(self, stdin: BinaryIO) -> None:
        try:
            while True:
                line = stdin.readline(LINE_LIMIT + 1)
                if not line:
                    break
                if line.strip():  # a record entry of the run, under its lease
                    from .record import serve_line

                    answer = serve_line(line, self.program)
                    self.answered.wait()
                    self.out.write(protocol.encode(answer))
                    self.out.flush()
        except (OSError, ValueError):
            pass
        finally:
            self.release()

    def release(self) -> None:
        with self._once:
            if not self.released:
                self.released = True
                release(self.fd, self.path)


def main_lease(args: Namespace) -> int:
    holder: Holder = {"host": args.host, "driver_host": args.driver_host, "user": args.user, "pid": args.pid,
              "since": args.since, "run_id": args.run_id}
    answer, fd = take({"lane": args.lane, "program": args.program, "holder": holder})
    if fd is None:
        if "error" in answer:
            print(f"vq-admin-agent: {answer['error']}", file=sys.stderr)
        else:
            print(protocol.encode(answer), end="", flush=True)
        return int(answer["exit"])
    if args.record_after is not None:  # the host's record rides on the lease's answer
        from .record import read_after

        answer["record"] = read_after(args.program, max(0, args.record_after))
    print(protocol.encode(answer), end="", flush=True)
    held = Held(fd, answer["lock"], sys.stdin.buffer, sys.stdout, args.program)
    held.answered.set()
    held.watcher.join()  # stdin closed: the lease is released
    return 0
