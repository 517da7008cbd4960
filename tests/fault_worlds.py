"""The three subjects of the fault table (tests/test_fault_table.py), each a small
real world:

* ``runtime``: ``vq admin update vibeqc cluster`` with the site_example
  provider, built on the fixed build host ``cluster-build``, verified on
  ``cluster``, both through the real loopback sshd;
* ``helper``: ``vq admin update cluster`` with the site helper updater, on a
  ``transport = "local"`` host (a third ssh world would only repeat the
  runtime subject's ssh rows, at twice the cost per run);
* ``mirror``: the runtime lane with ``feed_source_mirror`` (a real bare mirror
  fed by git over the real loopback sshd) and a site preparer.

Every row starts from the same point: generation A active and recorded as
LAST OK, and the row requests generation B, whose release already exists on
the host (built once in :meth:`World.setup`, as after a roll-back to A).  So
the deploy is a reuse of B and an atomic switch of ``current``, and every row
is independent of the others and deterministic.  :meth:`World.reset` brings a
world back to that point out of band (the test harness plays the operator's
earlier history; vq-admin is not involved): ``current`` -> A, the driver state
directory and the mirror restored from snapshots taken after A was deployed,
leftover stages removed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from helper_world import FAST_REREADS, bootstrap, helper_repo, helper_table, live_identity
from support import SITE_EXAMPLE, CliResult, GitRepo, run_vq, site_example_host, write_config

RUN_TIMEOUT = 180.0


class World:
    """One subject: a configuration, a state directory, a host-side root."""

    lane = ""

    def __init__(self, tmp: Path, sshd):
        self.tmp, self.sshd = tmp, sshd
        self.state = tmp / "state"
        self.scratch = tmp / "scratch"
        self.scratch.mkdir(parents=True)
        self.root = tmp / "root"
        self.snapshots = tmp / "snapshots"
        self.a = self.b = ""

    # -- subclasses --------------------------------------------------------------------

    def argv(self, sha: str) -> list[str]:
        raise NotImplementedError

    def setup(self) -> None:
        """Build the subject once: generation A deployed and snapshotted, B's release present."""
        raise NotImplementedError

    def active_problem(self, sha: str, receipt: dict | None) -> str | None:
        """None when the host really runs *sha*, proven independently of vq-admin."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------

    def run(self, sha: str | None = None, env: dict[str, str] | None = None) -> CliResult:
        return run_vq(*self.argv(sha or self.b), "--json", config=self.config, state=self.state,
                      env={**FAST_REREADS, **(env or {})}, timeout=RUN_TIMEOUT)

    def must(self, sha: str, *extra: str) -> dict:
        done = run_vq(*self.argv(sha), "--json", *extra, config=self.config, state=self.state,
                      env=FAST_REREADS, timeout=RUN_TIMEOUT)
        assert done.exit_code == 0, f"set-up run failed: {done.stdout}{done.stderr}"
        return done.json()

    def snapshot(self, name: str, path: Path) -> None:
        target = self.snapshots / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(path, target, symlinks=True)

    def restore(self, name: str, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(self.snapshots / name, path, symlinks=True)

    def reset(self) -> None:
        """Generation A active and recorded; B's release present; no stages."""
        point_current(self.root, self.a)
        self.restore("state", self.state)
        for leftover in (self.scratch / ".vq-admin").glob("stage/*/*/stage.*"):
            shutil.rmtree(leftover)

    def lane_record(self, which: str) -> dict | None:
        lane = self.state / "hosts" / "cluster" / ("helper" if self.lane == "helper" else "runtime/vibeqc")
        try:
            return json.loads((lane / f"{which}.json").read_text())
        except FileNotFoundError:
            return None

    def current_sha(self) -> str | None:
        try:
            return os.path.basename(os.readlink(self.root / "current"))
        except OSError:
            return None


def point_current(root: Path, sha: str) -> None:
    """Out of band: make ``root/current`` name ``releases/<sha>`` (atomic rename of a new link)."""
    tmp = root / ".current.fault-table"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(f"releases/{sha}", tmp)
    os.replace(tmp, root / "current")


def two_generations(path: Path) -> tuple[GitRepo, str, str]:
    repo = GitRepo(path)
    a = repo.commit("generation A")
    repo.tag("v1.0", a, annotated=True)
    b = repo.commit("generation B")
    repo.tag("v2.0", b, annotated=True)
    return repo, a, b


def site_verify(root: Path, sha: str) -> dict:
    """The provider's verify run directly on this machine (the loopback login host)."""
    done = subprocess.run([SITE_EXAMPLE, "verify", "--root", str(root), "--program", "vibeqc", "--expected-sha", sha],
                          capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout)


