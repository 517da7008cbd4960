"""The built-in ``command`` provider: run the commands a profile configures.

Argv shapes (CONTRACT section 4):

* update / install: ``<command words> <--update-script-arg values> --program P
  --expected-sha SHA [--tag T] [--source-archive PATH]``
* verify: ``<command words> --program P --expected-sha SHA [--tag T]``
* activate (rollback): ``<activate_command words> --program P --expected-sha SHA [--tag T]``
* prune: ``<prune_command words> --program P --keep SHA [--keep SHA]...``
* helper update / install: ``<command words> <--update-script-arg values>``;
  vq-admin exports ``VQ_HELPER_STAGE``, ``VQ_HELPER_EXPECTED_SHA`` and
  ``VQ_HELPER_EXPECTED_TREE_SHA256`` for every helper command.
"""

from __future__ import annotations

from typing import Any, Mapping

from vq_admin_hookspecs import HelperRequest, ProviderCommand, PruneRequest, RuntimeRequest, hookimpl


def _words(settings: Mapping[str, Any], key: str) -> tuple[str, ...]:
    words = settings.get(key)
    if not words:
        raise ValueError(f"{key} is not configured")
    return tuple(words)


def _identity_args(request: RuntimeRequest) -> list[str]:
    args = ["--program", request.program, "--expected-sha", request.expected_sha]
    if request.tag is not None:
        if request.tag.startswith("-") or not request.tag:  # never an option in disguise (CONTRACT 4 keeps "--tag T")
            raise ValueError(f"tag {request.tag!r} is not a valid tag name")
        args += ["--tag", request.tag]
    return args


def _build(request: RuntimeRequest, key: str) -> ProviderCommand:
    argv = [*_words(request.settings, key), *request.update_script_args, *_identity_args(request)]
    if request.source_archive is not None:
        argv += ["--source-archive", request.source_archive]
    return ProviderCommand(argv=tuple(argv))


@hookimpl
def vq_admin_runtime_update(request: RuntimeRequest) -> ProviderCommand:
    return _build(request, "update_command")


@hookimpl
def vq_admin_runtime_install(request: RuntimeRequest) -> ProviderCommand:
    return _build(request, "install_command")


@hookimpl
def vq_admin_runtime_verify(request: RuntimeRequest) -> ProviderCommand:
    return ProviderCommand(argv=(*_words(request.settings, "verify_command"), *_identity_args(request)))


@hookimpl
def vq_admin_runtime_activate(request: RuntimeRequest) -> ProviderCommand | None:
    """``None`` without ``activate_command``: rollback then runs the update for the target."""
    words = request.settings.get("activate_command")
    if not words:
        return None
    return ProviderCommand(argv=(*words, *_identity_args(request)))


@hookimpl
def vq_admin_runtime_prune(request: PruneRequest) -> ProviderCommand | None:
    """``None`` without ``prune_command``: ``vq admin prune`` exits 2 naming it."""
    words = request.settings.get("prune_command")
    if not words:
        return None
    keep = request.keep_words("--keep")  # the keep set's list slot, filled when the prune runs
    return ProviderCommand(argv=(*words, "--program", request.program, *keep))


@hookimpl
def vq_admin_helper_update(request: HelperRequest) -> ProviderCommand:
    return ProviderCommand(argv=(*_words(request.settings, "helper_update_command"), *request.update_script_args))


@hookimpl
def vq_admin_helper_install(request: HelperRequest) -> ProviderCommand:
    return ProviderCommand(argv=(*_words(request.settings, "helper_install_command"), *request.update_script_args))
