"""A fleet rollout vs one host, every host already current, over the real loopback sshd.

Eight host aliases of one sshd, each with its own runtime root and scratch,
from a NON-editable install in a temporary venv (bench/common.py): the wall
time of ``vq admin update PROGRAM --all --parallel 8`` against one host's
``vq admin update PROGRAM HOST`` (both already-current), measured in
interleaved rounds so load changes hit both alike.  The issue's row is that
ratio, target at most 2 ("the rollout is parallel, not a loop").

What the row means here.  On a real fleet each login host does its own
host-side work (its sshd connection and login shell, the one
``vq-admin-agent session`` that checks the shell, takes the lease and runs the
verify with the launcher read-back).  On this bench all eight "hosts" are
aliases of one sshd on the driver's own machine, so every host's sshd, login
shell and agent run on the same cores as the driver: a fleet of 8 needs at
least ``8 x (CPU of one host's run) / cores`` seconds of wall time however
parallel the rollout is.  On a 2-core machine that CPU floor alone is near 3x
one host's wall time, so the 2x target cannot be met by any rollout; the
bench therefore measures, in the same run, what shows whether the rollout is
parallel:

* the CPU seconds of every process of a run (driver, its workers, the ssh
  clients, sshd, the login shells and agents on the "host" side), from a
  cpuacct/cgroup v2 group the bench puts itself and its sshd in (where it can
  create one; otherwise the bench's waited-for children plus the sshd
  daemon's own and waited-for children's times from ``/proc``);
* the CPU floor, fleet CPU / cores: no rollout can finish faster here; and,
  since other processes may share the machine, the cores they kept busy
  during the fleet runs (``/proc/stat`` busy time outside this bench's
  group) and the floor on the cores they left;
* the ratios fleet/single (the issue's row, target <= 2), fleet/floor (how
  close the rollout comes to this machine's limit: 1.0 is perfect use of
  every core), fleet/loop (a loop of 8 single runs), and the fleet's CPU per
  host against one single run's CPU (what the fleet itself adds per host).

A rollout that ran its hosts one after another would show fleet/loop near
1 and its wall time far above the floor; a parallel one shows fleet/loop
well below 1 and its wall time near the floor on the cores it was left.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import installed_venv, interleaved_medians, print_rows, row, run_quiet  # noqa: E402

HOSTS = 8
TARGET = 2.0
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class CpuMeter:
    """CPU seconds used so far by this process and everything it starts (sshd included).

    Best: a cgroup of its own (cgroup v1 ``cpuacct`` or cgroup v2), which every
    descendant inherits, sshd's sessions too.  Otherwise: this process's
    waited-for children (``getrusage``) plus the sshd daemon's own and its
    waited-for children's times (``/proc/PID/stat``), which also covers every
    finished ssh session on the host side.
    """

    def __init__(self) -> None:
        self.group: Path | None = None
        self.parent: Path | None = None
        self.kind = "getrusage(children) + sshd /proc times"
        self.sshd_pid: int | None = None
        for parent, usage, kind in ((Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage", "cgroup v1 cpuacct"),
                                    (Path("/sys/fs/cgroup"), "cpu.stat", "cgroup v2")):
            if not (parent / usage).exists() and not (parent / "cgroup.controllers").exists():
                continue
            group = parent / f"vq-bench-fleet-{os.getpid()}"
            try:
                group.mkdir()
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                try:
                    group.rmdir()
                except OSError:
                    pass
                continue
            self.group, self.parent, self.kind, self._usage = group, parent, kind, usage
            break

    def seconds(self) -> float:
        if self.group is not None:
            text = (self.group / self._usage).read_text()
            if self._usage == "cpuacct.usage":
                return int(text) / 1e9
            fields = dict(line.split() for line in text.splitlines())
            return int(fields["usage_usec"]) / 1e6
        usage = os.getrusage(os.RUSAGE_CHILDREN)
        total = usage.ru_utime + usage.ru_stime
        if self.sshd_pid is not None:
            try:
                stat = Path(f"/proc/{self.sshd_pid}/stat").read_text()
            except OSError:
                return total
            fields = stat.rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
        return total

    def close(self) -> None:
        """Leave the group and remove it (every process started in it has ended by now)."""
        if self.group is None or self.parent is None:
            return
        try:
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError as exc:
            print(f"note: could not remove {self.group}: {exc}", flush=True)


def machine_busy_seconds() -> float:
    """CPU-seconds every process of the machine has used so far (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measured(meter: CpuMeter, fn: Callable[[], object], samples: list[float],
             others: list[float] | None = None) -> Callable[[], None]:
    """*fn* with its CPU-seconds appended to *samples*; with *others*, also the cores the rest of
    the machine kept busy meanwhile (its busy CPU-seconds outside the run / the run's wall time)."""
    def call() -> None:
        before, busy, started = meter.seconds(), machine_busy_seconds(), time.perf_counter()
        fn()
        used = meter.seconds() - before
        samples.append(used)
        if others is not None:
            wall = time.perf_counter() - started
            others.append(max(0.0, machine_busy_seconds() - busy - used) / wall)
    return call


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 3 if args.quick else args.repeat
    from fleet_world import Fleet
    from realhosts import SshdServer
    from support import AGENT, SITE_EXAMPLE

    venv = installed_venv()
    vq = str(venv / "bin" / "vq")
    meter = CpuMeter()
    try:
        with tempfile.TemporaryDirectory(prefix="vq-bench-fleet-") as tmp:
            tmp_path = Path(tmp)
            aliases = tuple(f"login-{i}" for i in range(1, HOSTS + 1))
            # read_bashrc: the figures in docs/performance.md include root's ~/.bashrc on the hosts
            # separate_accounts: each login host its own account, so each holds its own host-side lease
            with SshdServer(tmp_path / "sshd", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}"}, aliases=aliases,
                            read_bashrc=True, separate_accounts=True) as sshd:
                meter.sshd_pid = sshd.pid
                fleet = Fleet(tmp_path / "fleet", str(sshd.ssh_config),
                              {f"host{i}": {"ssh": alias} for i, alias in enumerate(aliases, 1)})
                # the hosts run the installed agent and site example, not the caller's
                text = fleet.config.read_text()
                fleet.config.write_text(text.replace(AGENT, f"{venv}/bin/vq-admin-agent")
                                        .replace(SITE_EXAMPLE, f"{venv}/bin/vq-site-example"))
                env = fleet.env(tmp_path / "state")
                cli = [vq, "admin", "update", fleet.program]
                rollout = cli + ["--all", "--expected-sha", fleet.a, "--parallel", str(HOSTS)]
                one = cli + ["host1", "--expected-sha", fleet.a]
                ssh_true = ["ssh", "-F", str(sshd.ssh_config), "login-1", "true"]
                run_quiet(rollout, env=env)  # installs every host (in parallel)
                done = subprocess.run(rollout + ["--json"], env=env, capture_output=True, text=True)
                assert done.returncode == 0 and '"outcome": "already-current"' in done.stdout, done.stdout[-800:]
                run_quiet(one, env=env)
                cpu: dict[str, list[float]] = {"single": [], "fleet": [], "ssh": []}
                others: list[float] = []  # cores the rest of the machine kept busy during each fleet run
                load_before = os.getloadavg()
                wall = interleaved_medians({
                    "single": measured(meter, lambda: run_quiet(one, env=env), cpu["single"]),
                    "fleet": measured(meter, lambda: run_quiet(rollout, env=env), cpu["fleet"], others),
                    "ssh": measured(meter, lambda: run_quiet(ssh_true), cpu["ssh"]),
                }, repeat)
                load_after = os.getloadavg()
    finally:
        meter.close()
    n = cores()
    fleet_cpu, single_cpu, ssh_cpu = median(cpu["fleet"]), median(cpu["single"]), median(cpu["ssh"])
    floor = fleet_cpu / n
    busy_elsewhere = median(others)
    left = max(n - busy_elsewhere, 0.25)  # the cores the rest of the machine left to the fleet run
    loop = HOSTS * wall["single"]
    print(f"CPU measured by {meter.kind}; {n} core(s); load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after; {repeat} interleaved rounds, medians", flush=True)
    print(f"fleet: wall {wall['fleet']:.3f} s, CPU {fleet_cpu:.3f} s ({fleet_cpu / HOSTS:.3f} s per host), "
          f"CPU floor {floor:.3f} s; single: wall {wall['single']:.3f} s, CPU {single_cpu:.3f} s; "
          f"loop of {HOSTS} singles {loop:.3f} s; ssh true: wall {wall['ssh']:.3f} s, CPU {ssh_cpu:.3f} s",
          flush=True)
    print(f"other processes kept {busy_elsewhere:.2f} of {n} cores busy during the fleet runs (/proc/stat); "
          f"the floor on the {left:.2f} cores left: {fleet_cpu / left:.3f} s", flush=True)
    rows = [
        row(f"fleet --all --parallel {HOSTS}, already-current (median)", wall["fleet"], "s", wall["single"],
            "one host, already-current", f"<= {TARGET:g}"),
        row("fleet wall vs its CPU floor (fleet CPU / cores)", wall["fleet"], "s", floor,
            f"{fleet_cpu:.3f} CPU-s / {n} cores"),
        row("fleet wall vs its CPU floor on the cores others left", wall["fleet"], "s", fleet_cpu / left,
            f"{fleet_cpu:.3f} CPU-s / {left:.2f} cores"),
        row(f"fleet wall vs a loop of {HOSTS} single runs", wall["fleet"], "s", loop, f"{HOSTS} x one host"),
        row("fleet CPU per host vs one single run's CPU", fleet_cpu / HOSTS, "CPU-s", single_cpu,
            "one host's run, CPU"),
        row("one host's run CPU vs ssh true CPU", single_cpu, "CPU-s", ssh_cpu, "ssh login-1 true, CPU"),
    ]
    print_rows(rows)
    return rows


if __name__ == "__main__":
    main()
