"""The provider plugin manager: configured providers only, checked, typed.

* The built-in ``command`` provider is always registered.
* A plugin provider is loaded only when the configuration names it, from the
  entry-point group ``vq_admin.providers``; two distributions offering the
  same name, or a provider that fails to import, abort with an error naming
  the entry point and the distribution(s).
* ``check_pending()`` runs after registration, so a misspelt ``vq_admin_*``
  hook implementation is an error, not silence.
* Calls go through :class:`Providers`, a thin typed facade: each call asks
  exactly one named provider and validates that it returned a
  :class:`ProviderCommand`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import pluggy
from vq_admin_hookspecs import (
    ENTRY_POINT_GROUP,
    HOOK_NAMES,
    PROJECT_NAME,
    EvidenceError,
    ProviderCommand,
    RuntimeRequest,
)
from vq_admin_hookspecs import specs as hookspec_module

from .report.outcome import UsageError
from .providers import command as command_provider

BUILTIN = "command"


class ProviderError(UsageError):
    """A provider is missing, fails to load, or answered a hook wrongly (exit 2)."""


@dataclass(frozen=True)
class InstalledProvider:
    name: str
    distribution: str
    version: str
    value: str  # "module:attr" of the entry point


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]
    builtin: bool = False


def installed_providers() -> dict[str, list[InstalledProvider]]:
    """Every provider entry point installed, by name (without loading any)."""
    from importlib.metadata import entry_points

    found: dict[str, list[InstalledProvider]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist, version = (ep.dist.name, ep.dist.version) if ep.dist else ("?", "?")
        item = InstalledProvider(ep.name, dist, version, ep.value)
        if item not in found.setdefault(ep.name, []):
            found[ep.name].append(item)
    return found


@dataclass
class Providers:
    """The providers one run may call."""

    pm: pluggy.PluginManager
    info: dict[str, ProviderInfo] = field(default_factory=dict)
    #: ``(provider, hook, request, answer)`` of every hook call this run made (see :meth:`_call`)
    answers: list[tuple[str, str, object, object]] = field(default_factory=list)
    #: False asks the provider every time (the conformance kit asks twice to prove determinism)
    remember: bool = True

    @classmethod
    def load(cls, names: Iterable[str]) -> "Providers":
        pm, info = _with_builtin()
        installed: dict[str, list[InstalledProvider]] | None = None  # read only for a plugin provider
        for name in names:
            if name in info:  # the built-in provider, or one loaded already
                continue
            if installed is None:
                installed = installed_providers()
            offers = installed.get(name, [])
            if not offers:
                raise ProviderError(
                    f"provider {name!r} is named in the configuration but no installed distribution offers it "
                    f"(entry-point group {ENTRY_POINT_GROUP}); see 'vq admin providers'"
                )
            if len(offers) > 1:
                both = ", ".join(f"{o.distribution} {o.version} ({o.value})" for o in offers)
                raise ProviderError(f"provider {name!r} is offered by more than one distribution: {both}")
            offer = offers[0]
            try:
                from importlib.metadata import EntryPoint

                plugin = EntryPoint(name, offer.value, ENTRY_POINT_GROUP).load()
            except Exception as exc:  # a broken provider must name itself
                raise ProviderError(
                    f"provider {name!r} (entry point {offer.value} of {offer.distribution} {offer.version}) "
                    f"failed to load: {type(exc).__name__}: {exc}"
                ) from None
            try:
                pm.register(plugin, name=name)
            except pluggy.PluginValidationError as exc:
                raise ProviderError(f"provider {name!r} ({offer.distribution}) is invalid: {exc}") from None
            info[name] = ProviderInfo(name, offer.distribution, offer.version, _hooks_of(pm, name))
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise ProviderError(f"a provider implements a hook that does not exist: {exc}") from None
        return cls(pm, info)

    @classmethod
    def from_plugins(cls, plugins: Mapping[str, object]) -> "Providers":
        """Providers from already-imported plugin objects, by name (tests and the
        conformance kit); no entry point is loaded.  Checked like :meth:`load`."""
        pm, info = _with_builtin()
        for name, plugin in plugins.items():
            try:
                pm.register(plugin, name=name)
                pm.check_pending()
            except (pluggy.PluginValidationError, ValueError) as exc:
                raise ProviderError(f"provider {name!r} (in-process plugin) is invalid: {exc}") from None
            info[name] = ProviderInfo(name, "in-process", "?", _hooks_of(pm, name))
        return cls(pm, info)

    # -- the facade: ``runtime_verify(provider, request)`` and so on, one per hook of the specs ---------

    def __getattr__(self, name: str) -> Callable[[str, object], ProviderCommand]:
        hook = f"vq_admin_{name}"
        if hook not in HOOK_NAMES:
            raise AttributeError(name)
        return lambda provider, request: self._call(provider, hook, request)  # type: ignore[return-value]

    def runtime_activate(self, provider: str, request: RuntimeRequest) -> ProviderCommand | None:
        """The activation command, or ``None`` when the provider has none (rollback then updates)."""
        return self._call(provider, "vq_admin_runtime_activate", request, optional=True)

    def _call(self, provider: str, hook: str, request: object, optional: bool = False) -> ProviderCommand | None:
        """The provider's answer; an identical question (same provider, hook and request) is asked once
        per run: hooks are deterministic (docs/providers.md), so the plan and every later use of a
        command are the one answer."""
        for asked in self.answers if self.remember else ():
            if asked[:2] == (provider, hook) and type(asked[2]) is type(request) and asked[2] == request:
                return self._checked(provider, hook, asked[3], optional)
        result = self._ask(provider, hook, request)
        self.answers.append((provider, hook, request, result))
        return self._checked(provider, hook, result, optional)

    def _ask(self, provider: str, hook: str, request: object) -> object:
        plugin = self.pm.get_plugin(provider)
        if plugin is None:
            raise ProviderError(f"provider {provider!r} is not loaded")
        others = [p for name, p in self.pm.list_name_plugin() if name != provider]
        caller = self.pm.subset_hook_caller(hook, remove_plugins=others)
        try:
            result = caller(request=request)
        except (ValueError, KeyError, TypeError, EvidenceError) as exc:
            raise ProviderError(f"provider {provider!r} could not answer {hook}: {exc}") from None
        return result

    def _checked(self, provider: str, hook: str, result: object, optional: bool) -> ProviderCommand | None:
        if result is None:
            if optional:
                return None
            raise ProviderError(f"provider {provider!r} does not provide {hook} for this profile")
        if not isinstance(result, ProviderCommand):
            raise ProviderError(f"provider {provider!r} returned {type(result).__name__} from {hook}, "
                                "not a ProviderCommand")
        return result


def _hooks_of(pm: pluggy.PluginManager, name: str) -> tuple[str, ...]:
    plugin = pm.get_plugin(name)
    callers = pm.get_hookcallers(plugin) or []
    names = {c.name for c in callers}
    return tuple(h for h in HOOK_NAMES if h in names)


def _with_builtin() -> tuple[pluggy.PluginManager, dict[str, ProviderInfo]]:
    """A plugin manager with the hook specifications and the built-in provider registered, and its info."""
    from . import __version__

    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspec_module)
    pm.register(command_provider, name=BUILTIN)
    return pm, {BUILTIN: ProviderInfo(BUILTIN, "vq-admin", __version__, _hooks_of(pm, BUILTIN), builtin=True)}
