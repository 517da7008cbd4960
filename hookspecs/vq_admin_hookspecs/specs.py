"""Hook specifications: the provider contract of vq-admin.

A provider answers each operation with a :class:`~.records.ProviderCommand`:
the exact argv vq-admin will run.  vq-admin, not the provider, decides where
it runs (the fixed build host, the login host, or inside a Slurm allocation),
applies the profile's timeout, keeps the exit status exactly, reads metrics
(``VQ-DEPLOY-METRIC name=value`` lines) and checks the evidence.  This keeps
``--dry-run`` honest: the plan shows every command a provider will run.

Dispatch rules, for every hook below:

* a profile names exactly one provider; vq-admin calls the hook on that
  provider only (other loaded providers are never consulted);
* every hook is ``firstresult``: "Stops at first non-None result";
* a provider that returns ``None`` for a hook it implements, or does not
  implement the hook at all, makes the operation unavailable for that
  profile: the run exits 2 (usage) naming the provider and the hook, before
  anything runs;
* a return value that is not a :class:`~.records.ProviderCommand` is a
  provider error: the run exits 2 naming the provider and the hook.

Hook phases in order of one runtime update: verify (read-only, "already
current?"), update or install, verify again.  One helper update: helper update
or helper install; the helper's identity is then read back by vq-admin itself.
"""

from __future__ import annotations

from .markers import hookspec
from .records import HelperRequest, ProviderCommand, RuntimeRequest

# -- runtime lane -----------------------------------------------------------------


@hookspec(firstresult=True)
def vq_admin_runtime_update(request: RuntimeRequest) -> ProviderCommand | None:
    """Build and activate ``request.expected_sha`` of ``request.program``.

    :param request: the program, host, full SHA, tag (``None`` when none),
        the operator's ``--update-script-arg`` values in order, the verified
        ``source_archive`` path on the host the command will run on, ``where``
        (``"build-host"``, ``"login-host"`` or ``"allocation"``) and the
        profile ``settings``.
    :returns: the command to run. It must build a *separate immutable*
        runtime for the SHA, validate it, and only then switch the stable
        link; it must never remove or rewrite an older release or launcher.
        Its exit status is the deployment's exit status.

    Stops at first non-None result.
    """


@hookspec(firstresult=True)
def vq_admin_runtime_install(request: RuntimeRequest) -> ProviderCommand | None:
    """First-time (cluster) installation, selected by ``--cluster-install``.

    Same request, same obligations and same evidence as
    :func:`vq_admin_runtime_update`.

    Stops at first non-None result.
    """


@hookspec(firstresult=True)
def vq_admin_runtime_verify(request: RuntimeRequest) -> ProviderCommand | None:
    """A read-only command, run on the scheduler login host, that reports the
    active runtime of ``request.program``.

    :param request: as for update; ``source_archive`` is ``None`` and
        ``where`` is ``"login-host"``.
    :returns: the command. Its stdout must be exactly one JSON object, the
        verify receipt, parsed by
        :meth:`~.records.VerifyReceipt.parse`; anything else on stdout fails
        the run. It must describe what *is* active, never echo the request.

    Stops at first non-None result.
    """


# -- helper lane ------------------------------------------------------------------


@hookspec(firstresult=True)
def vq_admin_helper_update(request: HelperRequest) -> ProviderCommand | None:
    """Install the staged scheduler-side helper on ``request.host``.

    :param request: the host, the full SHA, the expected SHA-256 tree digest,
        the verified ``stage_dir`` and the operator's ``--update-script-arg``
        values. vq-admin also exports ``VQ_HELPER_STAGE``,
        ``VQ_HELPER_EXPECTED_SHA`` and ``VQ_HELPER_EXPECTED_TREE_SHA256``.
    :returns: the command. It must install out of place and switch
        atomically; it must never rebuild scientific software. Success is
        decided afterwards by reading back the live helper's identity, not
        by this command's exit status alone.

    Stops at first non-None result.
    """


@hookspec(firstresult=True)
def vq_admin_helper_install(request: HelperRequest) -> ProviderCommand | None:
    """First-time helper installation, selected by ``--cluster-install``.

    Same request and obligations as :func:`vq_admin_helper_update`.

    Stops at first non-None result.
    """


#: Every hook name, in lifecycle order (used by ``vq admin providers``).
HOOK_NAMES = (
    "vq_admin_runtime_verify",
    "vq_admin_runtime_update",
    "vq_admin_runtime_install",
    "vq_admin_helper_update",
    "vq_admin_helper_install",
)
