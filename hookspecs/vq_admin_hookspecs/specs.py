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

Each hook is called **once per run, when vq-admin makes the plan**, before
anything runs; the command it returns is the one the plan shows and the one
that runs.  Request fields whose value only the run produces (the staged
archive, the stage directory, the stage's tree digest) hold a
:class:`~.slots.Slot` marker such as ``<stage>/source.tar``, placed unchanged
and filled by vq-admin just before the command runs (see :mod:`.slots`).

Hook phases in order of one runtime update: verify (read-only, "already
current?"), update or install, verify again.  One helper update: helper update
or helper install; the helper's identity is then read back by vq-admin itself.
"""

from __future__ import annotations

from .markers import hookspec
from .records import HelperRequest, ProviderCommand, PruneRequest, RuntimeRequest

# -- runtime lane -----------------------------------------------------------------


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
    """


@hookspec(firstresult=True)
def vq_admin_runtime_update(request: RuntimeRequest) -> ProviderCommand | None:
    """Build and activate ``request.expected_sha`` of ``request.program``.

    :param request: the program, host, full SHA, tag (``None`` when none),
        the operator's ``--update-script-arg`` values in order, the verified
        ``source_archive`` path on the host the command will run on (a
        :class:`~.slots.Slot`, text ``<stage>/source.tar``: place it, do not
        inspect it), ``where``
        (``"build-host"``, ``"login-host"`` or ``"allocation"``) and the
        profile ``settings``.
    :returns: the command to run. It must build a *separate immutable*
        runtime for the SHA, validate it, and only then switch the stable
        link; it must never remove or rewrite an older release or launcher.
        Its exit status is the deployment's exit status.
    """


@hookspec(firstresult=True)
def vq_admin_runtime_install(request: RuntimeRequest) -> ProviderCommand | None:
    """First-time (cluster) installation, selected by ``--cluster-install``.

    Same request, same obligations and same evidence as
    :func:`vq_admin_runtime_update`.
    """


# -- generations: rollback and prune ----------------------------------------------


@hookspec(firstresult=True)
def vq_admin_runtime_activate(request: RuntimeRequest) -> ProviderCommand | None:
    """Switch the stable link of ``request.program`` to the existing, already
    built release of ``request.expected_sha`` (``vq admin rollback``).

    :param request: as for update, but ``source_archive`` is ``None`` and
        ``update_script_args`` is empty: nothing is staged and nothing is
        built.  ``where`` is ``"build-host"`` or ``"login-host"`` (where the
        update runs; never ``"allocation"``).
    :returns: the command, or ``None`` when the provider cannot activate
        (vq-admin then rolls back by running the provider's update for the
        target). It must switch ``current`` atomically (a temporary link
        renamed over it, never remove-then-create), must not build, rewrite
        or remove any release or launcher, and must fail (non-zero) when the
        release is missing, incomplete or records another program, SHA or
        tag. Success is decided by the read-only verify that follows.
    """


@hookspec(firstresult=True)
def vq_admin_runtime_prune(request: PruneRequest) -> ProviderCommand | None:
    """Remove releases of ``request.program`` that are not in ``request.keep``
    (``vq admin prune``), on the scheduler login host.

    :param request: the program, host, the keep set and the profile
        ``settings``.  The hook is asked once, when the plan is made, before
        the census: ``request.keep`` is then the list slot
        ``[<kept sha>]...`` (:mod:`.slots`), filled with the keep set (full
        lower-case SHAs; never empty) when the command runs.  Place it exactly
        once with ``*request.keep_words("--keep")`` (``--keep SHA`` per kept
        SHA); never iterate it.
    :returns: the command, or ``None`` when the provider cannot prune (the
        run then exits 2 naming ``prune_command``). Its stdout must be
        exactly one JSON object, the prune report, parsed by
        :meth:`~.records.PruneReport.parse`:
        ``{"removed": [sha, ...], "kept": [sha, ...]}``. It may remove only
        per-SHA releases outside ``keep``, never the target of ``current``,
        and must never follow a symbolic link. vq-admin afterwards proves the
        active identity again and re-hashes every kept launcher; a kept
        release that is gone or changed fails the run.
    """


# -- helper lane ------------------------------------------------------------------


@hookspec(firstresult=True)
def vq_admin_helper_update(request: HelperRequest) -> ProviderCommand | None:
    """Install the staged scheduler-side helper on ``request.host``.

    :param request: the host, the full SHA, the expected SHA-256 tree digest
        (``expected_tree_sha256``, the slot ``<tree_sha256>``), the verified
        ``stage_dir`` (the slot ``<stage>``) and the operator's
        ``--update-script-arg`` values; place the two slots, never inspect
        them (:mod:`.slots`). vq-admin also exports ``VQ_HELPER_STAGE``,
        ``VQ_HELPER_EXPECTED_SHA`` and ``VQ_HELPER_EXPECTED_TREE_SHA256``.
    :returns: the command. It must install out of place and switch
        atomically; it must never rebuild scientific software. Success is
        decided afterwards by reading back the live helper's identity, not
        by this command's exit status alone.
    """


@hookspec(firstresult=True)
def vq_admin_helper_install(request: HelperRequest) -> ProviderCommand | None:
    """First-time helper installation, selected by ``--cluster-install``.

    Same request and obligations as :func:`vq_admin_helper_update`.
    """


#: Every hook name, in lifecycle order (the order of the specifications above; ``vq admin providers``).
HOOK_NAMES = tuple(name for name in tuple(globals()) if name.startswith("vq_admin_"))