class RuntimeWorld(World):
    """The runtime lane on a fixed build host (test_runtime_real.py's set-up)."""

    lane = "runtime"

    def __init__(self, tmp: Path, sshd, *, extra_profile: str = 'update_host = "cluster-build"\n'):
        super().__init__(tmp, sshd)
        self.repo, self.a, self.b = two_generations(tmp / "src")
        host = site_example_host("cluster", root=self.root, repo=self.repo.path, scratch=self.scratch,
                                 transport="ssh", ssh="cluster", extra_profile=extra_profile)
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{sshd.ssh_config}"\n' + host)

    def argv(self, sha: str) -> list[str]:
        return ["update", "vibeqc", "cluster", "--expected-sha", sha]

    def setup(self) -> None:
        self.must(self.a, "--cluster-install")
        self.snapshot("state", self.state)
        self.must(self.b)  # B's release now exists; rows reuse it

    def active_problem(self, sha: str, receipt: dict | None) -> str | None:
        if self.current_sha() != sha:
            return f"current names {self.current_sha()}, not {sha}"
        found = site_verify(self.root, sha)
        launcher = f"{self.root}/releases/{sha}/bin/vibeqc-{sha}"
        if (found["source_sha"], found["healthy"], found["active_path"]) != (sha, True, launcher):
            return f"the provider's own verify does not prove {sha}: {found}"
        if receipt is not None:
            final = (receipt.get("verify") or {}).get("final") or {}
            readback = (receipt.get("verify") or {}).get("readback") or {}
            proof = readback if readback.get("proven") else final
            if not proof.get("proven") or (proof.get("receipt") or {}).get("source_sha") != sha:
                return "the receipt carries no proven verify of the requested SHA"
        last_ok = self.lane_record("last-ok") or {}
        if receipt is not None and last_ok.get("sha") != sha:
            return f"LAST OK is {last_ok.get('sha')}, not {sha}"
        return None


class MirrorWorld(RuntimeWorld):
    """The runtime lane feeding a push-fed bare mirror on the login host, then a preparer."""

    lane = "mirror"

    def __init__(self, tmp: Path, sshd):
        self.mirror = tmp / "mirror.git"
        subprocess.run(["git", "init", "-q", "--bare", str(self.mirror)], check=True)
        self.prep_out = tmp / "prepared"
        prep = tmp / "prepare.sh"
        prep.write_text("#!/bin/sh\n"
                        f"git -C {shlex.quote(str(self.mirror))} rev-parse --verify \"$2\" "
                        f"> {shlex.quote(str(self.prep_out))}\n")
        prep.chmod(0o755)
        super().__init__(tmp, sshd, extra_profile=(f'feed_source_mirror = "{self.mirror}"\nlane = "release"\n'
                                                   f'prepare_command = "{prep}"\n'))

    def setup(self) -> None:
        self.must(self.a, "--cluster-install")
        self.snapshot("state", self.state)
        self.snapshot("mirror", self.mirror)
        self.must(self.b)

    def reset(self) -> None:
        super().reset()
        self.restore("mirror", self.mirror)
        self.prep_out.unlink(missing_ok=True)

    def active_problem(self, sha: str, receipt: dict | None) -> str | None:
        problem = super().active_problem(sha, receipt)
        if problem is None and receipt is not None:
            held = subprocess.run(["git", "-C", str(self.mirror), "rev-parse", f"refs/vq/pins/{sha}",
                                   "refs/heads/release"], capture_output=True, text=True).stdout.split()
            if held != [sha, sha]:
                return f"the mirror holds {held}, not the pin and lane branch at {sha}"
        return problem


class HelperWorld(World):
    """The helper lane on a ``transport = "local"`` host (the faults are injected at
    vq-admin's one command choke point, so no ssh is needed to drop a call)."""

    lane = "helper"

    def __init__(self, tmp: Path, sshd):
        super().__init__(tmp, sshd)
        self.repo, self.a = helper_repo(tmp / "repo")
        bootstrap(self.root, self.repo.path, self.a, tmp)
        self.b = self.repo.commit("helper B", {"HELPER-NOTE": "B\n"})
        text = helper_table("cluster", root=self.root, repo=self.repo.path, scratch=self.scratch)
        self.config = write_config(tmp / "admin.toml", text)

    def argv(self, sha: str) -> list[str]:
        return ["update", "cluster", "--expected-sha", sha]

    def setup(self) -> None:
        assert self.must(self.a)["outcome"] == "already-current"  # the bootstrap, proven and recorded
        self.snapshot("state", self.state)
        self.must(self.b)

    def active_problem(self, sha: str, receipt: dict | None) -> str | None:
        if self.current_sha() != sha:
            return f"current names {self.current_sha()}, not {sha}"
        live = live_identity(self.root)
        if (live["source_sha"], live["record"]) != (sha, "bound"):
            return f"the live helper reports {live['source_sha']} ({live['record']}), not {sha}"
        if receipt is not None:
            if live["tree_sha256"] != receipt["source"]["tree_sha256"]:
                return "the live helper's tree is not the staged tree"
            last_ok = self.lane_record("last-ok") or {}
            activation = self.lane_record("activation") or {}
            if last_ok.get("sha") != sha or (receipt["outcome"] == "ok" and activation.get("expected_sha") != sha):
                return f"LAST OK {last_ok.get('sha')} / activation {activation.get('expected_sha')} do not name {sha}"
        return None


WORLDS = {"runtime": RuntimeWorld, "helper": HelperWorld, "mirror": MirrorWorld}
