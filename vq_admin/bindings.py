"""Exact scheduler execution bindings: the queue driver's per-job check.

A registry SHA describes a runtime when it was inspected; a stable launcher
that follows ``current`` may run another generation after a scheduler wait.
So a named runtime submission may only run an immutable per-SHA launcher that
verified deployment evidence (the registry, :mod:`vq_admin.launcher.registry`)
attests, and everything else fails closed::

    from vq_admin.bindings import LauncherRefused, check_pin, resolve_launcher

    binding = resolve_launcher("vibeqc", "cluster", expected_sha=sha)   # at submission
    pin = binding.pin()                                                 # store with the job
    check_pin(pin)                                                      # again at dispatch

A refusal raises :class:`LauncherRefused` (exit 77 on the command line) with
a machine-readable ``code``, a ``reason`` and a ``remedy``; a malformed
argument raises :class:`BindingUsageError` (a ``ValueError``; exit 2); a host
or program without evidence that the configuration does not name, or a
configuration that cannot be read then, raises ``UsageError`` (exit 2).  No
call ever substitutes another launcher (a bare interpreter included) for a
refused one.

Standard library only, and lazily: the configuration (TOML) is read only to
resolve a host that has no registry evidence under its own name (an alias)
and for ``check_on_host``; ``subprocess`` is imported only for
``check_on_host``.  No pluggy, plumbum, filelock or provider is ever imported.
"""

from __future__ import annotations

import os

from .core.escape import has_control
from .core.plainrecord import PlainRecord
from .launcher import registry
from .core.identifiers import FULL_SHA_RE, NAME_RE, NAME_RULE, SHA_IN_TEXT_RE, SHA_RULE
from .launcher.immutable import launcher_problem
from .launcher.plain_lookup import plain_resolve, state_root
from .report.outcome import Refused, UsageError

TYPE_CHECKING = False  # not typing's: the launcher path (vq admin launcher, per job) never imports typing
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NoReturn

    from .document import JsonObject

PIN_SCHEMA = "vq-admin/pin/1"
SCHEMA_LAUNCHER = "vq-admin/launcher-binding/1"
#: Largest pin accepted (a pin is a few hundred characters).
MAX_PIN_CHARS = 64 * 1024


class LauncherRefused(Refused):
    """The binding is refused (exit 77); nothing may be submitted or dispatched with it."""

    def __init__(self, code: str, reason: str, remedy: str):
        super().__init__(reason)
        self.code, self.reason, self.remedy = code, reason, remedy

    def __str__(self) -> str:
        return f"{self.reason} (remedy: {self.remedy})"

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "reason": self.reason, "remedy": self.remedy}


class BindingUsageError(UsageError, ValueError):
    """A malformed argument (a program or host name, an abbreviated SHA): exit 2."""


class Binding(PlainRecord):
    """An immutable launcher attested by verified deployment evidence (frozen)."""

    FIELDS = ("launcher", "sha", "launcher_sha256", "host", "program", "receipt", "verified_at", "tag",
              "latest", "checked_on_host")
    __slots__ = FIELDS
    launcher: str
    sha: str
    launcher_sha256: str
    host: str
    program: str
    receipt: str
    verified_at: str
    tag: str | None
    latest: bool
    checked_on_host: bool

    def pin(self) -> dict[str, str]:
        """What the driver records with a job, for :func:`check_pin` at dispatch."""
        return {"schema": PIN_SCHEMA, "program": self.program, "host": self.host, "sha": self.sha,
                "launcher": self.launcher, "launcher_sha256": self.launcher_sha256, "receipt": self.receipt}


# -- the two calls ----------------------------------------------------------------


def _checked_request(program: str, host: str, expected_sha: str | None, path: str | None,
                     job: str | None) -> str | None:
    """Refuse a request whose words are not well formed (a usage error; an explicit path that is not an
    immutable launcher's form is refused); the expected SHA, in lower case, or ``None``."""
    _name(program, "program")
    _name(host, "host")
    _job(job)
    sha = None
    if expected_sha is not None:
        if not isinstance(expected_sha, str) or not FULL_SHA_RE.match(expected_sha):
            raise BindingUsageError(f"--expected-sha: {expected_sha!r} is not a full commit SHA; {SHA_RULE}")
        sha = expected_sha.lower()
    problem = path_form_problem(path) if path is not None else None
    if problem is not None:
        raise LauncherRefused("mutable-launcher", f"{problem}; an explicit path authenticates nothing",
                              _use_printed(program, host, sha))
    return sha


