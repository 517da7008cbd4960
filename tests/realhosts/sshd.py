"""A real OpenSSH server on 127.0.0.1, private to one test session.

Usage::

    server = SshdServer(tmp_dir, env={"SLURM_CONF": conf}).start()
    subprocess.run(["ssh", "-F", str(server.ssh_config), "cluster", "--", "true"])
    server.kill_sessions()      # inject a dropped transport (client exits 255)
    server.stop()

Everything (host key, client key, authorized keys, config, pid and log
files) lives under ``base_dir``.  Only sshd's privilege separation directory
``/run/sshd`` is shared with the system.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from .procs import (
    descendants,
    free_port,
    kill_pids,
    log_tail,
    stop_popen,
    wait_pids_gone,
    wait_until,
)

SSHD = "/usr/sbin/sshd"
DEFAULT_ALIASES = ("cluster", "cluster-login", "cluster-build", "cluster2")
_PORT_ATTEMPTS = 5
_BIND_ERRORS = ("Address already in use", "Cannot bind any address")


def _session_comm(comm: str) -> bool:
    """True for sshd session processes (``sshd``; ``sshd-session`` in OpenSSH >= 9.8)."""
    return comm == "sshd" or comm.startswith("sshd-")


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, timeout=30, stdin=subprocess.DEVNULL,
    )


#: Set in every remote session, unless ``read_bashrc`` (or the caller's ``env`` sets it).  bash,
#: started by sshd for a remote command, reads ``~/.bashrc`` only as a top-level shell (``SHLVL``
#: below 2 after its own increment); with ``SHLVL=1`` it does not.  So the sessions see the
#: ``PATH`` the fixture passes, not whatever the machine's root dotfiles add (here a ``pyenv init``
#: that put its shims first on ``PATH`` and cost about 0.1 CPU-second and up to 0.8 s of wall time
#: per connection under load).  ``HOME``, ``~/.gitconfig`` and the rest of the account stay as
#: they are.
SESSION_ENV = {"SHLVL": "1"}


def _setenv_line(env: Mapping[str, str]) -> str:
    """One ``SetEnv`` line: sshd honours only the first SetEnv keyword it reads."""
    words = []
    for name, value in env.items():
        if not name.isidentifier() or any(c in value for c in '"\n\\'):
            raise ValueError(f"cannot pass {name}={value!r} through sshd SetEnv")
        words.append(f'{name}="{value}"')
    return "SetEnv " + " ".join(words) if words else ""


class SshdServer:
    """A private ``sshd -D`` listening on a free port of 127.0.0.1.

    Args:
        base_dir: directory that will hold every file (created if missing).
        env: variables set in every remote session via ``SetEnv``
            (e.g. ``PATH``, ``SLURM_CONF``), after :data:`SESSION_ENV`.
        read_bashrc: let the sessions' bash read the account's ``~/.bashrc`` (no
            :data:`SESSION_ENV`): the benchmarks do, whose documented figures include it.
        separate_accounts: each alias stands for a login host of its own account: its
            sessions get their own ``XDG_STATE_HOME`` (the agent's state directory, where
            the host-side lease lives).  Otherwise only ``cluster2`` (a second cluster) has
            its own and every other alias shares one (one account on one cluster, as a login
            host and its build host share a home), all under *base_dir*, never the real
            account's home.
        aliases: host aliases written to :attr:`ssh_config`.
        start_timeout: seconds to wait for the first successful login.

    Attributes after :meth:`start`: ``ssh_config``, ``known_hosts``,
    ``port``, ``pid``, ``aliases``, ``identity`` (client private key),
    ``log`` (sshd's stderr).
    """

    def __init__(
        self,
        base_dir: str | Path,
        env: Mapping[str, str] | None = None,
        aliases: Iterable[str] = DEFAULT_ALIASES,
        start_timeout: float = 10.0,
        read_bashrc: bool = False,
        separate_accounts: bool = False,
    ) -> None:
        self.separate_accounts = separate_accounts
        self.base_dir = Path(base_dir)
        self.env = dict(env or {})
        self.aliases = tuple(aliases)
        if not self.aliases:
            raise ValueError("need at least one host alias")
        self.start_timeout = start_timeout
        self.read_bashrc = read_bashrc
        self.sshd_config = self.base_dir / "sshd_config"
        self.ssh_config = self.base_dir / "ssh_config"
        self.known_hosts = self.base_dir / "known_hosts"
        self.host_key = self.base_dir / "ssh_host_ed25519_key"
        self.identity = self.base_dir / "id_ed25519"
        self.authorized_dir = self.base_dir / "authorized_keys"
        self.pid_file = self.base_dir / "sshd.pid"
        self.log = self.base_dir / "sshd.log"
        self.port: int | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None

    # -- lifecycle -------------------------------------------------------

    def start(self) -> "SshdServer":
        """Generate keys, pick a port, start sshd and wait until a login works."""
        if self._proc is not None:
            raise RuntimeError("sshd already started")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self._make_keys()
        for _attempt in range(_PORT_ATTEMPTS):
            self.port = free_port()
            self._write_configs()
            check = subprocess.run([SSHD, "-t", "-f", str(self.sshd_config)],
                                   timeout=30, capture_output=True, text=True)
            if check.returncode != 0:
                raise RuntimeError(f"sshd -t rejected {self.sshd_config}:\n{check.stderr}")
            log_start = self.log.stat().st_size if self.log.exists() else 0
            if self._launch_and_wait():
                return self
            with open(self.log, errors="replace") as log:
                log.seek(log_start)
                if not any(err in log.read() for err in _BIND_ERRORS):
                    break  # a real failure, not a lost race for the port
        tail = log_tail(self.log)
        self.stop()
        raise RuntimeError(f"sshd did not accept logins on port {self.port}:\n{tail}")

    def stop(self) -> None:
        """Kill the session processes and the listener; return when all are gone."""
        if self._proc is None:
            return
        sessions = self.session_pids()
        kill_pids(sessions, signal.SIGKILL)
        stop_popen(self._proc)
        wait_pids_gone(sessions, timeout=5.0)
        self._proc = None
        self.pid = None

    def __enter__(self) -> "SshdServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- fault injection ---------------------------------------------------

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes below the listener."""
        if self.pid is None:
            return []
        return [pid for pid, comm in descendants(self.pid) if _session_comm(comm)]

    def kill_sessions(self, sig: int = signal.SIGKILL) -> list[int]:
        """Kill every sshd session process (not the commands they run).

        Connected clients see a dropped transport and exit 255; the remote
        commands keep running, as after a real network failure.  Returns the
        PIDs signalled, after waiting until they are gone.
        """
        killed = kill_pids(self.session_pids(), sig)
        wait_pids_gone(killed, timeout=5.0)
        return killed

    # -- client helpers ------------------------------------------------------

    def ssh_argv(self, alias: str | None = None, *remote: str) -> list[str]:
        """``ssh -F CONFIG ALIAS [-- REMOTE...]`` as an argv list.

        ``remote`` words are sent as-is: ssh joins them with spaces and the
        remote shell parses the result, so quote them (``shlex.quote``).
        """
        argv = ["ssh", "-F", str(self.ssh_config), alias or self.aliases[0]]
        return argv + (["--", *remote] if remote else [])

    # -- internals -------------------------------------------------------------

    def _make_keys(self) -> None:
        if not self.host_key.exists():
            _keygen(self.host_key, "vq-test-host")
        if not self.identity.exists():
            _keygen(self.identity, "vq-test-client")
        self.authorized_dir.mkdir(exist_ok=True)
        self.authorized_dir.chmod(0o755)
        pub = self.identity.with_suffix(".pub").read_text()
        (self.authorized_dir / "root").write_text(pub)

    def _write_configs(self) -> None:
        lines = [
            "ListenAddress 127.0.0.1",
            f"Port {self.port}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_dir}/%u",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "KexAlgorithms curve25519-sha256",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "MaxStartups 100",
            "MaxSessions 100",
            "Subsystem sftp internal-sftp",
            "AcceptEnv XDG_STATE_HOME",
            _setenv_line({**({} if self.read_bashrc else SESSION_ENV), **self.env}),
        ]
        self.sshd_config.write_text("\n".join(ln for ln in lines if ln) + "\n")
        host_pub = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        blocks = []
        for alias in self.aliases:
            blocks.append("\n".join([
                f"Host {alias}",
                "    HostName 127.0.0.1",
                f"    Port {self.port}",
                "    User root",
                f"    IdentityFile {self.identity}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts}",
                "    StrictHostKeyChecking yes",
                "    BatchMode yes",
                "    LogLevel ERROR",
                f"    SetEnv XDG_STATE_HOME={self.agent_state(alias)}",
            ]))
        self.ssh_config.write_text("\n\n".join(blocks) + "\n")

    def agent_state(self, alias: str) -> Path:
        """The ``XDG_STATE_HOME`` of *alias*'s sessions (created owner-only)."""
        own = self.separate_accounts or alias == "cluster2"
        path = self.base_dir / "accounts" / (alias if own else "shared")
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def _login_works(self) -> bool:
        try:
            done = subprocess.run(self.ssh_argv(None, "true"), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=5)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def _launch_and_wait(self) -> bool:
        """Start sshd; True once a login succeeds, False if it died or timed out."""
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.sshd_config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        self.pid = self._proc.pid

        def outcome() -> str | None:
            if self._proc.poll() is not None:
                return "died"
            return "ready" if self._login_works() else None

        if wait_until(outcome, self.start_timeout, interval=0.05) == "ready":
            return True
        stop_popen(self._proc)
        self._proc = None
        self.pid = None
        return False
