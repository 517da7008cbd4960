"""External configuration: TOML -> frozen records (CONTRACT section 3).

Every rule is checked here, before anything runs.  A violation raises
:class:`ConfigError` (exit 2) whose message starts with the dotted key and
says why.  Unknown keys are errors too, so a misspelt key never silently
falls back to a default.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, TypeGuard

from ..core import default_paths as paths
from ..core.identifiers import BRANCH_RE, DESTINATION_RE, ENV_NAME_RE, NAME_RE, NAME_RULE
from ..report.outcome import UsageError
from .confirm import BETTER, KEYS as CONFIRM_KEYS, Confirm, Metric

ROLES = ("managed", "helper-only", "alias", "excluded")
TRANSPORTS = ("ssh", "local")
#: ``scheduler``: checked, not stored; vq-admin drives Slurm only (docs/architecture.md, "The scheduler").
SCHEDULERS = ("slurm",)
PREPARER_READS = ("lane", "pin")
MAX_TIMEOUT = 30 * 24 * 3600.0
#: The longest string value (a path, a destination, a command line, a provider option) in characters.
MAX_STRING = 4096


class ConfigError(UsageError):
    """Invalid configuration; the message names the dotted key and the reason."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}" if key else reason)
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Allocation:
    """``update_allocation``: run the build as a Slurm batch job."""

    sbatch_args: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RuntimeProfile:
    """One ``[hosts.H.scheduler_runtime_deployments.P]`` table."""

    program: str
    provider: str = "command"
    update_command: tuple[str, ...] | None = None
    install_command: tuple[str, ...] | None = None
    verify_command: tuple[str, ...] | None = None
    update_host: str | None = None
    update_allocation: Allocation | None = None
    timeout_seconds: float = 14400.0
    verify_timeout_seconds: float = 600.0
    source_repo: str  # required: the driver-side checkout the exact commit is staged from
    feed_source_mirror: str | None = None
    lane: str = "main"
    prepare_command: tuple[str, ...] | None = None
    preparer_reads: str = "lane"
    provider_options: Mapping[str, str] = field(default_factory=dict)
    activate_command: tuple[str, ...] | None = None  # rollback: switch current to an existing release
    prune_command: tuple[str, ...] | None = None  # prune: remove releases outside the keep set
    confirm: Confirm | None = None  # a generation proven by a batch job (config/confirm.py)

    @property
    def has_install(self) -> bool:
        """The provider offers an install (``--cluster-install``): a plugin always, ``command`` with
        ``install_command``."""
        return self.provider != "command" or self.install_command is not None

    @property
    def build_place(self) -> str:
        if self.update_allocation is not None:
            return "allocation"
        return "build-host" if self.update_host else "login-host"

    def settings(self) -> dict[str, Any]:
        """The profile as plain data, handed to providers."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.update_allocation:
            data["update_allocation"] = {"sbatch_args": list(self.update_allocation.sbatch_args)}
        data["provider_options"] = dict(self.provider_options)
        data["confirm"] = self.confirm.settings() if self.confirm else None
        return data


@dataclass(frozen=True)
class HostConfig:
    """One ``[hosts.H]`` table."""

    name: str
    fleet_role: str
    transport: str = "ssh"
    ssh: str = ""
    canonical_host: str | None = None
    scratch_root: str | None = None
    agent: tuple[str, ...] = ("vq-admin-agent",)
    helper_provider: str = "command"
    helper_update_command: tuple[str, ...] | None = None
    helper_install_command: tuple[str, ...] | None = None
    helper_update_host: str | None = None
    helper_source_repo: str | None = None
    helper_timeout_seconds: float = 7200.0
    runtimes: Mapping[str, RuntimeProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from ..core.agentjudge import AGENTS

        AGENTS.add(tuple(self.agent))  # every call of it is judged before it runs (the transports)


@dataclass(frozen=True)
class Signing:
    """The top-level ``[signing]`` table (CONTRACT section 12): the driver signs the host's record entries
    with *key* (a private key file, or a public key whose private half is in ssh-agent) and accepts the
    entries *allowed_signers* accepts."""

    key: str
    allowed_signers: str


@dataclass(frozen=True)
class Config:
    path: str | None
    ssh_config: str | None
    hosts: Mapping[str, HostConfig]
    signing: Signing | None = None

    def provider_names(self) -> list[str]:
        """Every provider a profile or helper selects, in first-use order."""
        return list(dict.fromkeys(name for host in self.hosts.values()
                                  for name in [host.helper_provider, *(p.provider for p in host.runtimes.values())]))


# -- reading ----------------------------------------------------------------------


def check_ssh_config(config: "Config") -> None:
    """Refuse (exit 77) an ``ssh_config`` another user could change, or one that Includes such a file
    or names such a program: ssh runs its ``Match exec``, ``ProxyCommand``, ``LocalCommand`` and
    ``KnownHostsCommand`` as the administrator (:func:`~vq_admin.core.sshconfig.text_problem`; what
    it loads for each destination is judged before ssh runs, :mod:`vq_admin.ssh.effective`)."""
    if config.ssh_config is None:
        return
    from ..core.sshconfig import text_problem
    from ..report.outcome import Refused

    if not os.path.lexists(config.ssh_config):
        raise ConfigError("ssh_config", f"{config.ssh_config} does not exist")
    if not os.path.isfile(config.ssh_config):
        raise ConfigError("ssh_config", f"{config.ssh_config} is not a regular file")
    problem = text_problem(config.ssh_config)
    if problem:
        raise Refused(f"{problem}; ssh runs the programs an ssh_config names (Match exec, ProxyCommand, "
                      "LocalCommand, KnownHostsCommand) as you; refusing it")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate the configuration; raise :class:`ConfigError` on any fault
    (and :class:`~vq_admin.report.outcome.Refused` for an ``ssh_config`` others can change)."""
    from ..core.bounds import InputError, read_config

    chosen = os.fspath(path) if path else paths.config_path()
    try:
        data = read_config(chosen)
    except InputError as exc:
        raise ConfigError("", str(exc)) from None
    config = parse_config(data, chosen)
    check_ssh_config(config)
    return config