def _refuse_quarantined(root: str, host: str, program: str, sha: str) -> None:
    """Refuse (``quarantined``) a generation quarantined in this state directory, saying how to move on."""
    try:
        mark = registry.quarantined(root, host, program, sha)
    except registry.RegistryError as exc:
        raise _corrupt(exc, program, host) from None
    if mark is not None:
        raise LauncherRefused("quarantined", f"quarantined: {mark.reason}",
                              f"bind the job to another generation; vq admin jobs {program} {host} --sha "
                              f"{sha} lists what used it; vq admin quarantine {program} {host} "
                              f"{sha} --lift ends the quarantine")


def resolve_launcher(program: str, host: str, *, expected_sha: str | None = None, path: str | None = None,
                     state_dir: str | os.PathLike[str] | None = None, config_path: str | os.PathLike[str] | None = None,
                     check_on_host: bool = False, timeout: float = 60.0, job: str | None = None) -> Binding:
    """The verified immutable launcher of *program* on *host*, or :class:`LauncherRefused`; its use is
    recorded (:mod:`vq_admin.launcher.uses`: time, program, host, SHA, launcher, *job*, user) before it
    is returned, and a use that cannot be recorded is refused (``use-unrecorded``).

    *expected_sha*: refuse unless evidence exists for exactly this SHA (an
    older generation that was verified and is still registered resolves; its
    ``latest`` is false).  Without it, the latest verified SHA.
    *path*: refuse unless it is exactly the verified launcher.
    *check_on_host*: re-hash the launcher on the login host and refuse when it
    differs from the attested SHA-256 (needs the configuration and ssh).
    """
    sha = _checked_request(program, host, expected_sha, path, job)
    root = state_root(state_dir)
    canonical = host
    if path is None and not check_on_host:
        plain = plain_resolve(root, host, program, sha)  # a few system calls; None: the full lookup decides
        if plain is not None:
            return _used(root, _binding(registry.Entry.of(plain[1]), host, program, plain[0], False), job)
    latest, entry = _resolve(root, host, program, sha)
    if latest is None:  # no evidence under this name: an alias, or nothing yet
        canonical = _canonical_host(root, program, host, config_path)
        if canonical != host:
            latest, entry = _resolve(root, canonical, program, sha)
    if entry is None:
        _refuse_missing(program, host, canonical, sha, latest, root)
    _refuse_unconfirmed(program, host, canonical, entry.sha, root, pinned=sha is not None)
    _refuse_quarantined(root, canonical, program, entry.sha)
    if path is not None and path != entry.launcher:
        raise LauncherRefused("path-mismatch",
                              f"{path} is not the verified launcher of {program} {entry.sha} on {canonical}; "
                              "an explicit path authenticates nothing",
                              _use_printed(program, canonical, entry.sha))
    if check_on_host:
        from .launcher.profile_view import ReadbackRefused, check_launcher_on_host

        try:
            check_launcher_on_host(entry, config_path, timeout)
        except ReadbackRefused as exc:
            raise LauncherRefused(exc.code, exc.reason, exc.remedy) from None
    _refuse_gone(root, canonical, program, entry)
    return _used(root, _binding(entry, canonical, program, latest, bool(check_on_host)), job)


def _refuse_gone(root: str, host: str, program: str, entry: registry.Entry) -> None:
    """:class:`LauncherRefused` (``launcher-gone``) when the launcher's path is visible here and is missing or
    changed (:mod:`vq_admin.launcher.present`): never exit 0 with a dead path."""
    from .launcher.present import launcher_problem_here
    from .state.tree import PrivateTree, UnsafeState

    try:
        fd = PrivateTree(root).open_dir(["registry", host, program], create=False)
    except UnsafeState as exc:
        raise _corrupt(exc, program, host) from None
    if fd is None:
        return
    try:
        problem = launcher_problem_here(fd, entry.sha, entry.launcher, entry.launcher_sha256)
    finally:
        os.close(fd)
    if problem:
        raise LauncherRefused("launcher-gone", f"{program} {entry.sha} on {host}: {problem}",
                              f"do not submit with it: bind the job to another generation (vq admin jobs {program} "
                              f"{host} shows what uses it), or deploy it again: vq admin update {program} {host} "
                              f"--expected-sha {entry.sha}")


