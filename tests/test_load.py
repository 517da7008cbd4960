"""Load: eight runtime updates of different programs on different hosts at once, one
state directory, while fifty launcher lookups (threads calling
``resolve_launcher``, and ``vq admin launcher`` subprocesses) hammer the
registry the updates are writing.

Each round is a fresh world.  The suite runs ``VQ_ADMIN_LOAD_ROUNDS`` rounds
(default 2); the issue's "ten times in a row" is::

    VQ_ADMIN_LOAD_ROUNDS=10 python3 -m pytest -q tests/test_load.py
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from support import VQ_ADMIN, GitRepo, site_example_host, write_config
from vq_admin import bindings

pytestmark = pytest.mark.real
ROUNDS = int(os.environ.get("VQ_ADMIN_LOAD_ROUNDS", "2"))
UPDATES = 8
LOOKUP_THREADS = 50
LOOKUP_PROCESSES = 3
DEADLINE = 240.0


def world(tmp):
    repo = GitRepo(tmp / "src")
    sha = repo.commit("A")
    hosts = []
    for i in range(UPDATES):
        (tmp / f"scratch{i}").mkdir()
        hosts.append(site_example_host(f"host{i}", root=tmp / f"root{i}", repo=repo.path, scratch=tmp / f"scratch{i}",
                                       program=f"prog{i}"))
    return write_config(tmp / "admin.toml", "\n".join(hosts)), sha


def launcher_of(tmp, i, sha):
    return f"{tmp}/root{i}/releases/{sha}/bin/prog{i}-{sha}"  # the example provider's per-generation launcher


_COUNT = threading.Lock()


def count(seen: dict | None, kind: str) -> None:
    if seen is not None:
        with _COUNT:
            seen[kind] = seen.get(kind, 0) + 1


def judge_lookup(tmp, i, sha, lookup, seen: dict | None = None) -> str | None:
    """A lookup answers the verified launcher or refuses for lack of evidence; nothing else."""
    try:
        binding = lookup()
    except bindings.LauncherRefused as exc:
        count(seen, exc.code)
        return None if exc.code == "no-evidence" else f"refused {exc.code}: {exc.reason}"
    except Exception as exc:  # a half-written entry would surface here
        return f"{type(exc).__name__}: {exc}"
    if (binding.sha, binding.launcher) != (sha, launcher_of(tmp, i, sha)):
        return f"answered {binding.sha} {binding.launcher}"
    count(seen, "launcher")
    return None


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_eight_updates_at_once_while_fifty_lookups_read_the_registry(tmp_path, round_):
    config, sha = world(tmp_path)
    state = tmp_path / "state"
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state))
    updates = [subprocess.Popen([VQ_ADMIN, "update", f"prog{i}", f"host{i}",
                                 "--expected-sha", sha, "--cluster-install", "--json"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
               for i in range(UPDATES)]
    done = threading.Event()
    problems: list[str] = []
    seen: dict[str, int] = {}

    def hammer(n: int) -> None:
        i = n % UPDATES
        while not done.is_set():
            problem = judge_lookup(tmp_path, i, sha, lambda: bindings.resolve_launcher(
                f"prog{i}", f"host{i}", expected_sha=sha if n % 2 else None, state_dir=state, config_path=config), seen)
            if problem:
                problems.append(f"thread {n}: {problem}")
            done.wait(0.02)  # pacing only: the threads must not starve the updates of the interpreter lock

    def command_line(n: int) -> None:
        i = n % UPDATES
        while not done.is_set():
            out = subprocess.run([VQ_ADMIN, "launcher", f"prog{i}", f"host{i}", "--json"],
                                 env=env, capture_output=True, text=True, timeout=60)
            count(seen, "subprocess")
            doc = json.loads(out.stdout)
            if out.returncode == 0:
                if (doc.get("sha"), doc.get("launcher")) != (sha, launcher_of(tmp_path, i, sha)):
                    problems.append(f"vq admin launcher answered {doc}")
            elif out.returncode != 77 or doc.get("code") != "no-evidence":
                problems.append(f"vq admin launcher exit {out.returncode}: {out.stdout} {out.stderr}")

    workers = [threading.Thread(target=hammer, args=(n,)) for n in range(LOOKUP_THREADS)]
    workers += [threading.Thread(target=command_line, args=(n,)) for n in range(LOOKUP_PROCESSES)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + DEADLINE
    try:
        results = [(p.communicate(timeout=max(1.0, deadline - time.monotonic())), p.returncode) for p in updates]
    finally:
        done.set()
        for w in workers:
            w.join(timeout=60)
    for i, ((stdout, stderr), code) in enumerate(results):
        assert code == 0 and "Traceback" not in stderr, f"update {i}: {code} {stdout} {stderr}"
        receipt = json.loads(stdout)
        assert (receipt["outcome"], receipt["host"], receipt["program"]) == ("ok", f"host{i}", f"prog{i}")
        stored = json.loads((state / "receipts" / f"{receipt['id']}.json").read_text())
        assert stored == receipt
        last_ok = json.loads((state / "hosts" / f"host{i}" / "runtime" / f"prog{i}" / "last-ok.json").read_text())
        assert last_ok["sha"] == sha and last_ok["launcher"] == launcher_of(tmp_path, i, sha)
    log = (state / "admin.log").read_text().splitlines()
    assert len(log) == UPDATES and len(list((state / "receipts").glob("*.json"))) == UPDATES
    assert sorted((e["host"], e["outcome"]) for e in map(json.loads, log)) == [(f"host{i}",
                                                                                "ok") for i in range(UPDATES)]
    assert not problems, problems[:10]
    # the lookups ran during the deployments: before their evidence existed, and every looker answered
    assert seen.get("no-evidence", 0) >= LOOKUP_THREADS and seen.get("subprocess", 0) >= LOOKUP_PROCESSES, seen
    for i in range(UPDATES):  # after the storm every lookup resolves
        assert judge_lookup(tmp_path, i, sha, lambda i=i: bindings.resolve_launcher(f"prog{i}", f"host{i}",
                                                                                    state_dir=state)) is None