def parse_config(data: Mapping[str, Any], path: str | None = None) -> Config:
    _only_keys(data, "", {"ssh_config", "hosts", "signing"})
    ssh_config = _abs_path(data, "ssh_config", "")
    signing = None
    if "signing" in data:
        table = data["signing"]
        if not isinstance(table, dict):
            raise ConfigError("signing", "must be a table with key and allowed_signers")
        _only_keys(table, "signing", {"key", "allowed_signers"})
        key, allowed = _abs_path(table, "key", "signing"), _abs_path(table, "allowed_signers", "signing")
        if key is None or allowed is None:
            raise ConfigError("signing", "needs both key and allowed_signers (absolute paths)")
        signing = Signing(key=key, allowed_signers=allowed)
    hosts_raw = data.get("hosts", {})
    if not isinstance(hosts_raw, dict):
        raise ConfigError("hosts", "must be a table of host tables")
    hosts = {name: _parse_host(name, table) for name, table in hosts_raw.items()}
    for name, host in hosts.items():
        if host.fleet_role == "alias":
            target = hosts.get(host.canonical_host or "")
            if target is None:
                raise ConfigError(f"hosts.{name}.canonical_host",
                                  f"names {host.canonical_host!r}, which is not a host in this file")
            if target.fleet_role == "alias":
                raise ConfigError(f"hosts.{name}.canonical_host", f"names {target.name!r}, which is itself an alias")
    return Config(path=path, ssh_config=ssh_config, hosts=hosts, signing=signing)


#: The keys of a host table and of a profile table: the records' fields, as the file spells them.
HOST_KEYS = {f.name for f in fields(HostConfig)} - {"name", "runtimes"} | {"scheduler_runtime_deployments", "scheduler"}
PROFILE_KEYS = {f.name for f in fields(RuntimeProfile)} - {"program", "confirm"} | CONFIRM_KEYS


def _check_profiles_fit(host: HostConfig, key: str) -> None:
    """What the host's profiles ask of the host: an ssh destination git can use for a fed mirror, a
    ``scratch_root`` Slurm can write transcripts below for an allocation."""
    profiles = host.runtimes.values()  # each named in messages by the first of their programs, sorted
    fed = sorted(p.program for p in profiles if p.feed_source_mirror is not None)
    if fed and host.transport == "ssh" and ":" in host.ssh:  # DESTINATION_RE (and NAME_RE) admit no '/'
        raise ConfigError(f"{key}.ssh", f"{host.ssh!r} contains ':' or '/', which git cannot use in the url of the "
                                        f"mirror profile {fed[0]} feeds; use a Host alias in ssh_config")
    allocated = sorted(p.program for p in profiles if p.update_allocation is not None or p.confirm is not None)
    if not allocated:
        return
    if host.scratch_root is None:
        raise ConfigError(f"{key}.scratch_root", f"is required: profile {allocated[0]} sets update_allocation or "
                                                 "confirm_command, whose transcripts live below scratch_root")
    if "%" in host.scratch_root or "\\" in host.scratch_root:
        raise ConfigError(f"{key}.scratch_root", "must not contain '%' or '\\' with update_allocation "
                                                 "(Slurm expands them in --output/--error file names)")


