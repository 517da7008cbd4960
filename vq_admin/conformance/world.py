"""The disposable world a provider is tested in.

Everything lives below one temporary directory::

    repo/            a real git repository: commits A and B (passing selftests)
                     and C (a selftest that fails on purpose); or, given the
                     site's own source (``source``: its repository and a commit),
                     a clone sharing that repository's objects, where A is that
                     commit, B a commit of A's very tree on top of it (another
                     SHA, the same source) and C another, never deployed
    work/<label>/    the driver-side archive of each commit (vq_admin.source)
    scratch/         stages made by the real agent verbs (stage-create,
                     stage-receive, stage-verify) on a local transport
    root/            the disposable runtime root handed to the provider
    doubles/         scheduler doubles (sbatch, squeue, scontrol, srun, sacct)
                     first on PATH; every call is logged, none reaches Slurm

Provider commands run locally through :class:`~vq_admin.ssh.transport.LocalTransport`
as argv lists, with the provider's environment plus ``PATH`` through the
doubles.
"""

from __future__ import annotations

import os
import sys
import threading

from vq_admin_hookspecs import ProviderCommand

from ..ssh import process
from .. import source
from ..core import protocol
from ..core.bounds import InputError
from ..document import Document
from ..ssh.transport import LocalTransport, RunResult

SELFTEST = {
    "ok": "print('vq conformance selftest {label}: ok')\n",
    "fail": "import sys\nprint('vq conformance selftest {label}: failing on purpose')\nsys.exit(1)\n",
}
COMMITS = (("A", "ok"), ("B", "ok"), ("C", "fail"))
SCHEDULER_PROGRAMS = ("sbatch", "squeue", "scontrol", "srun", "sacct")
DOUBLE = """#!{python}
# Scheduler double written by the vq-admin conformance kit: logs, never reaches Slurm.
import json, os, subprocess, sys
name = os.path.basename(sys.argv[0])
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"program": name, "argv": sys.argv[1:]}}) + "\\n")
code = 0
if name == "sbatch":
    wrap = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--wrap=")]
    script = [a for a in sys.argv[1:] if not a.startswith("-")]
    if wrap:
        code = subprocess.call(["/bin/sh", "-c", wrap[0]])
    elif script:
        code = subprocess.call(["/bin/sh", script[0]])
    print("4242" if "--parsable" in sys.argv else "Submitted batch job 4242", flush=True)
elif name == "scontrol":
    print("JobId=4242 JobState=COMPLETED ExitCode=0:0")
sys.exit(code)
"""
GIT_ENV = {"GIT_AUTHOR_NAME": "vq conformance", "GIT_AUTHOR_EMAIL": "conformance@vq.invalid",
           "GIT_COMMITTER_NAME": "vq conformance", "GIT_COMMITTER_EMAIL": "conformance@vq.invalid",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}



class SchedulerCall(Document, frozen=True, kw_only=True):
    """One call of a scheduler double (``sbatch``, ``squeue``, ...): its name and its arguments."""

    program: str
    argv: list[str]