def _used(root: str, binding: Binding, job: str | None) -> Binding:
    """*binding*, its use recorded; :class:`LauncherRefused` (``use-unrecorded``) when it cannot be."""
    from .launcher.plain_lookup import record_use

    if record_use(root, binding.host, binding.program, binding.sha, binding.launcher, job):
        return binding
    from .launcher.uses import append
    from .state.tree import PrivateTree, UnsafeState

    try:  # the state home behind a symlink, or a refusal to word
        rfd = PrivateTree(root).open_dir([], create=True)
        assert rfd is not None
        try:
            append(rfd, binding.host, binding.program, binding.sha, binding.launcher, job)
        finally:
            os.close(rfd)
    except (OSError, ValueError, UnsafeState) as exc:
        raise LauncherRefused("use-unrecorded", f"the use of {binding.launcher} could not be recorded in "
                              f"{root}/uses/{binding.host}/{binding.program}: {exc}",
                              "make the state directory writable (a use that is not recorded could be pruned "
                              "from under the job), then submit again") from None
    return binding


def _resolve(root: str, host: str, program: str, sha: str | None) -> tuple[str | None, registry.Entry | None]:
    """:func:`registry.resolve` (one checked walk of the registry), its errors as refusals."""
    try:
        return registry.resolve(root, host, program, sha)
    except registry.PrunedError as exc:
        raise LauncherRefused("pruned", f"{program} on {host}: {exc}",
                              f"bind the job to a kept generation (vq admin launcher {program} {host}), or deploy "
                              f"this one again: vq admin update {program} {host} --expected-sha {exc.sha}") from None
    except registry.RegistryError as exc:
        raise _corrupt(exc, program, host) from None


def _binding(entry: registry.Entry, host: str, program: str, latest: str | None, checked_on_host: bool) -> Binding:
    return Binding(launcher=entry.launcher, sha=entry.sha, launcher_sha256=entry.launcher_sha256, host=host,
                   program=program, receipt=entry.receipt, verified_at=entry.verified_at, tag=entry.tag,
                   latest=entry.sha == latest, checked_on_host=checked_on_host)


def _pin_document(pin: JsonObject | str, program: str | None, host: str | None) -> JsonObject:
    """The pin as an object; a bare SHA, or anything not a JSON object, is a ``legacy-pin``."""
    remedy = _legacy_remedy(program, host)
    loaded: object = pin
    if isinstance(pin, str):
        text = pin.strip()
        if not text.startswith("{"):
            bare = text.lower() if FULL_SHA_RE.match(text) else None
            raise LauncherRefused("legacy-pin", f"the pin {text[:80]!r} is a bare SHA: it names no launcher, so the "
                                  "job would run whatever its script names (a stable launcher follows current)",
                                  _legacy_remedy(program, host, bare))
        from .core.bounds import InputError, loads_json

        try:
            loaded = loads_json(text, "the pin", limit=MAX_PIN_CHARS)
        except InputError as exc:
            raise LauncherRefused("legacy-pin", f"{exc}; it is not recognised", remedy) from None
    if not isinstance(loaded, dict):
        raise LauncherRefused("legacy-pin", "the pin is neither a bare SHA nor a JSON object; it is not recognised",
                              remedy)
    return loaded


def _pin_target(pin: JsonObject, program: str | None, host: str | None, state_dir: str | os.PathLike[str] | None,
                config_path: str | os.PathLike[str] | None) -> tuple[str, str, str, str]:
    """``(program, host, full SHA, remedy)`` the pin names, checked against the dispatch's (*host* may be an
    alias of the pinned host)."""
    program = _pin_field(pin, "program", program)
    if (isinstance(host, str) and isinstance(pin.get("host"), str) and pin["host"] != host and NAME_RE.match(host)
            and isinstance(program, str) and NAME_RE.match(program)
            and _canonical_host(state_root(state_dir), program, host, config_path) == pin["host"]):
        host = pin["host"]  # dispatched through an alias of the pinned host
    host = _pin_field(pin, "host", host)
    sha = pin.get("sha", pin.get("expected_sha"))
    remedy = _legacy_remedy(program, host, sha)
    if not program or not host:
        raise LauncherRefused("legacy-pin", "the pin names no program and host", remedy)
    if not isinstance(sha, str) or not FULL_SHA_RE.match(sha):
        raise LauncherRefused("legacy-pin", f"the pin names no full SHA ({sha!r})", remedy)
    return program, host, sha.lower(), remedy