def _parse_host(name: str, table: Any) -> HostConfig:
    key = f"hosts.{name}"
    _named_table(name, table, key, "host name", HOST_KEYS)
    if "fleet_role" not in table:
        raise ConfigError(f"{key}.fleet_role", f"is required (one of {', '.join(ROLES)}); there is no default")
    role = _choice(table, "fleet_role", key, ROLES)
    if (role == "alias") != ("canonical_host" in table):  # an alias names its canonical host, nothing else does
        raise ConfigError(f"{key}.canonical_host", "is required when fleet_role is \"alias\"" if role == "alias"
                          else "is only allowed when fleet_role is \"alias\"")
    profiles_raw = table.get("scheduler_runtime_deployments", {})
    if not isinstance(profiles_raw, dict):
        raise ConfigError(f"{key}.scheduler_runtime_deployments", "must be a table of program tables")
    runtimes = {p: _parse_profile(p, t, f"{key}.scheduler_runtime_deployments.{p}") for p, t in profiles_raw.items()}
    if "helper_update_host" in table and "helper_update_command" not in table:
        raise ConfigError(f"{key}.helper_update_host", "is set but helper_update_command is not")
    _choice(table, "scheduler", key, SCHEDULERS, "slurm")  # an old file may say so; another scheduler is refused
    host = HostConfig(
        name=name,
        fleet_role=role,
        transport=_choice(table, "transport", key, TRANSPORTS, "ssh"),
        ssh=_destination(table, "ssh", key) or name,
        canonical_host=_str(table, "canonical_host", key),
        scratch_root=_abs_path(table, "scratch_root", key),
        agent=parse_command(table, "agent", key) or ("vq-admin-agent",),
        helper_provider=_provider_name(table, "helper_provider", key),
        helper_update_command=parse_command(table, "helper_update_command", key),
        helper_install_command=parse_command(table, "helper_install_command", key),
        helper_update_host=_destination(table, "helper_update_host", key),
        helper_source_repo=_abs_path(table, "helper_source_repo", key),
        helper_timeout_seconds=_timeout(table, "helper_timeout_seconds", key, 7200.0),
        runtimes=runtimes,
    )
    _check_profiles_fit(host, key)
    return host


def _provider_options(table: Mapping[str, Any], key: str, provider: str) -> dict[str, str]:
    """The profile's ``provider_options`` (one-line strings, for a plugin provider only); the command provider
    needs ``update_command`` and ``verify_command`` instead."""
    options = table.get("provider_options", {})
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise ConfigError(f"{key}.provider_options", "must be a table of strings")
    for opt_key, opt_value in options.items():
        if "\0" in opt_value or "\n" in opt_value:
            raise ConfigError(f"{key}.provider_options.{opt_key}", "must be one line")
        _bounded(opt_value, f"{key}.provider_options.{opt_key}")
    if provider == "command":
        if options:
            raise ConfigError(f"{key}.provider_options", "is only for plugin providers; provider is \"command\"")
        for required in ("update_command", "verify_command"):
            if required not in table:
                raise ConfigError(f"{key}.{required}", "is required with provider = \"command\"")
    return dict(options)


