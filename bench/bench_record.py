"""The host's record (CONTRACT section 12) with ``[signing]`` on, over the real loopback sshd, each figure
against ``ssh cluster true`` measured in the same run, from a NON-editable install (bench/common.py):

* ``update`` already-current, the record read in the run's one agent call (nothing appended: the
  newest entry already records the identity); target ratio <= 2.0;
* a fresh deployment with a provider that does nothing, its entry signed on the driver
  (``ssh-keygen -Y sign``) and appended on the session it already has; target ratio <= 12;
* a driver joining a host whose record holds N signed entries (``history HOST PROGRAM``: one agent
  call, each signature checked once with ``ssh-keygen -Y verify``), per entry (target <= 10 ms) and in
  all (target <= 12 s for 1,000), then the same history again, importing nothing (nothing verified).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from bench_runtime import (LAUNCHER, NOOP_DEPLOY, NOOP_VERIFY, SYSTEM_PATH, command_profile,  # noqa: E402
                           site_example_profile, ssh_round_trips)
from common import exit_if_missed, installed_venv, interleaved_medians, print_rows, row, run_quiet  # noqa: E402

CURRENT_TARGET, FRESH_TARGET, PER_ENTRY_MS, JOIN_SECONDS = 2.0, 12.0, 10.0, 12.0


def signing_table(tmp: Path) -> str:
    key = tmp / "site_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "site", "-f", str(key)], check=True)
    (tmp / "allowed_signers").write_text(f"admins@site {key.with_suffix('.pub').read_text()}")
    return f'[signing]\nkey = "{key}"\nallowed_signers = "{tmp / "allowed_signers"}"\n'


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--entries", type=int, default=1000, help="entries of the joined record (default 1000)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, 200 entries")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args, _unknown = parser.parse_known_args(argv)
    repeat, count = (5, 200) if args.quick else (args.repeat, args.entries)
    from realhosts import SshdServer
    from support import GitRepo

    venv = installed_venv()
    vq = str(venv / "bin" / "vq")
    with tempfile.TemporaryDirectory(prefix="vq-bench-record-") as tmp:
        tmp_path = Path(tmp)
        signing = signing_table(tmp_path)
        with SshdServer(tmp_path / "sshd", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}"}, read_bashrc=True) as sshd:
            ssh_true = ["ssh", "-F", str(sshd.ssh_config), "cluster", "true"]
            (tmp_path / "scratch").mkdir()
            head = f'ssh_config = "{sshd.ssh_config}"\n{signing}'
            repo = GitRepo(tmp_path / "src")
            sha = repo.commit("bench")
            config = tmp_path / "admin.toml"
            config.write_text(head + site_example_profile("cluster", tmp_path / "apps", repo.path,
                                                          tmp_path / "scratch", venv))
            config.chmod(0o600)
            env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
            update = [vq, "admin", "update", "vibeqc", "cluster", "--expected-sha", sha]
            run_quiet(update + ["--cluster-install"], env=env)
            trips, _ = ssh_round_trips(update, env, tmp_path / "calls.jsonl")
            run_quiet(ssh_true)
            medians = interleaved_medians({"current": lambda: run_quiet(update, env=env),
                                           "ssh": lambda: run_quiet(ssh_true)}, repeat)
            rows = [row("update already-current, [signing] (median)", medians["current"], "s", medians["ssh"],
                        f"ssh cluster true; {trips} ssh round trip(s)", f"<= {CURRENT_TARGET}")]

            apps = tmp_path / "noop-apps"
            shas = [repo.commit("noop A"), repo.commit("noop B")]
            for s in shas:
                launcher = apps / "releases" / s / "source" / ".venv" / "bin" / "python"
                launcher.parent.mkdir(parents=True)
                launcher.write_bytes(LAUNCHER)
                launcher.chmod(0o755)
            verify = tmp_path / "noop-verify"
            verify.write_text(NOOP_VERIFY.replace("@ROOT@", str(apps)).replace(
                "@SUM@", hashlib.sha256(LAUNCHER).hexdigest()))
            verify.chmod(0o755)
            (tmp_path / "noop-deploy").write_text(NOOP_DEPLOY.replace("@ROOT@", str(apps)))
            (tmp_path / "noop-deploy").chmod(0o755)
            noop = tmp_path / "noop.toml"
            noop.write_text(head + command_profile("cluster", apps, repo.path, tmp_path / "scratch", venv, verify))
            noop.chmod(0o600)
            noop_env = dict(env, VQ_ADMIN_CONFIG=str(noop))
            fresh = [[vq, "admin", "update", "noop", "cluster", "--expected-sha", s] for s in shas]
            run_quiet(fresh[0], env=noop_env)
            trips, calls = ssh_round_trips(fresh[1], noop_env, tmp_path / "calls.jsonl")
            turn = {"i": 0}

            def deploy_next() -> None:
                turn["i"] += 1
                run_quiet(fresh[turn["i"] % 2], env=noop_env)

            medians = interleaved_medians({"fresh": deploy_next, "ssh": lambda: run_quiet(ssh_true)}, repeat)
            rows.append(row("fresh deployment, [signing], do-nothing provider", medians["fresh"], "s",
                            medians["ssh"], f"ssh cluster true; {trips} ssh round trips, {calls} commands",
                            f"<= {FRESH_TARGET}"))

            # a record of COUNT signed entries, then a driver that has read none of it joins
            record = sshd.agent_state("cluster") / "vq-admin-agent" / "record" / "noop"
            entries = sorted(p for p in record.iterdir() if p.name.endswith(".json"))
            statement, sig = entries[-1].read_bytes(), entries[-1].with_name(entries[-1].name + ".sig").read_bytes()
            os.environ["XDG_STATE_HOME"] = str(sshd.agent_state("cluster"))
            from vq_admin.agent import record as host_record

            while len(list(record.glob("*.json"))) < count:
                host_record.append("noop", statement, sig)
            history = [vq, "admin", "history", "cluster", "noop", "--json"]
            join_env = dict(noop_env, VQ_ADMIN_STATE_DIR=str(tmp_path / "joining"))
            started = time.perf_counter()
            run_quiet(history, env=join_env)
            joined = time.perf_counter() - started
            started = time.perf_counter()
            run_quiet(history, env=join_env)
            again = time.perf_counter() - started
            ssh_once = medians["ssh"]
            rows.append(row(f"join a record of {count} signed entries, per entry", joined / count * 1000, "ms",
                            ssh_once * 1000, "ssh cluster true", f"<= {PER_ENTRY_MS} ms"))
            rows.append(row(f"join a record of {count} signed entries, in all", joined, "s", again,
                            "the same history again (nothing new: nothing verified)",
                            f"<= {JOIN_SECONDS} s for 1,000"))
    print_rows(rows)
    return rows


if __name__ == "__main__":
    result = main()
    exit_if_missed([r["name"] for r, bound in zip(result[:2], (CURRENT_TARGET, FRESH_TARGET), strict=True)
                    if r["ratio"] > bound])
