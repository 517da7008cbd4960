"""The vq-admin provider: turns a runtime request into a ``vq-site-example`` argv.

Selected in the operator configuration with ``provider = "site_example"``
(entry point ``site_example`` in the group ``vq_admin.providers``) and
configured by the profile's ``provider_options`` table::

    [hosts.cluster.scheduler_runtime_deployments.vibeqc-release]
    provider = "site_example"
    provider_options = { root = "/apps/vibeqc", command = "/site/bin/vq-site-example" }

* ``root`` (required): absolute runtime root on the target hosts;
* ``command`` (optional, default ``vq-site-example``): the console script on
  the target hosts; an absolute path is recommended so ``PATH`` on a
  non-interactive ssh session does not decide what runs.

Only the runtime hooks are implemented (update, install, verify, activate
for ``vq admin rollback`` and prune for ``vq admin prune``); the helper lane hooks are left to a
separate helper provider, so a profile using this provider for the helper
lane is refused by vq-admin (exit 2) before anything runs.

This module runs inside vq-admin: it imports ``vq_admin_hookspecs`` only and
never executes anything itself.
"""

from __future__ import annotations

from typing import Any, Mapping

from vq_admin_hookspecs import ProviderCommand, PruneRequest, RuntimeRequest, hookimpl

DEFAULT_COMMAND = "vq-site-example"
#: The ``provider_options`` keys this provider takes; any other is a typo (exit 2, naming it).
OPTIONS = ("root", "command")


def _options(settings: Mapping[str, Any]) -> tuple[str, str]:
    """``(command, root)`` from ``settings["provider_options"]`` (a table of strings: vq-admin's configuration
    checks that); ValueError when invalid."""
    options: Mapping[str, str] = settings.get("provider_options") or {}
    for key in options:
        if key not in OPTIONS:
            raise ValueError(f"provider_options.{key}: unknown key; site_example takes {', '.join(OPTIONS)}")
    root = options.get("root")
    if root is None or not root.startswith("/") or "\0" in root or "\n" in root:
        raise ValueError(f"provider_options.root must be the absolute path of the runtime root "
                         f"on the target host (got {root!r})")
    command = options.get("command", DEFAULT_COMMAND)
    if not command or command != command.strip():
        raise ValueError(f"provider_options.command must be a non-empty path without surrounding "
                         f"whitespace (got {command!r})")
    return command, root


def build_argv(verb: str, request: RuntimeRequest) -> list[str]:
    """The exact argv for *verb* (``deploy``, ``install``, ``verify`` or ``activate``).

    ``[command, verb, "--root", root, *update_script_args, "--program", P, "--expected-sha", SHA,
    ["--tag", T], ["--source-archive", PATH]]``; only deploy and install take the script args and archive.
    """
    command, root = _options(request.settings)
    builds = verb in ("deploy", "install")
    argv = [command, verb, "--root", root, *(request.update_script_args if builds else ())]
    argv += ["--program", request.program, "--expected-sha", request.expected_sha]
    if request.tag is not None:
        argv += ["--tag", request.tag]
    if builds and request.source_archive is not None:
        argv += ["--source-archive", request.source_archive]
    return argv


@hookimpl
def vq_admin_runtime_update(request: RuntimeRequest) -> ProviderCommand:
    """Build, validate and activate ``request.expected_sha`` under ``root``."""
    return ProviderCommand(argv=tuple(build_argv("deploy", request)))


@hookimpl
def vq_admin_runtime_install(request: RuntimeRequest) -> ProviderCommand:
    """First-time installation: as update, creating the root layout if missing."""
    return ProviderCommand(argv=tuple(build_argv("install", request)))


@hookimpl
def vq_admin_runtime_verify(request: RuntimeRequest) -> ProviderCommand:
    """Read-only: print the verify receipt of what is active under ``root``."""
    return ProviderCommand(argv=tuple(build_argv("verify", request)))


@hookimpl
def vq_admin_runtime_activate(request: RuntimeRequest) -> ProviderCommand:
    """Rollback: switch ``current`` to the existing release (atomic rename); builds nothing."""
    return ProviderCommand(argv=tuple(build_argv("activate", request)))


@hookimpl
def vq_admin_runtime_prune(request: PruneRequest) -> ProviderCommand:
    """Remove full-SHA release directories outside ``request.keep`` (never current's target)."""
    command, root = _options(request.settings)
    keep = request.keep_words("--keep")  # the keep set's list slot, filled when the prune runs
    return ProviderCommand(argv=(command, "prune", "--root", root, "--program", request.program, *keep))