def _parse_profile(program: str, table: Any, key: str) -> RuntimeProfile:
    _named_table(program, table, key, "program name", PROFILE_KEYS)
    if "update_host" in table and "update_allocation" in table:
        raise ConfigError(f"{key}.update_allocation",
                          "update_host and update_allocation are mutually exclusive; set one")
    provider = _provider_name(table, "provider", key)
    options = _provider_options(table, key, provider)
    source_repo = _abs_path(table, "source_repo", key)
    if source_repo is None:
        raise ConfigError(f"{key}.source_repo", "is required: the driver-side checkout the exact commit is staged from")
    if "prepare_command" in table and "feed_source_mirror" not in table:
        raise ConfigError(f"{key}.prepare_command", "needs feed_source_mirror (the preparer reads the fed mirror)")
    lane = _str(table, "lane", key) or "main"
    if not BRANCH_RE.match(lane):
        raise ConfigError(f"{key}.lane", f"{lane!r} is not a branch name this tool will feed (git "
                                         "check-ref-format --branch rules, a letter or digit first, and never HEAD)")
    return RuntimeProfile(
        program=program,
        provider=provider,
        update_command=parse_command(table, "update_command", key),
        install_command=parse_command(table, "install_command", key),
        verify_command=parse_command(table, "verify_command", key),
        update_host=_destination(table, "update_host", key),
        update_allocation=_allocation(table, key),
        timeout_seconds=_timeout(table, "timeout_seconds", key, 14400.0),
        verify_timeout_seconds=_timeout(table, "verify_timeout_seconds", key, 600.0),
        source_repo=source_repo,
        feed_source_mirror=_abs_path(table, "feed_source_mirror", key),
        lane=lane,
        prepare_command=parse_command(table, "prepare_command", key),
        preparer_reads=_choice(table, "preparer_reads", key, PREPARER_READS, "lane"),
        provider_options=options,
        activate_command=parse_command(table, "activate_command", key),
        prune_command=parse_command(table, "prune_command", key),
        confirm=_confirm(table, key),
    )


# -- single-value rules -----------------------------------------------------------


def _where(key: str, name: str) -> str:
    """The dotted key of *name* in the table *key* (the file's top level when empty)."""
    return f"{key}.{name}" if key else name


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to a mistyped *word* (``""`` when none is close)."""
    import difflib  # only for a mistake: not on the cron no-op's way to its first ssh (docs/performance.md)

    close = difflib.get_close_matches(word, sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _only_keys(table: Mapping[str, Any], key: str, allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(_where(key, k), "unknown key" + did_you_mean(k, allowed))


def _named_table(name: str, table: object, key: str, what: str, allowed: set[str]) -> None:
    """*table* (the host or profile *name*, at *key*) is a table of *allowed* keys; *name* a name."""
    if not NAME_RE.match(name):
        raise ConfigError(key, f"{what} {name!r} must match {NAME_RULE}")
    if not isinstance(table, dict):
        raise ConfigError(key, "must be a table")
    _only_keys(table, key, allowed)


def _str(table: Mapping[str, Any], name: str, key: str) -> str | None:
    if name not in table:
        return None
    value = table[name]
    if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
        raise ConfigError(_where(key, name), "must be a non-empty one-line string")
    return _bounded(value, _where(key, name))


def _bounded(value: str, where: str) -> str:
    """*value*, or :class:`ConfigError` when it is longer than :data:`MAX_STRING` characters."""
    if len(value) > MAX_STRING:
        raise ConfigError(where, f"is {len(value)} characters long; at most {MAX_STRING} are accepted")
    return value


def _choice(table: Mapping[str, Any], name: str, key: str, allowed: tuple[str, ...], default: str | None = None) -> str:
    value = table.get(name, default)
    if value not in allowed:
        raise ConfigError(f"{key}.{name}", f"must be one of {', '.join(allowed)}, not {value!r}")
    return str(value)


def _provider_name(table: Mapping[str, Any], name: str, key: str) -> str:
    value = table.get(name, "command")
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ConfigError(f"{key}.{name}",
                          "must be \"command\" or the entry-point name of an installed provider plugin")
    return value


def _destination(table: Mapping[str, Any], name: str, key: str) -> str | None:
    value = _str(table, name, key)
    if value is not None and not DESTINATION_RE.match(value):
        raise ConfigError(f"{key}.{name}",
                          f"{value!r} is not an ssh destination (letters, digits, _.@:+%-; not starting with '-')")
    return value


def _abs_path(table: Mapping[str, Any], name: str, key: str) -> str | None:
    value = _str(table, name, key)
    if value is None:
        return None
    where = _where(key, name)
    if not value.startswith("/"):
        raise ConfigError(where, f"must be an absolute path, not {value!r}")
    if ".." in value.split("/"):  # its parts, as PurePosixPath's (pathlib is not imported before the first ssh)
        raise ConfigError(where, "must not contain '..'")
    return os.path.normpath(value)


def parse_command(table: Mapping[str, Any], name: str, key: str) -> tuple[str, ...] | None:
    """*table*'s command line *name* as words (``None`` when unset); a fault names :func:`_where` it is."""
    value = table.get(name)
    if value is None:
        return None
    where = _where(key, name)
    if not isinstance(value, str) or "\n" in value or "\r" in value or "\0" in value:
        raise ConfigError(where, "must be a command on one line (a string)")
    _bounded(value, where)
    try:
        words = shlex.split(value, posix=True)
    except ValueError as exc:
        raise ConfigError(where, f"cannot be split into words: {exc}") from None
    if not words or not words[0]:
        raise ConfigError(where, "must not be empty")
    if words[0].startswith("-"):
        raise ConfigError(where, f"the command word {words[0]!r} starts with '-', which would be read as an "
                                 "option; name the program (a path or a name on PATH)")
    if "=" in words[0]:
        raise ConfigError(where, f"the command word {words[0]!r} contains '=', which env(1) would take for a "
                                 "variable assignment; name the program without '=' (rename it or use a symlink)")
    return tuple(words)


