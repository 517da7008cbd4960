"""The confirmation job (CONTRACT section 13) on a real Slurm through the real loopback sshd, from a
NON-editable install in a temporary venv (bench/common.py):

* what a do-nothing confirmation (``/bin/true`` as ``confirm_command``) adds to a deployment: the
  ``confirm`` step of real updates (median), against a bare ``sbatch --wait`` of the same job
  through ssh (median); target: at most the bare job plus 3 s;
* the cron no-op (an already-current update) with ``confirm_command`` configured, against the same
  profile without it: no job is submitted, so the ratio stays about 1.

``python3 bench/bench_confirm.py [--quick]`` (``--quick``: fewer repetitions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
SPARE = 3.0


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args, _unknown = parser.parse_known_args(argv)
    repeat = 3 if args.quick else 5
    from realhosts import SlurmCluster, SshdServer
    from support import GitRepo

    venv = installed_venv()
    site = venv / "bin" / "vq-site-example"
    with tempfile.TemporaryDirectory(prefix="vq-bench-confirm-") as tmp, SlurmCluster() as slurm:
        tmp_path = Path(tmp)
        with SshdServer(tmp_path / "sshd", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}", **slurm.env}) as sshd:
            repo = GitRepo(tmp_path / "src")
            shas = [repo.commit("A"), repo.commit("B")]
            root, state, config = tmp_path / "apps", tmp_path / "state", tmp_path / "admin.toml"
            (tmp_path / "scratch").mkdir()

            def configure(confirm: bool) -> None:
                lines = ('confirm_command = "/bin/true"\nconfirm_timeout_seconds = 120\n' if confirm else "")
                config.write_text(
                    f'ssh_config = "{sshd.ssh_config}"\n[hosts.cluster]\nfleet_role = "managed"\nssh = "cluster"\n'
                    f'scratch_root = "{tmp_path}/scratch"\nagent = "{venv}/bin/vq-admin-agent"\n'
                    '[hosts.cluster.scheduler_runtime_deployments.vibeqc]\n'
                    + "".join(f'{verb}_command = "{site} {verb if verb != "update" else "deploy"} --root {root}"\n'
                              for verb in ("update", "install", "verify", "activate"))
                    + f'source_repo = "{repo.path}"\n{lines}')

            env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state))

            def update(sha: str, *extra: str) -> tuple[float, dict]:
                started = time.perf_counter()
                done = subprocess.run([f"{venv}/bin/vq-admin", "update", "vibeqc", "cluster", "--expected-sha", sha,
                                       "--json", *extra], env=env, capture_output=True, text=True)
                seconds = time.perf_counter() - started
                assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
                return seconds, json.loads(done.stdout)

            configure(True)
            update(shas[0], "--cluster-install")
            steps = []
            for i in range(repeat):  # each update switches generation, so each runs its confirmation
                _, receipt = update(shas[(i + 1) % 2])
                assert receipt["confirm"]["state"] == "COMPLETED", receipt["confirm"]
                steps.append(next(s["seconds"] for s in receipt["steps"] if s["name"] == "confirm"))
            bare = []
            for _ in range(repeat):
                started = time.perf_counter()
                subprocess.run(["ssh", "-F", str(sshd.ssh_config), "cluster",
                                "sbatch --wait --parsable --output=/dev/null --wrap=/bin/true"], check=True,
                               stdout=subprocess.DEVNULL)
                bare.append(time.perf_counter() - started)
            active = shas[repeat % 2]
            noop_confirm = statistics.median(update(active)[0] for _ in range(repeat))
            configure(False)
            noop_plain = statistics.median(update(active)[0] for _ in range(repeat))
    step, job = statistics.median(steps), statistics.median(bare)
    rows = [row("confirm step of an update (do-nothing job)", step, "s", job, "bare sbatch --wait over ssh",
                f"<= baseline + {SPARE:g} s"),
            row("cron no-op (already-current) with confirm_command", noop_confirm, "s", noop_plain,
                "the same without it", "about 1 (no job)")]
    print_rows(rows)
    exit_if_missed([r["name"] for r in rows[:1] if r["figure"] > r["baseline"] + SPARE])
    return rows


if __name__ == "__main__":
    main()
