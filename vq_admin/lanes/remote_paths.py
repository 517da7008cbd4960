"""Command files on remote hosts: the secure-path rule, checked where they run.

Before the first provider command of a runtime update runs on a login or
build host reached over ssh, the plan has one ``check-commands`` step per
such host::

    AGENT... check-paths -- WORD...

``WORD...`` are the absolute words of every configured command that will run
there (interpreter and script alike: ``/bin/bash /site/deploy.sh`` checks
both), and of the agent itself.  The agent checks each with the secure-path
rule (:mod:`vq_admin.agent.securepath`) on that host and exits 4 when one, or
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

import json
from typing import TYPE_CHECKING, Any, Iterable, NoReturn

from ..outcome import Refused, VqAdminError
from ..plan import execute
from ..transport import SshTransport, Transport

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate

CHECK_TIMEOUT = 120.0
#: The agent's exit status for "an unsafe path was refused".
AGENT_UNSAFE = 4


def absolute_words(words: Iterable[str]) -> list[str]:
    return [w for w in words if w.startswith("/")]


def leading_words(argv: Iterable[str]) -> list[str]:
    """A plugin's command words: its argv up to the first option."""
    found = []
    for word in argv:
        if word.startswith("-"):
            break
        found.append(word)
    return found


def _profile_words(update: "RuntimeUpdate", key: str, argv: Iterable[str]) -> list[str]:
    p = update.profile
    if p.provider == "command":
        return list(getattr(p, key) or ())
    return leading_words(argv)


def command_words(update: "RuntimeUpdate") -> list[tuple[Transport, list[tuple[str, str]]]]:
    """``[(transport, [(config key, absolute word), ...]), ...]`` for every ssh host of this update."""
    ctx, host, p = update.ctx, update.host, update.profile
    prefix = f"hosts.{host.name}"
    profile_key = f"{prefix}.scheduler_runtime_deployments.{p.program}"
    login, build = ctx.login(host), update.build_transport()
    places: dict[str, tuple[Transport, list[tuple[str, str]]]] = {}

    def add(transport: Transport, key: str, words: Iterable[str]) -> None:
        if not isinstance(transport, SshTransport):
            return
        entry = places.setdefault(transport.where, (transport, []))
        for word in absolute_words(words):
            if (key, word) not in entry[1]:
                entry[1].append((key, word))

    verify = ctx.providers.runtime_verify(p.provider, update.request(archive=None))
    add(login, f"{prefix}.agent", host.agent)
    add(login, f"{profile_key}.verify_command", _profile_words(update, "verify_command", verify.argv))
    if p.prepare_command:
        add(login, f"{profile_key}.prepare_command", p.prepare_command)
    key = "install_command" if ctx.options.cluster_install else "update_command"
    deploy = update.deploy_command("<stage>/source.tar")
    target = login if p.update_allocation is not None else build
    add(target, f"{prefix}.agent", host.agent)
    add(target, f"{profile_key}.{key}", _profile_words(update, key, deploy.argv))
    return [entry for entry in places.values() if entry[1]]


def step_name(index: int) -> str:
    return "check-commands" if index == 0 else f"check-commands-{index + 1}"


def check_argv(update: "RuntimeUpdate", words: list[tuple[str, str]]) -> list[str]:
    seen: list[str] = []
    for _key, word in words:
        if word not in seen:
            seen.append(word)
    return [*update.host.agent, "check-paths", "--", *seen]


def plan(update: "RuntimeUpdate") -> None:
    """Add one ``check-commands`` step per ssh host that runs a configured command."""
    for index, (transport, words) in enumerate(command_words(update)):
        update.receipt.plan.add(step_name(index), transport.where, check_argv(update, words),
                                "read-only: every command file that runs here, and every directory above it, "
                                "can be changed by nobody but you and root")


def run(update: "RuntimeUpdate", done: str | None = None) -> None:
    """Run the checks; refuse (77) before any provider command runs on a host that fails them.
    *done* names the host whose check already ran in the run's first agent call (:mod:`.first_call`)."""
    for index, (transport, words) in enumerate(command_words(update)):
        if transport.where == done:
            continue
        step = update.receipt.plan.get(step_name(index))
        result = execute(step, transport, check_argv(update, words), timeout=CHECK_TIMEOUT)
        if result.ok:
            continue
        if result.interrupted:
            raise VqAdminError(f"{step.name}: {result.describe()}; no configured command was run")
        if result.exit_code == AGENT_UNSAFE:
            try:
                refused = json.loads(result.text()).get("refused") or []
            except (ValueError, AttributeError):
                refused = []
            refuse(transport.where, words, refused, result.error_text()[-500:])
        raise Refused(f"{step.name}: the helper on {transport.where} could not check the command files "
                      f"({result.describe()}: {result.error_text()[-300:]}); update the helper "
                      f"(vq admin update {update.host.name}) and rerun; nothing was run")


def refuse(where: str, words: list[tuple[str, str]], refused: list[Any], fallback: str) -> NoReturn:
    """Refuse (77) naming each refused path's configuration keys and its problem."""
    lines = []
    for item in refused if isinstance(refused, list) else []:
        if not isinstance(item, dict):
            continue
        keys = sorted({k for k, w in words if w == item.get("path")}) or ["a configured command"]
        lines.append(f"{', '.join(keys)}: {item.get('problem')}")
    detail = "; ".join(lines) or fallback
    raise Refused(f"refused on {where}: {detail}; nothing was run there")
