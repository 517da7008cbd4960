"""Provider doubles shared by the tests that watch which hooks a run calls
(``test_lanes_never_cross.py``, ``test_plan_slots.py``).

Import as ``from provider_doubles import ...`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

from vq_admin_hookspecs import ProviderCommand, hookimpl


class SiteLikeRuntime:
    """The runtime hooks (update, install, verify) answered as site_example answers them; each
    call is handed to :meth:`note` first, which a subclass defines to record it."""

    def note(self, hook: str, request: object) -> None:
        raise NotImplementedError

    def _runtime(self, hook: str, verb: str, request):
        from vq_site_example.plugin import build_argv

        self.note(hook, request)
        return ProviderCommand(argv=tuple(build_argv(verb, request)))

    @hookimpl
    def vq_admin_runtime_update(self, request):
        return self._runtime("runtime_update", "deploy", request)

    @hookimpl
    def vq_admin_runtime_install(self, request):
        return self._runtime("runtime_install", "install", request)

    @hookimpl
    def vq_admin_runtime_verify(self, request):
        return self._runtime("runtime_verify", "verify", request)