def _finite(value: object) -> TypeGuard[float]:
    """*value* is a finite TOML number (an integer or a float; a boolean is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _timeout(table: Mapping[str, Any], name: str, key: str, default: float) -> float:
    value = table.get(name, default)
    if not _finite(value) or not 0 < value <= MAX_TIMEOUT:
        raise ConfigError(f"{key}.{name}",
                          f"must be a finite positive number of seconds (at most {int(MAX_TIMEOUT)}), not {value!r}")
    return float(value)


def _confirm(table: Mapping[str, Any], key: str) -> Confirm | None:
    """The profile *table*'s confirmation (``None`` without ``confirm_command``); errors name the dotted key."""
    command = parse_command(table, "confirm_command", key)
    if command is None:
        stray = sorted(CONFIRM_KEYS & set(table))
        if stray:
            raise ConfigError(f"{key}.{stray[0]}", "needs confirm_command")
        return None
    if "activate_command" not in table and table.get("provider", "command") == "command":
        raise ConfigError(f"{key}.confirm_command", "needs activate_command (a failed confirmation is reverted by "
                                                    "re-activating the previous generation; a plugin "
                                                    "provider's activate hook serves)")
    args = _sbatch_args(table.get("confirm_sbatch_args", []), f"{key}.confirm_sbatch_args")
    raw = table.get("confirm_metrics", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}.confirm_metrics", "must be a table of { better = \"lower\"|\"higher\"|\"equal\", "
                                                    "tolerance = 0.10 }")
    metrics = tuple(_metric(name, spec, f"{key}.confirm_metrics.{name}") for name, spec in raw.items())
    return Confirm(command=command, sbatch_args=args,
                   timeout_seconds=_timeout(table, "confirm_timeout_seconds", key, 900.0), metrics=metrics)


def _metric(name: str, spec: object, where: str) -> Metric:
    """One ``confirm_metrics`` entry: how the metric *name* may move (``better``, ``tolerance``)."""
    if not ENV_NAME_RE.match(name):
        raise ConfigError(where, "a metric name is letters, digits and '_' (as VQ-DEPLOY-METRIC lines name it)")
    if not isinstance(spec, dict) or set(spec) - {"better", "tolerance"} or spec.get("better") not in BETTER:
        raise ConfigError(where, "must be { better = \"lower\"|\"higher\"|\"equal\", tolerance = 0.10 }")
    tol = spec.get("tolerance", 0.0)
    if not _finite(tol) or not 0 <= tol < 1:
        raise ConfigError(f"{where}.tolerance", f"must be a relative tolerance from 0 to below 1, not {tol!r}")
    return Metric(name, spec["better"], float(tol))


def _sbatch_args(args: object, where: str) -> tuple[str, ...]:
    """A list of sbatch arguments, each through the allow-list, read the way sbatch's getopt_long reads it
    (:mod:`vq_admin.config.sbatch_args`)."""
    from .sbatch_args import sbatch_arg_problem

    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(where, "must be a list of strings")
    for arg in args:
        problem = sbatch_arg_problem(arg)
        if problem:
            raise ConfigError(where, problem)
    return tuple(args)


def _allocation(table: Mapping[str, Any], key: str) -> Allocation | None:
    if "update_allocation" not in table:
        return None
    where = f"{key}.update_allocation"
    value = table["update_allocation"]
    if not isinstance(value, dict):
        raise ConfigError(where, "must be a table such as { sbatch_args = [\"--time=04:00:00\"] }")
    _only_keys(value, where, {"sbatch_args"})
    return Allocation(sbatch_args=_sbatch_args(value.get("sbatch_args", []), f"{where}.sbatch_args"))
