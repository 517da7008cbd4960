"""Command files on remote hosts: the secure-path rule, checked where they run.

Before the first provider command of a runtime update runs on a login or
build host reached over ssh, the plan has one ``check-commands`` step per
such host::

    AGENT... check-paths -- WORD...

``WORD...`` are the absolute words of every configured command that will run
there (interpreter and script alike: ``/bin/bash /site/deploy.sh`` checks
both), and of the agent itself.  The agent checks each with the secure-path
rule (:mod:`vq_admin.core.securepath`) on that host and exits 4 when one, or
a directory above it, can be changed by a user other than the operator and
root; the run is then refused (exit 77) naming the configuration key, the
path, its owner and mode and the fix, before anything ran there.

For the built-in ``command`` provider the words are the configured ones; for
a plugin provider they are the words of its argv before the first option.
An allocation's update runs on compute nodes that see the login host's files,
so its words are checked on the login host.  ``transport = "local"`` hosts are
checked by the driver itself (see :mod:`vq_admin.plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, List, NoReturn, Sequence, Tuple

from ..core import exits, protocol
from ..report.outcome import Refused, VqAdminError
from ..plan import Plan, SlotError, execute
from ..ssh.transport import SshTransport, Transport

if TYPE_CHECKING:
    from vq_admin_hookspecs import RuntimeRequest

    from ..config import HostConfig, RuntimeProfile
    from ..context import RunContext
    from .lane import RuntimeLane

CHECK_TIMEOUT = 120.0


def leading_words(argv: Iterable[str]) -> list[str]:
    """A plugin's command words: its argv up to the first option."""
    found: list[str] = []
    for word in argv:
        if word.startswith("-"):
            break
        found.append(word)
    return found


def profile_words(profile: "RuntimeProfile", key: str, argv: Iterable[str]) -> list[str]:
    """The configured words of *key* (built-in ``command`` provider), else the plugin argv's leading words."""
    if profile.provider == "command":
        return list(getattr(profile, key) or ())
    return leading_words(argv)


#: One host's checks: its transport and ``[(config key, absolute word), ...]``.
Place = Tuple[Transport, List[Tuple[str, str]]]


def gather(entries: Iterable[tuple[Transport, str, Iterable[str]]]) -> list[Place]:
    """Group ``(transport, config key, words)`` by ssh host, keeping each absolute word once per key.

    Local hosts are left out: the driver checks every local command itself
    (:func:`vq_admin.plan.refuse_unsafe_command`)."""
    places: dict[str, Place] = {}
    for transport, key, words in entries:
        if not isinstance(transport, SshTransport):
            continue
        entry = places.setdefault(transport.where, (transport, []))
        for word in words:
            if word.startswith("/") and (key, word) not in entry[1]:  # a bare name is found in PATH: not checked
                entry[1].append((key, word))
    return [entry for entry in places.values() if entry[1]]


def command_words(update: "RuntimeLane") -> list[Place]:
    """``[(transport, [(config key, absolute word), ...]), ...]`` for every ssh host of this update."""
    ctx, host, p = update.ctx, update.host, update.profile
    prefix = f"hosts.{host.name}"
    profile_key = f"{prefix}.scheduler_runtime_deployments.{p.program}"
    login, build = ctx.login(host), update.build_transport()
    entries = login_entries(ctx, host, p, update.request(archive=None))
    if p.prepare_command:
        entries.append((login, f"{profile_key}.prepare_command", p.prepare_command))
    if p.feed_source_mirror:  # the feed writes there; its config and hooks are git's to read
        mirror = p.feed_source_mirror.rstrip("/")
        entries.append((login, f"{profile_key}.feed_source_mirror", [mirror, f"{mirror}/config", f"{mirror}/hooks"]))
    key = "install_command" if ctx.options.cluster_install else "update_command"
    deploy = update.planned_deploy()
    target = login if p.update_allocation is not None else build
    entries += [(target, f"{prefix}.agent", host.agent),
                (target, f"{profile_key}.{key}", profile_words(p, key, deploy.argv))]
    return gather(entries)


