"""A real single-node Slurm 22.05 cluster (plus a private munged), run as root.

Usage::

    cluster = SlurmCluster().start()          # base dir: fresh /tmp/vqslurm-XXXX
    subprocess.run(["sbatch", "--wait", "--wrap", "exit 3"], env={**os.environ, **cluster.env})
    cluster.stop_controller(); cluster.start_controller()
    cluster.stop()                            # kills daemons, removes its own base dir

Layout under the base dir: ``munge/`` (0700: key, seed, pid, log),
``munge-socket/`` (0755), ``etc/slurm.conf``, ``state/``, ``spool/``,
``log/``, ``run/`` and ``jobcomp.log``.  MUNGE insists that the socket's
directory and every parent be 0755 (``/tmp`` with its sticky bit is
accepted), which is why the default base dir is not under pytest's 0700
tmp tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from .procs import free_port, log_tail, stop_popen, wait_until

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"

#: Seconds a finished job stays in slurmctld's memory.  ``sbatch --wait``
#: polls 2 s after submission: the record must outlive that poll or sbatch
#: cannot report the exit code, so 4 (0 is clamped to 2, too tight).  Yet
#: records vanish from ``scontrol show job`` within seconds (default: 300),
#: so tests can exercise "record gone, read the jobcomp log" reconciliation.
MIN_JOB_AGE = 4


def _command_output(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout.strip()


class SlurmCluster:
    """slurmctld + slurmd + munged on 127.0.0.1 with private ports and files.

    Args:
        base_dir: where to put everything; default a new ``/tmp/vqslurm-XXXX``
            (mode 0755), removed again by :meth:`stop`.
        start_timeout: seconds to wait for the node to read ``idle``.

    Attributes: ``conf`` (the SLURM_CONF path), ``env`` (``{"SLURM_CONF": ...}``
    to merge into a process environment), ``jobcomp_log``, ``node_name``,
    ``ctld_port``, ``slurmd_port``, ``munge_socket``, ``base_dir``, and the
    daemon PIDs ``munged_pid``, ``slurmctld_pid``, ``slurmd_pid``.
    """

    def __init__(self, base_dir: str | Path | None = None, start_timeout: float = 30.0) -> None:
        self._owns_base_dir = base_dir is None
        if base_dir is None:
            base_dir = tempfile.mkdtemp(prefix="vqslurm-", dir="/tmp")
        self.base_dir = Path(base_dir)
        self.start_timeout = start_timeout
        self.node_name = _command_output(["hostname", "-s"])
        self.cpus = int(_command_output(["nproc"]))
        self.munge_dir = self.base_dir / "munge"
        self.munge_socket = self.base_dir / "munge-socket" / "munge.socket"
        self.conf = self.base_dir / "etc" / "slurm.conf"
        self.state_dir = self.base_dir / "state"
        self.spool_dir = self.base_dir / "spool"
        self.log_dir = self.base_dir / "log"
        self.run_dir = self.base_dir / "run"
        self.jobcomp_log = self.base_dir / "jobcomp.log"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.ctld_port: int | None = None
        self.slurmd_port: int | None = None
        self._munged: subprocess.Popen | None = None
        self._slurmctld: subprocess.Popen | None = None
        self._slurmd: subprocess.Popen | None = None

    # -- PIDs ------------------------------------------------------------------

    munged_pid = property(lambda self: self._munged.pid if self._munged else None)
    slurmctld_pid = property(lambda self: self._slurmctld.pid if self._slurmctld else None)
    slurmd_pid = property(lambda self: self._slurmd.pid if self._slurmd else None)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> "SlurmCluster":
        """Start munged, slurmctld and slurmd; return once the node is idle."""
        try:
            self._make_dirs()
            self._start_munged()
            self.ctld_port, self.slurmd_port = free_port(), free_port()
            self._write_conf()
            self._slurmd = self._spawn([SLURMD, "-D"], "slurmd.stderr")
            self._slurmctld = self._spawn([SLURMCTLD, "-D", "-i"], "slurmctld.stderr")
            self._wait_node(lambda state: state == "idle", "idle")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel leftover jobs, kill slurmd, slurmctld and munged, wait for them."""
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            self._cancel_all_jobs()
        for proc in (self._slurmd, self._slurmctld, self._munged):
            stop_popen(proc)
        self._slurmd = self._slurmctld = self._munged = None
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def stop_controller(self) -> None:
        """Kill slurmctld (clients then fail or retry) and wait until it is gone."""
        stop_popen(self._slurmctld)
        self._slurmctld = None

    def start_controller(self) -> None:
        """Restart slurmctld on the same port, keeping its saved job state.

        Returns once slurmd has re-registered (node state known and
        responding, e.g. ``idle`` or ``alloc``): about 4 s here.
        """
        if self._slurmctld is not None and self._slurmctld.poll() is None:
            return
        self._slurmctld = self._spawn([SLURMCTLD, "-D", "-i"], "slurmctld.stderr")
        self._wait_node(lambda state: state[:3] not in ("", "unk") and state[-1] not in "*~#",
                        "registered")

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- client helpers --------------------------------------------------------

    def run(self, *argv: str, timeout: float = 60.0, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm client command (``sinfo``, ``sbatch``...) against this cluster."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, capture_output=True,
                              text=True, timeout=timeout, check=check, stdin=subprocess.DEVNULL)

    def node_state(self) -> str | None:
        """``sinfo -h -o %t`` for the node, or None if slurmctld does not answer."""
        try:
            done = self.run("sinfo", "-h", "-o", "%t", timeout=10)
        except subprocess.TimeoutExpired:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    # -- internals -------------------------------------------------------------

    def _make_dirs(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o755)
        for path, mode in [
            (self.munge_dir, 0o700), (self.munge_socket.parent, 0o755),
            (self.conf.parent, 0o755), (self.state_dir, 0o700), (self.spool_dir, 0o755),
            (self.log_dir, 0o700), (self.run_dir, 0o755),
        ]:
            path.mkdir(exist_ok=True)
            path.chmod(mode)

    def _spawn(self, argv: list[str], stderr_name: str) -> subprocess.Popen:
        with open(self.log_dir / stderr_name, "ab") as log:
            return subprocess.Popen(argv, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log)

    def _start_munged(self) -> None:
        key = self.munge_dir / "munge.key"
        if not key.exists():
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True,
                           capture_output=True, timeout=30)
        self._munged = self._spawn([
            MUNGED, "-F", f"--socket={self.munge_socket}", f"--key-file={key}",
            f"--log-file={self.munge_dir / 'munged.log'}",
            f"--pid-file={self.munge_dir / 'munged.pid'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
        ], "munged.stderr")

        def munge_works() -> bool:
            if self._munged.poll() is not None:
                raise RuntimeError("munged exited:\n" + log_tail(self.log_dir / "munged.stderr"))
            done = subprocess.run(["munge", "-n", f"--socket={self.munge_socket}"],
                                  capture_output=True, timeout=10)
            return done.returncode == 0

        if not wait_until(munge_works, 10.0):
            raise RuntimeError("munged did not answer:\n" + log_tail(self.log_dir / "munged.stderr"))

    def _write_conf(self) -> None:
        node = self.node_name
        lines = [
            "ClusterName=vqtest",
            f"SlurmctldHost={node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SchedulerParameters=batch_sched_delay=0",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_log}",
            f"MinJobAge={MIN_JOB_AGE}",
            f"StateSaveLocation={self.state_dir}",
            f"SlurmdSpoolDir={self.spool_dir}",
            f"SlurmctldPidFile={self.run_dir / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.run_dir / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_node(self, ready: Callable[[str], bool], what: str) -> None:
        """Poll ``sinfo`` until ``ready(state)``; raise with the logs on timeout or death."""
        def check() -> bool:
            for name, proc in (("slurmctld", self._slurmctld), ("slurmd", self._slurmd)):
                if proc is None or proc.poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{self._logs()}")
            state = self.node_state()
            return state is not None and ready(state)

        if not wait_until(check, self.start_timeout, interval=0.1):
            raise RuntimeError(f"node not {what} after {self.start_timeout}s "
                               f"(state {self.node_state()!r}):\n{self._logs()}")

    def _cancel_all_jobs(self) -> None:
        """Best effort: no slurmstepd should outlive the cluster."""
        try:
            self.run("scancel", "--user=root", timeout=10)
            wait_until(lambda: not self.run("squeue", "-h", "-t", "PD,R,CG", timeout=10).stdout.strip(),
                       10.0, interval=0.2)
        except subprocess.TimeoutExpired:
            pass

    def _logs(self) -> str:
        return "\n".join(f"--- {name}\n{log_tail(self.log_dir / name, 20)}"
                         for name in ("slurmctld.log", "slurmctld.stderr", "slurmd.log", "slurmd.stderr"))
