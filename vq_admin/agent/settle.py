"""Settling an allocation transcript after ``sbatch --wait`` returns.

A batch job's ``stdout`` and ``stderr`` are written on a compute node; the
login host may see them late (shared-filesystem attribute caches, delayed
flushes).  The rule, from the product document:

* observe both files at one-second intervals, at most ten observations;
* an observation is the pair of checksums (and sizes) of the two files
  (xxh3-64, or blake2b where ``xxhash`` is not importable: see
  :mod:`vq_admin.core.checksum`), each streamed in 1 MiB chunks, so memory stays constant whatever
  their size; each observation opens the files afresh;
* the transcript has *settled* when three consecutive observations are
  identical, both files are readable, and together they hold some output.

When it does not settle within ten observations the last observation gives
the reason: a file missing or unreadable -> ``unavailable``; both files
empty -> ``empty``; otherwise -> ``unstable``.  This bounded settle handles
ordinary visibility delays; it cannot certify completeness after arbitrary
delayed writes.

Standard library (+ ``xxhash`` when importable); runs inside
``vq-admin-agent`` on Python 3.8 and later.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence, Tuple

from ..core import checksum

CHUNK = 1 << 20
INTERVAL = 1.0
MAX_OBSERVATIONS = 10
REQUIRED_IDENTICAL = 3
FILES = ("stdout", "stderr")


@dataclass(frozen=True)
class FileState:
    """One file at one observation: its size and checksum, or why it could not be read."""

    size: Optional[int] = None
    digest: Optional[str] = None
    error: Optional[str] = None

    @property
    def readable(self) -> bool:
        return self.error is None


Observation = Tuple[FileState, ...]  # typing.Tuple: evaluated at import, and 3.8 has no tuple[...]


def file_state(dir_fd: int, name: str, algorithm: str | None = None) -> FileState:
    """Checksum file *name* below *dir_fd* (never through a symlink)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return FileState(error="missing")
    except OSError as exc:
        return FileState(error=exc.strerror or str(exc))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return FileState(error="not a regular file")
        h = checksum.new(algorithm)
        size = 0
        for chunk in iter(lambda: os.read(fd, CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
        return FileState(size=size, digest=h.hexdigest())
    except OSError as exc:
        return FileState(error=exc.strerror or str(exc))
    finally:
        os.close(fd)


class DirectoryObserver:
    """Observe ``stdout`` and ``stderr`` in the open directory *dir_fd*, opening each file afresh every
    time: the directory is the one the caller holds open (its path may lead elsewhere by now)."""

    def __init__(self, dir_fd: int, algorithm: str | None = None):
        self.dir_fd = dir_fd
        self.algorithm = algorithm or checksum.default_algorithm()

    def __call__(self) -> Observation:
        return tuple(file_state(self.dir_fd, name, self.algorithm) for name in FILES)


@dataclass(frozen=True)
class SettleResult:
    settled: bool
    reason: str | None  # None when settled; else "empty", "unavailable" or "unstable"
    observations: int
    last: Observation
    seconds: float
    checksum: str = checksum.XXH3

    def to_dict(self) -> dict[str, object]:
        return {
            "checksum": self.checksum,
            "settled": self.settled,
            "reason": self.reason,
            "observations": self.observations,
            "seconds": round(self.seconds, 3),
            "files": {name: asdict(state) for name, state in zip(FILES, self.last)},
        }


def has_output(observation: Observation) -> bool:
    return all(s.readable for s in observation) and sum(s.size or 0 for s in observation) > 0


def is_settled(history: Sequence[Observation], required: int = REQUIRED_IDENTICAL) -> bool:
    """The last *required* observations are identical, readable and hold some output."""
    if len(history) < required:
        return False
    last = history[-required:]
    return all(o == last[0] for o in last) and has_output(last[0])


def classify(observation: Observation) -> str:
    """Why an unsettled transcript is incomplete, judged on its last observation."""
    if any(not s.readable for s in observation):
        return "unavailable"
    if sum(s.size or 0 for s in observation) == 0:
        return "empty"
    return "unstable"


def settle(
    observe: Callable[[], Observation],
    *,
    interval: float = INTERVAL,
    max_observations: int = MAX_OBSERVATIONS,
    required: int = REQUIRED_IDENTICAL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_observation: Optional[Callable[[int, Sequence[Observation]], None]] = None,
) -> SettleResult:
    """Observe until settled or *max_observations* were made (it and *required* are at least 1: the
    settle's own defaults, or one look for a fixed-host build).

    Observation *k* (from 0) starts at ``start + k * interval``; when an
    observation itself takes longer than the interval the next one starts
    at once.  Stable output therefore settles after exactly *required*
    observations, ``(required - 1) * interval`` seconds after the first.
    *on_observation* (progress on a terminal) is called with the count and
    the history after each observation.
    """
    name = getattr(observe, "algorithm", None) or checksum.default_algorithm()  # reported with the result
    start = clock()
    history: list[Observation] = []
    for k in range(max_observations):
        if k:
            delay = start + k * interval - clock()
            if delay > 0:
                sleep(delay)
        history.append(tuple(observe()))
        if on_observation is not None:
            on_observation(len(history), history)
        if is_settled(history, required):
            return SettleResult(True, None, len(history), history[-1], clock() - start, name)
    return SettleResult(False, classify(history[-1]), len(history), history[-1], clock() - start, name)
