"""The scheduler census (``vq admin references``) at the scale of a queue, on a real Slurm through the
real loopback sshd, from a NON-editable install in a temporary venv (bench/common.py):

* the empty-queue census (median, measured before the jobs are submitted and after they are gone),
  the baseline of the rest;
* with 1,000 held jobs queued (half naming the generation's launcher in their script): a cold
  census (the agent's cache removed before each), per queued job above the empty queue, target
  at most 20 ms; a warm census (nothing new), above the empty queue, target at most 2 s;
* the RPCs slurmctld answered during one cold and one warm census (``sdiag``'s counts by message
  type, less its own), target at most the jobs not seen before plus 2.

``python3 bench/bench_census.py [--quick]`` (``--quick``: fewer repetitions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import exit_if_missed, installed_venv, print_rows, row  # noqa: E402

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOBS = 1000
PER_JOB_TARGET, WARM_TARGET, SPARE_RPCS = 0.020, 2.0, 2
SHA = "a" * 40


def rpcs(slurm) -> dict[str, int]:
    """slurmctld's RPC counts by message type since its last reset, less ``sdiag``'s own."""
    text = slurm.run("sdiag", check=True).stdout
    block = text.split("Remote Procedure Call statistics by message type", 1)[1].split("\n\n", 1)[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)", block, re.M)}
    counts.pop("REQUEST_STATS_INFO", None)
    return counts


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 3 if args.quick else 5
    from realhosts import SlurmCluster, SshdServer

    venv = installed_venv()
    with tempfile.TemporaryDirectory(prefix="vq-bench-census-") as tmp, SlurmCluster() as slurm:
        tmp_path = Path(tmp)
        with SshdServer(tmp_path / "sshd", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}", **slurm.env}) as sshd:
            launcher = f"{tmp_path}/apps/releases/{SHA}/source/.venv/bin/python"
            state = tmp_path / "state"
            subprocess.run([str(venv / "bin" / "python"), "-c", "import sys\nfrom vq_admin.launcher import registry\n"
                            "from vq_admin.state.records import Verified\n"
                            "registry.record_verified(sys.argv[1], 'cluster', 'vibeqc', Verified(sha=sys.argv[2], "
                            "tag=None, launcher=sys.argv[3], launcher_sha256='e' * 64, receipt='r-1', "
                            "at='2026-11-30T00:00:00Z'))", str(state), SHA, launcher], check=True)
            config = tmp_path / "admin.toml"
            config.write_text(f'ssh_config = "{sshd.ssh_config}"\n[hosts.cluster]\nfleet_role = "managed"\n'
                              f'ssh = "cluster"\nagent = "{venv}/bin/vq-admin-agent"\n'
                              '[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nupdate_command = "/bin/true"\n'
                              f'verify_command = "/bin/true"\nsource_repo = "{tmp_path}"\n')
            env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state))
            cache = sshd.agent_state("cluster") / "vq-admin-agent" / "census"

            def census() -> tuple[float, dict]:
                started = time.perf_counter()
                done = subprocess.run([f"{venv}/bin/vq-admin", "references", "vibeqc", "cluster", "--json"], env=env,
                                      capture_output=True, text=True, check=True)
                return time.perf_counter() - started, json.loads(done.stdout)

            def median(samples: list[float]) -> float:
                return sorted(samples)[len(samples) // 2]

            census()  # the first connection and interpreter caches
            empties = [census()[0] for _ in range(repeat)]
            loop = (f"for i in $(seq 1 {JOBS}); do if [ $((i % 2)) -eq 0 ]; then w='sleep 600; {launcher} run.py'; "
                    "else w='sleep 600'; fi; sbatch --hold --parsable --output=/dev/null --wrap=\"$w\" || exit 1; "
                    "done >/dev/null")
            started = time.perf_counter()
            subprocess.run(["ssh", "-F", str(sshd.ssh_config), "cluster", loop], check=True)
            print(f"{JOBS} held jobs submitted in {time.perf_counter() - started:.1f} s", flush=True)
            cold, warm = [], []
            for i in range(repeat):
                shutil.rmtree(cache, ignore_errors=True)
                if i == 0:
                    slurm.run("sdiag", "-r", check=True)
                seconds, doc = census()
                if i == 0:
                    cold_rpcs, cold_cost = rpcs(slurm), doc["cost"]
                    assert len(doc["generations"][0]["jobs"]) == JOBS // 2, doc["generations"]
                cold.append(seconds)
            for i in range(repeat):
                if i == 0:
                    slurm.run("sdiag", "-r", check=True)
                seconds, doc = census()
                if i == 0:
                    warm_rpcs, warm_cost = rpcs(slurm), doc["cost"]
                warm.append(seconds)
            layout = sorted(f"{p.relative_to(sshd.agent_state('cluster'))} ({p.stat().st_size} bytes)"
                            for p in cache.iterdir())
            # the empty queue again once the jobs are gone (cancelled jobs stay listed for MinJobAge)
            slurm.run("scancel", "--user=root", check=True)
            gone = time.monotonic() + 120
            while slurm.run("squeue", "-h", "-t", "all").stdout.strip() and time.monotonic() < gone:
                time.sleep(0.5)
            empties += [census()[0] for _ in range(repeat)]
    empty = median(empties)
    cold_s, warm_s = median(cold), median(warm)
    per_job = (cold_s - empty) / JOBS
    print(f"empty queue {empty:.3f} s; cold {cold_s:.3f} s (cost {cold_cost}); warm {warm_s:.3f} s "
          f"(cost {warm_cost}); medians of {repeat}", flush=True)
    print(f"slurmctld RPCs: cold {cold_rpcs}; warm {warm_rpcs}", flush=True)
    print(f"cache layout under the agent's XDG_STATE_HOME: {layout}", flush=True)
    cold_calls, warm_calls = sum(cold_rpcs.values()), sum(warm_rpcs.values())
    rows = [
        row(f"census cold, {JOBS} queued, per job above empty", per_job * 1000, "ms", empty * 1000,
            "empty-queue census", f"<= {PER_JOB_TARGET * 1000:g} ms"),
        row(f"census warm, {JOBS} queued, above empty", warm_s - empty, "s", empty, "empty-queue census",
            f"<= {WARM_TARGET:g} s"),
        row("census cold, slurmctld RPCs", cold_calls, "RPCs", cold_cost["scripts_read"], "scripts not seen before",
            f"<= {cold_cost['scripts_read'] + SPARE_RPCS}"),
        row("census warm, slurmctld RPCs", warm_calls, "RPCs", warm_cost["scripts_read"], "scripts not seen before",
            f"<= {warm_cost['scripts_read'] + SPARE_RPCS}"),
    ]
    print_rows(rows)
    exit_if_missed([r["name"] for r, missed in zip(rows, (
        per_job > PER_JOB_TARGET, warm_s - empty > WARM_TARGET,
        cold_calls > cold_cost["scripts_read"] + SPARE_RPCS, warm_calls > warm_cost["scripts_read"] + SPARE_RPCS),
        strict=True) if missed])
    return rows


if __name__ == "__main__":
    main()
