"""What :mod:`vq_admin.bindings` needs from the configuration, read lazily.

* :func:`host_table`: one host's table of the TOML configuration, for alias
  resolution (only for a host that has no registry evidence of its own) and
  for the read-back.  The file must be private (owned by you or root, not
  writable by group or others), as for every other command.
* :func:`check_launcher_on_host`: ``--check-on-host``.  Runs the agent's
  ``hash-file`` on the login host (``ssh -F <ssh_config> <dest> -- <agent>
  hash-file <launcher>``, or directly for ``transport = "local"``) and refuses
  unless the file there still has the SHA-256 the registry attests.

Standard library only; the process runner (:mod:`vq_admin.ssh.process`, whose
ssh options it uses) and ``tomllib`` are imported here, so the plain lookup
never pays for them.  This does not validate the whole configuration
(``vq admin check`` does); it reads only the keys it needs.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING

from ..core import default_paths as paths
from ..core.bounds import json_object
from ..core.identifiers import DESTINATION_RE

if TYPE_CHECKING:
    from ..core.bounds import TomlTable
    from .registry import Entry

_cache: dict[tuple[str, int, int, int, int] | None, TomlTable] = {}


class ConfigUnavailable(Exception):
    """The configuration cannot answer (missing, unreadable, not private, no such host)."""


class ReadbackRefused(Exception):
    """The read-back refuses the launcher; :mod:`vq_admin.bindings` turns it into its ``LauncherRefused``
    (the dependency runs from bindings to this module, never back)."""

    def __init__(self, code: str, reason: str, remedy: str):
        super().__init__(reason)
        self.code, self.reason, self.remedy = code, reason, remedy


def config_path_of(config_path: str | os.PathLike[str] | None) -> str:
    return os.fspath(config_path) if config_path else paths.config_path()


def load(config_path: str | os.PathLike[str] | None) -> TomlTable:
    """The parsed TOML document, cached per (path, inode, size, mtime).

    The file must pass the secure-path rule, be a regular file (a FIFO never
    blocks) of bounded size and nesting."""
    from ..core.bounds import InputError, read_config

    path = config_path_of(config_path)
    try:
        st = os.stat(path)
        key = (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        key = None  # read_config says why
    if key is None or key not in _cache:
        try:
            data = read_config(path)
        except InputError as exc:
            raise ConfigUnavailable(str(exc)) from None
        _cache.clear()
        _cache[key] = data
        return data
    return _cache[key]


def host_table(config_path: str | os.PathLike[str] | None, host: str) -> tuple[TomlTable, TomlTable]:
    """``(hosts.<host> table, whole document)``; :class:`ConfigUnavailable` when absent."""
    data = load(config_path)
    hosts = data.get("hosts")
    table = hosts.get(host) if isinstance(hosts, dict) else None
    if not isinstance(table, dict):
        known = ", ".join(sorted(hosts)) if isinstance(hosts, dict) and hosts else "none"
        raise ConfigUnavailable(f"host {host!r} is not in the configuration {config_path_of(config_path)} "
                                f"(hosts: {known})")
    return table, data


def hash_argv(table: TomlTable, data: TomlTable, host: str, launcher: str) -> list[str]:
    """The argv that reads the launcher's SHA-256 on *host*'s login host."""
    agent = table.get("agent", "vq-admin-agent")
    words = shlex.split(agent) if isinstance(agent, str) else []
    if not words:
        raise ConfigUnavailable(f"hosts.{host}.agent is not a command")
    from ..core.protocol import hash_file
    from ..core.securepath import command_problem

    from ..core.agentjudge import launch

    remote = [*launch(words), *hash_file(words, launcher)[len(words):]]  # judged, then run isolated

    if table.get("transport", "ssh") == "local":
        problem = command_problem(words, what=f"hosts.{host}.agent")
        if problem:
            raise ConfigUnavailable(f"{problem}; refusing to run it")
        return remote
    destination = table.get("ssh", host)
    if not isinstance(destination, str) or not DESTINATION_RE.match(destination):
        raise ConfigUnavailable(f"hosts.{host}.ssh {destination!r} is not an ssh destination")
    from ..ssh import effective
    from ..ssh.argv import ssh_words  # how every ssh command line starts

    ssh_config = found if isinstance(found := data.get("ssh_config"), str) else None
    problem = effective.problem(ssh_config, destination)
    if problem:
        raise ConfigUnavailable(f"{problem}; refusing it")
    return [*ssh_words(ssh_config), "--", destination, " ".join(shlex.quote(w) for w in remote)]


def check_launcher_on_host(entry: Entry, config_path: str | os.PathLike[str] | None, timeout: float) -> None:
    """Refuse unless the launcher on the login host hashes to the attested SHA-256."""
    host, launcher, attested = entry.host, entry.launcher, entry.launcher_sha256
    remedy = (f"check that {host} is reachable and its agent installed (vq admin update {host}); "
              "the binding stays refused until the read-back succeeds")
    try:
        table, data = host_table(config_path, host)
        argv = hash_argv(table, data, host, launcher)
    except ConfigUnavailable as exc:
        raise ReadbackRefused("readback-failed", f"cannot read back {launcher} on {host}: {exc}", remedy) from None
    from ..ssh import process

    done = process.run(argv, timeout=timeout)
    if done.ended in (process.NOT_STARTED, process.TIMED_OUT):
        why = (done.stderr.decode("utf-8", "replace").strip() if done.ended == process.NOT_STARTED
               else f"no answer within {timeout:g} s")
        raise ReadbackRefused("readback-failed", f"cannot read back {launcher} on {host}: {why}", remedy) from None
    answer = json_object(done.stdout, limit=1 << 20)
    if answer is None:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise ReadbackRefused("readback-failed", f"cannot read back {launcher} on {host}: exit {done.returncode}: "
                              f"{tail[0][:300]}", remedy)
    changed = (f"do not run it: it is not the executable that was verified (receipt {entry.receipt}); find out who "
               f"changed it, then deploy a new generation "
               f"(vq admin update {entry.program} {host} --expected-sha SHA) "
               "and resubmit with the launcher vq admin launcher prints")
    if isinstance(answer.get("untrusted"), str):
        raise ReadbackRefused("untrusted-launcher", f"{answer['untrusted']} (launcher {launcher} on {host})",
                              "do not run it until the directory is fixed; then deploy a new generation "
                              f"(vq admin update {entry.program} {host} --expected-sha SHA)")
    if answer.get("exists") is False:
        raise ReadbackRefused("launcher-changed",
                              f"the verified launcher {launcher} no longer exists on {host}", changed)
    actual = answer.get("sha256")
    if done.returncode != 0 or not isinstance(actual, str):
        raise ReadbackRefused("readback-failed",
                              f"cannot read back {launcher} on {host}: {answer.get('error')}", remedy)
    if actual != attested:
        raise ReadbackRefused("launcher-changed", f"{launcher} on {host} now has SHA-256 {actual}; the verified "
                              f"deployment attested {attested}", changed)
