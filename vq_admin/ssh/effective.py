"""Judge what ssh will load for one destination before any ssh connects to it.

:func:`check` reads the configuration files (:func:`vq_admin.core.sshconfig.text_problem`: the
``-F`` file, or without one ``~/.ssh/config`` and ``/etc/ssh/ssh_config``), then runs
``ssh -G`` with the same ``-F`` for the destination and each jump host and judges every option of
:data:`vq_admin.core.sshconfig.SSH_LOADS`.  A failure is refused (77) naming the option and the
path.  Once per (configuration, destination) and process: one ``ssh -G`` (a few ms, no network).
The cron no-op starts that judgement in a thread (:func:`start`) as soon as its configuration is
read, so its ``ssh -G`` runs while the driver imports the rest; :func:`problem` waits for it and
its answer is the same (docs/performance.md).
"""

from __future__ import annotations

import os
import threading

from . import process
from ..core.sshconfig import effective_problem, text_problem

_judged: set[tuple[str | None, str]] = set()
#: Judgements :func:`start` began: the thread and, once it returned, its answer.
_started: dict[tuple[str | None, str], tuple[threading.Thread, list[str | None]]] = {}


def start(ssh_config: str | None, destination: str) -> None:
    """Begin :func:`problem` for *destination* in a thread; the next :func:`problem` call for it waits
    for that answer (and judges again itself if the thread failed, so its exception is that call's)."""
    answer: list[str | None] = []

    def judge() -> None:
        try:
            answer.append(_judge(ssh_config, destination))
        except Exception:  # noqa: BLE001 -- problem() judges again, and raises it there
            pass

    thread = threading.Thread(target=judge, daemon=True)
    _started[(ssh_config, destination)] = (thread, answer)
    thread.start()


def problem(ssh_config: str | None, destination: str) -> str | None:
    """One line naming what ssh would load for *destination* that another user can change, or ``None``."""
    started = _started.pop((ssh_config, destination), None)
    if started is not None:
        started[0].join()
        if started[1]:
            return started[1][0]
    return _judge(ssh_config, destination)


def _judge(ssh_config: str | None, destination: str) -> str | None:
    if (ssh_config, destination) in _judged:
        return None
    files = [p for p in ([ssh_config] if ssh_config else [os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config"])
             if os.path.exists(p)]  # a missing -F file: ssh itself refuses to start
    for path in files:
        found = text_problem(path)
        if found:
            return found
    todo, seen = [destination], set[str]()
    while todo and len(seen) < 16:
        host = todo.pop()
        if host in seen or host.startswith("-"):
            continue
        seen.add(host)
        done = process.run(["ssh", "-G", *(["-F", ssh_config] if ssh_config else []), "--", host], timeout=30)
        if done.ended in (process.NOT_STARTED, process.TIMED_OUT):
            detail = done.stderr.decode("utf-8", "replace").strip() or "timed out"
            return f"cannot read ssh's configuration for {host} (ssh -G): {detail}"
        if done.returncode != 0:  # a configuration ssh cannot read: ssh itself fails and says why
            return None
        found, jumps = effective_problem(done.stdout.decode("utf-8", "replace"), host)
        if found:
            return found if host == destination else f"{found} (ProxyJump {host}, a jump host of {destination})"
        todo += jumps
    _judged.add((ssh_config, destination))
    return None


def check(ssh_config: str | None, destination: str) -> None:
    """Refuse (77) a destination for which ssh would load something another user can change."""
    found = problem(ssh_config, destination)
    if found:
        from ..report.outcome import Refused

        raise Refused(f"{found}; refusing to run ssh for {destination} (nothing was run there)")