def login_entries(ctx: "RunContext", host: "HostConfig", profile: "RuntimeProfile",
                  request: "RuntimeRequest") -> list[tuple[Transport, str, Iterable[str]]]:
    """The agent and ``verify_command`` on the login host: every runtime verb runs both there."""
    prefix = f"hosts.{host.name}"
    verify = ctx.providers.runtime_verify(profile.provider, request)
    login = ctx.login(host)
    return [(login, f"{prefix}.agent", host.agent),
            (login, f"{prefix}.scheduler_runtime_deployments.{profile.program}.verify_command",
             profile_words(profile, "verify_command", verify.argv))]


def step_name(index: int, base: str = "check-commands") -> str:
    return base if index == 0 else f"{base}-{index + 1}"


def check_argv(agent: Sequence[str], words: list[tuple[str, str]]) -> list[str]:
    return protocol.check_paths(agent, list(dict.fromkeys(word for _key, word in words)))


PURPOSE = ("read-only: every command file that runs here, and every directory above it, "
           "can be changed by nobody but you and root")


def plan(update: "RuntimeLane") -> None:
    """Add one ``check-commands`` step per ssh host that runs a configured command."""
    plan_places(update.receipt.plan, update.host.agent, command_words(update))


def run(update: "RuntimeLane", done: str | None = None) -> None:
    """Run the checks; refuse (77) before any provider command runs on a host that fails them.
    *done* names the host whose check already ran in the run's first agent call (:mod:`.first_call`)."""
    run_places(update.receipt.plan, update.host.agent, update.host.name, command_words(update), done=done)


def plan_places(steps: Plan, agent: Sequence[str], places: list[Place]) -> None:
    """One ``check-commands`` step per host of *places* (the agent's ``check-paths`` there)."""
    for index, (transport, words) in enumerate(places):
        steps.add(step_name(index), transport.where, check_argv(agent, words), PURPOSE)


def run_places(steps: Plan, agent: Sequence[str], host_name: str, places: list[Place],
               done: str | None = None) -> None:
    """Run the steps :func:`plan_places` added; :class:`Refused` (77) naming the key, the path,
    its owner and mode and the fix when a host fails them (nothing has run there then).
    *done* names a host whose check already ran (it is skipped).  What runs is each step's planned
    argv; *places* only name the configuration keys of a refused path, so a step planned for other
    words than its place's is a defect, refused before anything runs."""
    for index, (transport, words) in enumerate(places):
        if transport.where == done:
            continue
        step = steps.get(step_name(index))
        if step.where != transport.where or step.planned_argv != check_argv(agent, words):
            raise SlotError(f"{step.name}: the planned check is not the check of {transport.where}'s command "
                            "files; the step was not run")
        result = execute(step, transport, timeout=CHECK_TIMEOUT)
        if result.ok:
            continue
        if result.interrupted:
            raise VqAdminError(f"{step.name}: {result.describe()}; no configured command was run: this "
                               "run changed nothing")
        if result.exit_code == exits.EXIT_UNSAFE:
            try:
                refused = protocol.parse_check_paths(result.stdout)["refused"]
            except protocol.ProtocolError:
                refused = []
            refuse(transport.where, words, refused, result.error_text()[-500:])
        raise Refused(f"{step.name}: the helper on {transport.where} could not check the command files "
                      f"({result.describe()}: {result.error_text()[-300:]}); update the helper "
                      f"(vq admin update {host_name}) and rerun; no configured command was run")


def refuse(where: str, words: list[tuple[str, str]], refused: list[Any], fallback: str) -> NoReturn:
    """Refuse (77) naming each refused path's configuration keys and its problem."""
    lines = [f"{', '.join(keys_of(words, item.get('path')))}: {item.get('problem')}"
             for item in refused if isinstance(item, dict)]
    detail = "; ".join(lines) or fallback
    raise Refused(f"refused on {where}: {detail}; no configured command was run there")


def keys_of(words: list[tuple[str, str]], path: object) -> list[str]:
    """The configuration keys that name *path* (for a refusal)."""
    return sorted({k for k, w in words if w == path}) or ["a configured command"]
