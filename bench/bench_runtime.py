"""The runtime lane over the real loopback sshd, each figure against its
baseline measured in the same run, from a NON-editable install in a
temporary venv (``pip install ./hookspecs ./site_example .``, bench/common.py):

* ``update`` already-current (what cron runs most: one read-only verify and
  the launcher read-back in one agent call, one ssh round trip) vs one
  ``ssh cluster true``, interleaved, medians; target ratio <= 1.5; the host's
  login shell reads the account's startup files (``~/.bashrc``), as a login
  host's does, and the baseline pays the same; the same again on a host whose
  shell reads none (no target: the baseline is then the connection alone);
* a fresh deployment's orchestration overhead: ``update`` of a SHA not yet
  active, with a provider that does nothing (the deploy records the SHA, the
  verify reports it with a launcher made beforehand), alternating between
  two SHAs, vs ``ssh cluster true``; and its ssh round trips, counted from the
  run's call log (no target);
* staging throughput: the ``stage-receive`` step of a fresh deployment of a
  500 MiB source archive (``--quick``: 64 MiB), in MiB/s, vs
  ``ssh cluster 'cat > /dev/null' < archive`` of the same archive, medians of
  3 rounds; target ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import hashlib
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

from common import exit_if_missed, installed_venv, interleaved_medians, print_rows, row, run_quiet  # noqa: E402

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CURRENT_TARGET = 2.0
#: ... on a login shell that reads no startup files, and a fresh deployment with a do-nothing provider.
BARE_TARGET, FRESH_TARGET = 3.0, 12.0
#: Staging throughput against ``ssh cluster 'cat > /dev/null'`` of the same archive (a ratio of MiB/s: higher is
#: better), medians of that many rounds, each a fresh deployment of the big SHA.
STAGE_TARGET, STAGE_ROUNDS = 0.9, 3
LAUNCHER = b"#!/bin/sh\nexec python3 \"$@\"\n"

#: A provider that does nothing: its deploy only records the SHA it was asked for, its verify
#: reports that SHA with a launcher made beforehand.
NOOP_DEPLOY = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in --expected-sha) s=$2; shift 2;; *) shift;; esac
done
printf '%s' "$s" > @ROOT@/active.tmp && mv @ROOT@/active.tmp @ROOT@/active
"""
NOOP_VERIFY = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in --program) p=$2; shift 2;; *) shift;; esac
done
s=$(cat @ROOT@/active)
printf '{"program": "%s", "source_sha": "%s", "tag": null, "healthy": true, "activation": "atomic", \
"quiescent": true, "updater_pid": null, "active_path": "@ROOT@/releases/%s/source/.venv/bin/python", \
"active_path_sha256": "@SUM@", "health_detail": "a provider that does nothing"}\\n' "$p" "$s" "$s"
"""


def command_profile(name: str, root: Path, repo: Path, scratch: Path, venv: Path, verify: Path) -> str:
    return (f'[hosts.{name}]\nfleet_role = "managed"\ntransport = "ssh"\nssh = "cluster"\n'
            f'scratch_root = "{scratch}"\nagent = "{venv}/bin/vq-admin-agent"\n'
            f'[hosts.{name}.scheduler_runtime_deployments.noop]\nupdate_command = "{verify.parent}/noop-deploy"\n'
            f'verify_command = "{verify}"\nsource_repo = "{repo}"\ntimeout_seconds = 600\n'
            f'verify_timeout_seconds = 120\n')


def site_example_profile(name: str, root: Path, repo: Path, scratch: Path, venv: Path) -> str:
    return (f'[hosts.{name}]\nfleet_role = "managed"\ntransport = "ssh"\nssh = "cluster"\n'
            f'scratch_root = "{scratch}"\nagent = "{venv}/bin/vq-admin-agent"\n'
            f'[hosts.{name}.scheduler_runtime_deployments.vibeqc]\nprovider = "site_example"\n'
            f'provider_options = {{ root = "{root}", command = "{venv}/bin/vq-site-example" }}\n'
            f'source_repo = "{repo}"\ntimeout_seconds = 600\nverify_timeout_seconds = 120\n')


def ssh_round_trips(vq: list[str], env: dict[str, str], log: Path) -> tuple[int, int]:
    """(ssh round trips, all external commands) of one run, from its call log."""
    log.unlink(missing_ok=True)
    run_quiet(vq, env=dict(env, VQ_ADMIN_TESTING="1", VQ_ADMIN_FAULT_LOG=str(log)))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    calls = [c for c in calls if "index" in c]
    return sum(1 for c in calls if c["where"] != "local"), len(calls)


def big_repo(path: Path, mib: int):
    from support import GitRepo, git

    repo = GitRepo(path)
    data = path / "data"
    data.mkdir()
    for i in range(0, mib, 32):  # incompressible, in 32 MiB files
        (data / f"blob{i // 32:03d}.bin").write_bytes(os.urandom(min(32, mib - i) << 20))
    git(path, "-c", "core.compression=0", "add", "-A")
    git(path, "commit", "-q", "-m", "big")
    return repo, git(path, "rev-parse", "HEAD")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    parser.add_argument("--archive-mib", type=int, default=None,
                        help="source archive size for the staging figure (default 500; 64 with --quick)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, a 64 MiB archive unless --archive-mib")
    parser.add_argument("--check", action="store_true", help="exit 1 when the already-current target is missed")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 5 if args.quick else args.repeat
    mib = args.archive_mib or (64 if args.quick else 500)
    from realhosts import SshdServer
    from support import GitRepo

    venv = installed_venv()
    vq = str(venv / "bin" / "vq")
    with tempfile.TemporaryDirectory(prefix="vq-bench-") as tmp:
        tmp_path = Path(tmp)
        # read_bashrc: the figures in docs/performance.md include root's ~/.bashrc on the host
        with SshdServer(tmp_path / "sshd", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}"}, read_bashrc=True) as sshd:
            ssh_true = ["ssh", "-F", str(sshd.ssh_config), "cluster", "true"]
            (tmp_path / "scratch").mkdir()
            head = f'ssh_config = "{sshd.ssh_config}"\n'
            # 1. already-current, site_example provider (a plugin), as in the demo
            repo = GitRepo(tmp_path / "src")
            sha = repo.commit("bench")
            text = head + site_example_profile("cluster", tmp_path / "apps", repo.path, tmp_path / "scratch", venv)
            (tmp_path / "admin.toml").write_text(text)
            (tmp_path / "admin.toml").chmod(0o600)
            env = dict(os.environ, VQ_ADMIN_CONFIG=str(tmp_path / "admin.toml"),
                       VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
            update = [vq, "admin", "update", "vibeqc", "cluster", "--expected-sha", sha]
            run_quiet(update + ["--cluster-install"], env=env)
            done = subprocess.run(update + ["--json"], env=env, capture_output=True, text=True)
            assert '"already-current"' in done.stdout, done.stdout[-500:] + done.stderr[-500:]
            trips, calls = ssh_round_trips(update, env, tmp_path / "calls.jsonl")
            print(f"already-current: {trips} ssh round trip(s), {calls} external command(s)", flush=True)
            run_quiet(ssh_true)
            medians = interleaved_medians({"current": lambda: run_quiet(update, env=env),
                                           "ssh": lambda: run_quiet(ssh_true)}, repeat)
            rows = [row("update already-current (median)", medians["current"], "s", medians["ssh"],
                        f"ssh cluster true; {trips} ssh round trip(s)", f"<= {CURRENT_TARGET}")]
            # 1b. the same on a login host whose shell reads no startup files (the tests' sshd): the
            # baseline is then the connection alone, so the run's own part weighs more (no target)
            with SshdServer(tmp_path / "sshd-bare", env={"PATH": f"{venv}/bin:{SYSTEM_PATH}"}) as bare:
                bare_true = ["ssh", "-F", str(bare.ssh_config), "cluster", "true"]
                (tmp_path / "bare.toml").write_text(text.replace(str(sshd.ssh_config), str(bare.ssh_config)))
                (tmp_path / "bare.toml").chmod(0o600)
                bare_env = dict(env, VQ_ADMIN_CONFIG=str(tmp_path / "bare.toml"),
                                VQ_ADMIN_STATE_DIR=str(tmp_path / "bare-state"))
                run_quiet(update, env=bare_env)
                run_quiet(bare_true)
                medians = interleaved_medians({"current": lambda: run_quiet(update, env=bare_env),
                                               "ssh": lambda: run_quiet(bare_true)}, repeat)
            rows.append(row("update already-current, no shell startup files", medians["current"], "s",
                            medians["ssh"], "ssh cluster true on that host", f"<= {BARE_TARGET}"))

            # 2. a fresh deployment with a provider that does nothing, alternating two SHAs
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
            deploy = tmp_path / "noop-deploy"
            deploy.write_text(NOOP_DEPLOY.replace("@ROOT@", str(apps)))
            deploy.chmod(0o755)
            (tmp_path / "noop.toml").write_text(head + command_profile("cluster", apps, repo.path,
                                                                       tmp_path / "scratch", venv, verify))
            (tmp_path / "noop.toml").chmod(0o600)
            noop_env = dict(env, VQ_ADMIN_CONFIG=str(tmp_path / "noop.toml"))
            fresh = [[vq, "admin", "update", "noop", "cluster", "--expected-sha", s] for s in shas]
            run_quiet(fresh[0], env=noop_env)
            trips, calls = ssh_round_trips(fresh[1], noop_env, tmp_path / "calls.jsonl")
            turn = {"i": 0}

            def deploy_next() -> None:
                turn["i"] += 1
                run_quiet(fresh[turn["i"] % 2], env=noop_env)

            medians = interleaved_medians({"fresh": deploy_next, "ssh": lambda: run_quiet(ssh_true)}, repeat)
            rows.append(row("fresh deployment, do-nothing provider (median)", medians["fresh"], "s", medians["ssh"],
                            f"ssh cluster true; {trips} ssh round trips, {calls} commands", f"<= {FRESH_TARGET}"))

            # 3. staging throughput of a big source archive
            big, big_sha = big_repo(tmp_path / "big", mib)
            (tmp_path / "big.toml").write_text(head + command_profile("cluster", apps, big.path,
                                                                      tmp_path / "scratch", venv, verify))
            (tmp_path / "big.toml").chmod(0o600)
            launcher = apps / "releases" / big_sha / "source" / ".venv" / "bin" / "python"
            launcher.parent.mkdir(parents=True)
            launcher.write_bytes(LAUNCHER)
            launcher.chmod(0o755)
            big_env = dict(env, VQ_ADMIN_CONFIG=str(tmp_path / "big.toml"))
            big_update = [vq, "admin", "update", "noop", "cluster", "--expected-sha", big_sha, "--json"]
            archive = tmp_path / "big.tar"
            subprocess.run(["git", "-C", str(big.path), "archive", "--format=tar", "-o", str(archive), big_sha],
                           check=True)
            cat_argv = ["ssh", "-F", str(sshd.ssh_config), "cluster", "cat > /dev/null"]
            stages, cats = [], []
            for _ in range(STAGE_ROUNDS):  # another SHA made active first, so the big one stages each round
                run_quiet(fresh[0], env=noop_env)
                done = subprocess.run(big_update, env=big_env, capture_output=True, text=True)
                receipt = json.loads(done.stdout)
                assert receipt["outcome"] == "ok", (receipt["outcome"], receipt["errors"])
                stages.append({s["name"]: s for s in receipt["steps"]}["stage-receive"]["seconds"])
                started = time.perf_counter()
                with open(archive, "rb") as fh:
                    subprocess.run(cat_argv, stdin=fh, check=True)
                cats.append(time.perf_counter() - started)
            print("staging rounds (stage-receive/cat, s): " + ", ".join(
                f"{a:.3f}/{b:.3f}" for a, b in zip(stages, cats, strict=True)), flush=True)
            mibs = receipt["source"]["archive_bytes"] / (1 << 20)
            rows.append(row(f"staging {mibs:.0f} MiB archive (stage-receive, median of {STAGE_ROUNDS})",
                            mibs / statistics.median(stages), "MiB/s", mibs / statistics.median(cats),
                            "ssh cluster 'cat > /dev/null' < archive", f">= {STAGE_TARGET}"))
    print_rows(rows)
    return rows


if __name__ == "__main__":
    result = main()
    staging = [r["name"] for r in result if r["target"] == f">= {STAGE_TARGET}" and r["ratio"] < STAGE_TARGET]
    exit_if_missed((["update already-current"] if result[0]["ratio"] > CURRENT_TARGET else []) + staging)
