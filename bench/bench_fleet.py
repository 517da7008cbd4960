"""A fleet rollout vs one host, every host already current, over the real loopback sshd.

Eight host aliases of one sshd, each with its own runtime root and scratch:
the wall time of ``update PROGRAM --all --parallel 8`` against one host's
``update PROGRAM HOST`` (both already-current).  The rollout is parallel, not
a loop: the target is a ratio of at most 2.

On this bench every host's host-side work (its sshd connection, the one
``vq-admin-agent session`` that checks the login shell, takes the lease and
runs the verify with the launcher read-back) runs on the driver's own cores;
on a real fleet each login host does its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import median_seconds, print_rows, row, run_quiet  # noqa: E402

HOSTS = 8


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 3 if args.quick else args.repeat
    from fleet_world import Fleet
    from realhosts import SshdServer, remote_path

    with tempfile.TemporaryDirectory(prefix="vq-bench-fleet-") as tmp:
        tmp_path = Path(tmp)
        aliases = tuple(f"login-{i}" for i in range(1, HOSTS + 1))
        with SshdServer(tmp_path / "sshd", env={"PATH": remote_path()}, aliases=aliases) as sshd:
            fleet = Fleet(tmp_path / "fleet", str(sshd.ssh_config),
                          {f"host{i}": {"ssh": alias} for i, alias in enumerate(aliases, 1)})
            env = fleet.env(tmp_path / "state")
            cli = [sys.executable, "-m", "vq_admin.cli", "update", fleet.program]
            rollout = cli + ["--all", "--expected-sha", fleet.a, "--parallel", str(HOSTS)]
            one = cli + ["host1", "--expected-sha", fleet.a]
            run_quiet(rollout, env=env)  # installs every host (in parallel)
            done = subprocess.run(rollout + ["--json"], env=env, capture_output=True, text=True)
            assert done.returncode == 0 and '"outcome": "already-current"' in done.stdout, done.stdout[-800:]
            single = median_seconds(lambda: run_quiet(one, env=env), repeat)
            parallel = median_seconds(lambda: run_quiet(rollout, env=env), repeat)
    rows = [row(f"fleet --all --parallel {HOSTS}, already-current (median)", parallel, "s", single,
                "one host, already-current", "<= 2")]
    print_rows(rows)
    return rows


if __name__ == "__main__":
    main()