def check_pin(pin: JsonObject | str, *, program: str | None = None, host: str | None = None,
              state_dir: str | os.PathLike[str] | None = None, config_path: str | os.PathLike[str] | None = None,
              check_on_host: bool = False, timeout: float = 60.0, job: str | None = None) -> Binding:
    """Validate a pin recorded at submission, at dispatch time; fail closed.

    *pin* is what :meth:`Binding.pin` returned (a dict, or its JSON text).
    Legacy pins written before the registry -- a bare SHA, or a SHA with a
    launcher through ``current`` or without the full SHA -- are refused with
    code ``legacy-pin`` and the remedy; so is anything unrecognised.
    """
    _job(job)
    pin = _pin_document(pin, program, host)
    program, host, sha, remedy = _pin_target(pin, program, host, state_dir, config_path)
    launcher = pin.get("launcher")
    problem = launcher_problem(launcher, sha)  # anything but a string is one
    if problem is not None or not isinstance(launcher, str) or has_control(launcher):
        problem = problem or "launcher path holds a control character"
        code = "mutable-launcher" if pin.get("schema") == PIN_SCHEMA else "legacy-pin"
        raise LauncherRefused(code, f"the pin's launcher is not an immutable per-SHA launcher: {problem}", remedy)
    try:
        binding = resolve_launcher(program, host, expected_sha=sha, path=launcher, state_dir=state_dir,
                                   config_path=config_path, check_on_host=check_on_host, timeout=timeout, job=job)
    except BindingUsageError as exc:
        raise LauncherRefused("legacy-pin", f"the pin is malformed: {exc.message}", remedy) from None
    attested = pin.get("launcher_sha256")
    if attested is not None and attested != binding.launcher_sha256:
        raise LauncherRefused("pin-mismatch", f"the pin attests launcher SHA-256 {attested!r}, the verified evidence "
                              f"{binding.launcher_sha256} (receipt {binding.receipt})",
                              "do not dispatch this job; cancel it and resubmit with the launcher printed by "
                              f"vq admin launcher {program} {binding.host} --expected-sha {sha}")
    return binding


# -- helpers ----------------------------------------------------------------------


def path_form_problem(path: object) -> str | None:
    """``None`` when *path* has the form of an immutable per-SHA launcher (for some full SHA)."""
    if not isinstance(path, str) or not path:
        return "no launcher path"
    if has_control(path):
        return "launcher path holds a control character"
    shas = SHA_IN_TEXT_RE.findall(path)
    if not shas:
        if "current" in path.split("/"):
            return launcher_problem(path, "0" * 40)  # names the stable link
        return (f"launcher {path} is not an immutable per-SHA launcher (a stable wrapper or a bare interpreter: "
                "no full SHA in it)")
    problems = [launcher_problem(path, sha) for sha in shas]
    return None if None in problems else problems[0]


def _refuse_unconfirmed(program: str, host: str, canonical: str, sha: str, root: str, *, pinned: bool) -> None:
    """:class:`LauncherRefused` (``unconfirmed``) for a generation a confirmation job did not prove, or whose
    confirmation record cannot be read (CONTRACT section 13), registered or not."""
    from .launcher.plain_lookup import unconfirmed_reason

    why = unconfirmed_reason(root, canonical, program, sha)
    if why is None:
        return
    alias = f" ({host} is an alias of {canonical})" if host != canonical else ""
    other = (f"submit with the verified launcher (vq admin launcher {program} {canonical})" if pinned else
             f"bind the job to a confirmed generation (vq admin launcher {program} {canonical} --expected-sha SHA; "
             f"vq admin history {program} {canonical} lists them)")
    raise LauncherRefused("unconfirmed", f"{program} {sha} on {canonical}{alias} is unconfirmed: {why}",
                          f"{other}, or prove it: vq admin update {program} {canonical} --expected-sha {sha} "
                          "--retry-confirmation")


def _refuse_missing(program: str, host: str, canonical: str, sha: str | None, latest: str | None,
                    root: str) -> NoReturn:
    alias = f" ({host} is an alias of {canonical})" if host != canonical else ""
    if sha is not None:
        _refuse_unconfirmed(program, host, canonical, sha, root, pinned=True)
    if latest is None:
        raise LauncherRefused("no-evidence", f"no verified deployment evidence for {program} on {canonical}{alias}",
                              f"deploy and verify it: vq admin update {program} {canonical} "
                              f"--expected-sha {sha or 'SHA'} "
                              "(when that SHA is already active, this records the evidence without rebuilding)")
    raise LauncherRefused("sha-mismatch",
                          f"{sha} differs from the verified evidence for {program} on {canonical}{alias}: "
                          f"the verified launchers are for other SHAs (latest {latest})",
                          f"submit with the verified SHA {latest}, or deploy and verify {sha}: "
                          f"vq admin update {program} {canonical} --expected-sha {sha}")


