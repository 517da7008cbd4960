"""An ``already-current`` runtime update vs one ``ssh host true``, over the real loopback sshd.

The already-current path is what cron runs most: one read-only verify and one
launcher read-back on the login host over one shared ssh connection.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import median_seconds, print_rows, row, run_quiet  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 3 if args.quick else args.repeat
    from realhosts import SshdServer, remote_path
    from support import GitRepo, site_example_host, write_config

    with tempfile.TemporaryDirectory(prefix="vq-bench-") as tmp:
        tmp_path = Path(tmp)
        with SshdServer(tmp_path / "sshd", env={"PATH": remote_path()}) as sshd:
            repo = GitRepo(tmp_path / "src")
            sha = repo.commit("bench")
            (tmp_path / "scratch").mkdir()
            config = write_config(tmp_path / "admin.toml", f'ssh_config = "{sshd.ssh_config}"\n' + site_example_host(
                "cluster", root=tmp_path / "apps", repo=repo.path, scratch=tmp_path / "scratch", transport="ssh",
                ssh="cluster"))
            env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
            update = [sys.executable, "-m", "vq_admin.cli", "update", "vibeqc", "cluster", "--expected-sha", sha]
            run_quiet(update + ["--cluster-install"], env=env)
            current = median_seconds(lambda: run_quiet(update, env=env), repeat)
            done = subprocess.run(update + ["--json"], env=env, capture_output=True, text=True)
            assert '"already-current"' in done.stdout, done.stdout[-500:]
            ssh_true = median_seconds(lambda: run_quiet(["ssh", "-F", sshd.ssh_config, "cluster", "true"]), repeat)
    rows = [row("runtime update, already-current (median)", current, "s", ssh_true, "ssh cluster true")]
    print_rows(rows)
    return rows


if __name__ == "__main__":
    main()