class World:
    """Repository, stages, disposable root and scheduler doubles below *base*; commits A, B and C of the
    kit's own fixture, or of the site's *source* (``(repository, full SHA)``)."""

    def __init__(self, base: str, source: tuple[str, str] | None = None):
        self.base = os.path.abspath(base)
        self.repo = os.path.join(self.base, "repo")
        self.scratch = os.path.join(self.base, "scratch")
        self.root = os.path.join(self.base, "root")
        self.doubles = os.path.join(self.base, "doubles")
        self.log = os.path.join(self.base, "scheduler-calls.jsonl")
        self.sha: dict[str, str] = {}
        self.archive: dict[str, str] = {}
        #: C fails its selftest on purpose (the kit's fixture); with the site's source nothing can
        self.fails_on_purpose = source is None
        for path in (self.repo, self.scratch, self.doubles):
            os.makedirs(path, exist_ok=True)
        self._write_doubles()
        if source is None:
            self._make_commits()
        else:
            self._site_commits(*source)
        for label, sha in self.sha.items():
            self.archive[label] = self._stage(label, sha)

    # -- set-up -------------------------------------------------------------------------

    def _write_doubles(self) -> None:
        text = DOUBLE.format(python=sys.executable, log=self.log)
        for name in SCHEDULER_PROGRAMS:
            path = os.path.join(self.doubles, name)
            with open(path, "w") as fh:
                fh.write(text)
            os.chmod(path, 0o755)

    def _git(self, *args: str) -> str:
        return process.output(["git", "-C", self.repo, *args], timeout=600, env=dict(os.environ, **GIT_ENV))

    def _make_commits(self) -> None:
        self._git("init", "-q")
        for label, kind in COMMITS:
            with open(os.path.join(self.repo, "vq_selftest.py"), "w") as fh:
                fh.write(SELFTEST[kind].format(label=label))
            with open(os.path.join(self.repo, "VERSION"), "w") as fh:
                fh.write(f"conformance {label}\n")
            self._git("add", "-A")
            self._git("commit", "-q", "-m", f"conformance commit {label}")
            self.sha[label] = self._git("rev-parse", "HEAD")

    def _site_commits(self, repo: str, sha: str) -> None:
        """A = *sha* of the site's *repo*; B and C commits of A's tree made here, on top of it (the site's
        repository is only read: the clone shares its objects)."""
        self._git("clone", "-q", "--shared", "--no-checkout", os.path.abspath(repo), ".")
        if not process.run(["git", "-C", self.repo, "cat-file", "-e", f"{sha}^{{commit}}"], timeout=60).ok:
            raise ValueError(f"--sha {sha} is not a commit of --source-repo {repo}")
        self.sha["A"] = sha
        for label, parent in (("B", sha), ("C", None)):
            message = f"vq conformance: {label}, the tree of {sha} (another SHA, the same source)"
            self.sha[label] = self._git("commit-tree", f"{sha}^{{tree}}", "-p", parent or self.sha["B"], "-m",
                                        message)

    def agent(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "vq_admin.agent", *args]

    def _stage(self, label: str, sha: str) -> str:
        """Archive *sha* and stage it with the real agent verbs; the staged archive path."""
        work = os.path.join(self.base, "work", label)
        os.makedirs(work)
        ident = source.make_archive(source.resolve(self.repo, sha, None), work)
        files = ident.identity_files()
        words = {"sha": sha, "archive_sha256": files["ARCHIVE-SHA256"], "tree_sha256": files["SOURCE-TREE-SHA256"],
                 "git_tree": ident.git_tree}
        local = LocalTransport()
        made = local.run(protocol.stage_create(self.agent(), root=self.scratch, kind="runtime", name="conformance",
                                               **words), timeout=120)
        if not made.ok:
            raise RuntimeError(f"stage-create failed: {made.error_text()}")
        stage = protocol.parse_stage_create(made.stdout)["stage"]
        for argv, stdin in ((protocol.stage_receive(self.agent(), stage=stage), ident.archive_path),
                            (protocol.stage_verify(self.agent(), stage=stage, **words), None)):
            done = local.run(argv, timeout=600, stdin=stdin)
            if not done.ok:
                raise RuntimeError(f"{argv[3]} failed: {done.error_text()} {done.text()}")
        return os.path.join(stage, "source.tar")

    # -- running ------------------------------------------------------------------------

    def run(self, command: ProviderCommand, timeout: float) -> RunResult:
        env = dict(command.env)
        env["PATH"] = self.doubles + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
        return LocalTransport().run(list(command.argv), timeout=timeout, env=env)

    def scheduler_calls(self) -> list[SchedulerCall]:
        """Each call of a scheduler double, as it logged it (a line that is not one is left out)."""
        calls = []
        try:
            with open(self.log) as fh:
                for line in fh:
                    try:
                        calls.append(SchedulerCall.from_json(line, self.log))
                    except InputError:
                        continue
        except FileNotFoundError:
            pass
        return calls

    def current(self) -> str | None:
        try:
            return os.readlink(os.path.join(self.root, "current"))
        except OSError:
            return None


class LinkWatcher:
    """Samples ``root/current`` every millisecond while a command runs."""

    def __init__(self, world: World):
        self.world = world
        self.seen: list[str | None] = []
        self._stop = threading.Event()
        self._worker = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            value = self.world.current()
            if not self.seen or self.seen[-1] != value:
                self.seen.append(value)
            if self._stop.wait(0.001):
                return

    def __enter__(self) -> "LinkWatcher":
        self._worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._worker.join()
        value = self.world.current()
        if self.seen[-1] != value:
            self.seen.append(value)


def snapshot(path: str) -> dict[str, str]:
    """Every entry below *path* (``__pycache__`` excluded): type and content hash."""
    import hashlib

    out: dict[str, str] = {}
    if not os.path.isdir(path):
        return out
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            st = os.lstat(full)
            if os.path.islink(full):
                out[rel] = "link:" + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = f"dir:{st.st_mode & 0o7777:o}"
            else:
                with open(full, "rb") as fh:
                    out[rel] = f"file:{st.st_mode & 0o7777:o}:" + hashlib.sha256(fh.read()).hexdigest()
    return out