def _corrupt(exc: Exception, program: str, host: str) -> LauncherRefused:
    return LauncherRefused("evidence-corrupt", f"the verified-launcher registry cannot be trusted: {exc}",
                           f"inspect the file named (vq-admin never rewrites registry entries), then re-verify: "
                           f"vq admin update {program} {host} --expected-sha SHA --force")


def _use_printed(program: str, host: str, sha: str | None) -> str:
    return (f"use exactly the launcher printed by: vq admin launcher {program} {host} --expected-sha {sha or 'SHA'} "
            "(never a path through current, a stable wrapper or a bare interpreter)")


def _legacy_remedy(program: str | None = None, host: str | None = None, sha: object = None) -> str:
    """Re-verify and resubmit; ``PROGRAM``, ``HOST``, ``SHA`` stand for what is unnamed (a non-string SHA too)."""
    program, host = program or "PROGRAM", host or "HOST"
    sha = sha if isinstance(sha, str) else "SHA"
    return (f"re-verify: vq admin update {program} {host} --expected-sha {sha}, then resubmit with the launcher "
            f"printed by vq admin launcher {program} {host} --expected-sha {sha}")


def _pin_field(pin: JsonObject, key: str, given: str | None) -> str | None:
    value = pin.get(key)
    if value is None:
        return given
    if given is not None and value != given:
        raise LauncherRefused("pin-mismatch", f"the pin names {key} {value!r}, the dispatch asks for {given!r}",
                              "dispatch the job against the program and host it was pinned to")
    if not isinstance(value, str):
        raise LauncherRefused("legacy-pin", f"the pin's {key} is not a string",
                              _legacy_remedy())
    return value


def _job(job: str | None) -> None:
    if job is not None:
        from .launcher.uses import ref_problem

        problem = ref_problem(job)
        if problem:
            raise BindingUsageError(problem)


def _name(value: object, what: str) -> None:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise BindingUsageError(f"{what} {value!r} must match {NAME_RULE}")


def _canonical_host(root: str, program: str, host: str, config_path: str | os.PathLike[str] | None) -> str:
    """*host* when the registry knows it; otherwise resolved through the configuration (aliases)."""
    try:
        if registry.has_lane(root, host, program):
            return host
    except registry.RegistryError as exc:
        raise _corrupt(exc, program, host) from None
    from .launcher.profile_view import ConfigUnavailable, host_table

    try:  # a host (or program) the configuration does not name is a usage error, as for every verb
        table, _ = host_table(config_path, host)
    except ConfigUnavailable as exc:
        raise UsageError(str(exc)) from None
    role = table.get("fleet_role")
    if role == "managed":
        return _profiled(table, host, program)
    if role == "alias":
        canonical = table.get("canonical_host")
        target: Mapping[str, object] = {}  # none found: no fleet_role, refused below
        if isinstance(canonical, str) and NAME_RE.match(canonical):
            try:
                target, _ = host_table(config_path, canonical)
            except ConfigUnavailable:
                pass
            if target.get("fleet_role") == "managed":
                return _profiled(target, canonical, program)
        raise LauncherRefused("unmanaged-host", f"{host} is an alias of {canonical!r}, which does not resolve to a "
                              f"managed host (fleet_role {target.get('fleet_role')!r})",
                              "name a managed host, or fix hosts." + host + ".canonical_host in the configuration")
    raise LauncherRefused("unmanaged-host", f"{host} has fleet_role {role!r}, which has no runtime maintenance "
                          "authority, so no runtime evidence can exist for it",
                          "submit to a managed host (fleet_role = \"managed\")")


def _profiled(table: Mapping[str, object], host: str, program: str) -> str:
    """*host*, whose configuration *table* must have a profile of *program* (else a usage error naming them)."""
    profiles = table.get("scheduler_runtime_deployments")
    if not isinstance(profiles, dict) or program not in profiles:
        known = ", ".join(sorted(profiles)) if isinstance(profiles, dict) and profiles else "none"
        raise UsageError(f"host {host} has no scheduler_runtime_deployments.{program} profile (profiles: {known})")
    return host
