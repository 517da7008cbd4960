"""A small fleet for the lease and fleet tests: several login hosts, each an
alias of one real loopback sshd (or ``transport = "local"``), each with its
own runtime root and scratch, all sharing one git repository.

Builds run the built-in ``command`` provider: ``vq-site-example install``
(which creates the root on first use), optionally behind a *gate*: a shell
script that records that the build started, waits (bounded) until the test
opens the gate or until N builds have started, runs the build and records
that it ended.  Tests wait on those files, never on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from realhosts.procs import pid_alive, wait_until
from support import AGENT, SITE_EXAMPLE, VQ_ADMIN, GitRepo, flock_free, write_config

GATE = """\
#!/bin/sh
# gate DIR WORDS...: record the start, wait for DIR/open (or DIR/need builds started), run WORDS.
dir="$1"; shift
: > "$dir/started.$$"
i=0
while :; do
    [ -e "$dir/open" ] && break
    if [ -e "$dir/need" ]; then
        n=$(ls "$dir" | grep -c '^started\\.')
        [ "$n" -ge "$(cat "$dir/need")" ] && break
    fi
    i=$((i+1))
    if [ "$i" -gt 1200 ]; then echo "gate: not opened within 120 s" >&2; exit 9; fi
    sleep 0.1
done
"$@"
rc=$?
: > "$dir/done.$$"
exit $rc
"""


class Fleet:
    """Hosts by name: ``managed`` ones get a ``vibeqc`` profile; ``alias``/``excluded`` ones too
    (with their own root), so a test can prove they were never touched."""

    def __init__(self, tmp: Path, ssh_config: str | None, hosts: dict[str, dict], *, program: str = "vibeqc",
                 sshd=None):
        self.tmp = Path(tmp)
        self.sshd = sshd  # the SshdServer behind ssh_config: where each alias keeps its agent state
        self.program = program
        self.repo = GitRepo(self.tmp / "src")
        self.a = self.repo.commit("generation A")
        self.b = self.repo.commit("generation B")
        self.gate = self.tmp / "gate"
        self.gate.mkdir()
        gate = self.tmp / "gate.sh"
        gate.write_text(GATE)
        gate.chmod(0o755)
        self.hosts = hosts
        text = f'ssh_config = "{ssh_config}"\n' if ssh_config else ""
        for name, spec in hosts.items():
            role = spec.get("role", "managed")
            root, scratch = self.root(name), self.scratch(name)
            scratch.mkdir(parents=True)
            text += f'\n[hosts.{name}]\nfleet_role = "{role}"\n'
            if role == "alias":
                text += f'canonical_host = "{spec["canonical"]}"\n'
            transport = spec.get("transport", "ssh")
            text += f'transport = "{transport}"\n'
            if transport == "ssh":
                text += f'ssh = "{spec["ssh"]}"\n'
            text += f'scratch_root = "{scratch}"\nagent = "{spec.get("agent", AGENT)}"\n'
            # "install": the profile has both operations (deploy needs an existing root, install creates it)
            verb = "deploy" if spec.get("install") else "install"
            update = spec.get("update") or f"{SITE_EXAMPLE} {verb} --root {root}"
            if spec.get("gated"):
                update = f"{gate} {self.gate} {update}"
            text += (f'\n[hosts.{name}.scheduler_runtime_deployments.{program}]\n'
                     f'update_command = "{update}"\n'
                     + (f'install_command = "{SITE_EXAMPLE} install --root {root}"\n' if spec.get("install") else "") +
                     f'verify_command = "{SITE_EXAMPLE} verify --root {root}"\n'
                     f'source_repo = "{self.repo.path}"\ntimeout_seconds = 600\nverify_timeout_seconds = 120\n')
            if spec.get("allocation"):
                text += f'update_allocation = {{ sbatch_args = {json.dumps(spec["allocation"])} }}\n'
        self.config = write_config(self.tmp / "admin.toml", text)

    def root(self, name: str) -> Path:
        return self.tmp / "hosts" / name / "apps"

    def scratch(self, name: str) -> Path:
        return self.tmp / "hosts" / name / "scratch"

    def lock_file(self, name: str) -> Path:
        """The host-side lease of *name*: in the agent's state directory of the login host's account."""
        spec = self.hosts[name]
        if spec.get("transport", "ssh") == "ssh":
            state = self.sshd.agent_state(spec["ssh"])
        else:
            state = Path(os.environ["XDG_STATE_HOME"])
        return state / "vq-admin-agent" / "locks" / f"runtime.{self.program}.lock"

    def holder(self, name: str) -> dict | None:
        try:
            return json.loads(Path(str(self.lock_file(name)) + ".holder").read_text())
        except (OSError, ValueError):
            return None

    def active_sha(self, name: str) -> str:
        """The SHA the host runs, by the provider's own verify (run independently of vq-admin)."""
        done = subprocess.run([SITE_EXAMPLE, "verify", "--root", str(self.root(name)), "--program", self.program,
                               "--expected-sha", self.a], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout)["source_sha"]

    def lease_free(self, name: str, lock: str = "") -> bool:
        """True when nobody holds the host's lease (a non-blocking flock succeeds); *lock* ``".work"``:
        its work lock (held by a build or job a run left running)."""
        return flock_free(Path(str(self.lock_file(name)) + lock))

    def started(self) -> int:
        return len(list(self.gate.glob("started.*")))

    def done(self) -> int:
        return len(list(self.gate.glob("done.*")))

    def open_gate(self) -> None:
        (self.gate / "open").touch()

    def need(self, n: int) -> None:
        (self.gate / "need").write_text(str(n))

    def env(self, state: Path | str) -> dict[str, str]:
        return dict(os.environ, VQ_ADMIN_CONFIG=str(self.config), VQ_ADMIN_STATE_DIR=str(state))

    def start(self, *args: str, state: Path | str) -> subprocess.Popen:
        """``vq-admin ARGS`` in the background (as a second administrator would)."""
        return subprocess.Popen([VQ_ADMIN, *args], env=self.env(state),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def update(self, host: str, sha: str, *extra: str, state: Path | str) -> subprocess.Popen:
        return self.start("update", self.program, host, "--expected-sha", sha, "--json", *extra, state=state)

    def receipts(self, state: Path | str, host: str | None = None) -> list[dict]:
        found = []
        for path in sorted((Path(state) / "receipts").glob("*.json")):
            doc = json.loads(path.read_text())
            if host is None or doc["host"] == host:
                found.append(doc)
        return found

    def explain(self, state: Path | str) -> str:
        """For a failure message: each host's newest receipt's outcome, errors and read-back (a
        CliResult's repr is cut short by pytest; this is what says why a host ended as it did)."""
        lines = []
        for name in self.hosts:
            for doc in self.receipts(state, name)[-1:]:
                lines.append(f"{name} {doc['id']}: {doc['outcome']}; errors {doc['errors']}; "
                             f"readback {doc.get('readback')}")
        return "\n".join(lines)


def wait_for(predicate, what: str, timeout: float = 90.0):
    found = wait_until(predicate, timeout, interval=0.05)
    assert found, f"timed out after {timeout:.0f} s waiting for {what}"
    return found


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    wait_for(lambda: not pid_alive(pid), f"pid {pid} to end", timeout)


def finish(proc: subprocess.Popen, timeout: float = 300.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def kill(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    proc.send_signal(sig)
    proc.wait(timeout=60)
