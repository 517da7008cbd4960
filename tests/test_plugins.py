"""The plugin manager: configured providers only, errors that name the provider."""

from __future__ import annotations

import textwrap

import pytest

import vq_admin.plugins as plugins
from vq_admin.plugins import InstalledProvider, ProviderError, Providers
from vq_admin_hookspecs import ProviderCommand, RuntimeRequest

SHA = "c" * 40


def request(**settings) -> RuntimeRequest:
    return RuntimeRequest(program="vibeqc", host="cluster", expected_sha=SHA, tag="v1",
                          update_script_args=("--jobs", "4"),
                          source_archive="/stage/source.tar", where="build-host", settings=settings)


@pytest.fixture
def fake_installed(monkeypatch, tmp_path):
    """Write provider modules into tmp_path and pretend distributions offer them."""
    monkeypatch.syspath_prepend(str(tmp_path))
    offers: dict[str, list[InstalledProvider]] = {}

    def add(name: str, module: str, source: str, distribution: str = "site-prov") -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        offers.setdefault(name, []).append(InstalledProvider(name, distribution, "1.0", module))

    monkeypatch.setattr(plugins, "installed_providers", lambda: offers)
    return add


GOOD = """
    from vq_admin_hookspecs import hookimpl, ProviderCommand
    @hookimpl
    def vq_admin_runtime_update(request):
        return ProviderCommand(argv=("/site/deploy", request.expected_sha))
    @hookimpl
    def vq_admin_runtime_verify(request):
        return ProviderCommand(argv=("/site/verify",))
"""


def test_the_command_provider_builds_the_contract_argv():
    providers = Providers.load([])
    settings = {"update_command": ("/site/bin/deploy", "--site", "x"), "verify_command": ("/site/bin/verify",),
                "install_command": ("/site/bin/install",)}
    update = providers.runtime_update("command", request(**settings))
    assert update.argv == ("/site/bin/deploy", "--site", "x", "--jobs", "4", "--program", "vibeqc",
                           "--expected-sha", SHA, "--tag", "v1", "--source-archive", "/stage/source.tar")
    install = providers.runtime_install("command", request(**settings))
    assert install.argv[0] == "/site/bin/install"
    verify = providers.runtime_verify("command", request(**settings))
    assert verify.argv == ("/site/bin/verify", "--program", "vibeqc", "--expected-sha", SHA, "--tag", "v1")


def test_only_configured_providers_are_loaded(fake_installed):
    fake_installed("good", "prov_good", GOOD)
    fake_installed("broken", "prov_broken", "raise RuntimeError('must never be imported')")
    providers = Providers.load(["good"])
    assert set(providers.info) == {"command", "good"}
    assert providers.info["good"].hooks == ("vq_admin_runtime_verify", "vq_admin_runtime_update")
    assert providers.runtime_update("good", request()).argv == ("/site/deploy", SHA)


def test_a_provider_is_called_alone_even_when_others_answer(fake_installed):
    fake_installed("good", "prov_good2", GOOD)
    fake_installed("other", "prov_other", GOOD.replace("/site/deploy", "/other/deploy"))
    providers = Providers.load(["good", "other"])
    assert providers.runtime_update("good", request()).argv[0] == "/site/deploy"
    assert providers.runtime_update("other", request()).argv[0] == "/other/deploy"


def test_a_provider_that_fails_to_load_is_named(fake_installed):
    fake_installed("broken", "prov_broken2", "raise RuntimeError('boom')")
    with pytest.raises(ProviderError, match=r"provider 'broken' \(entry point prov_broken2 of site-prov 1.0\) "
                                            r"failed to load: RuntimeError: boom"):
        Providers.load(["broken"])


def test_two_distributions_offering_one_name_is_an_error_naming_both(fake_installed):
    fake_installed("dup", "prov_dup_a", GOOD, distribution="site-a")
    fake_installed("dup", "prov_dup_b", GOOD, distribution="site-b")
    with pytest.raises(ProviderError, match="site-a 1.0.*site-b 1.0"):
        Providers.load(["dup"])


def test_a_misspelt_hook_fails_loudly(fake_installed):
    fake_installed("typo", "prov_typo", """
        from vq_admin_hookspecs import hookimpl
        @hookimpl
        def vq_admin_runtime_updat(request):
            return None
    """)
    with pytest.raises(ProviderError, match="vq_admin_runtime_updat"):
        Providers.load(["typo"])


def test_a_missing_provider_is_a_usage_error(fake_installed):
    with pytest.raises(ProviderError, match="no installed distribution offers it"):
        Providers.load(["nowhere"])


def test_wrong_answers_are_provider_errors(fake_installed):
    fake_installed("odd", "prov_odd", """
        from vq_admin_hookspecs import hookimpl
        @hookimpl
        def vq_admin_runtime_update(request):
            return ["/site/deploy"]
        @hookimpl
        def vq_admin_runtime_verify(request):
            return None
        @hookimpl
        def vq_admin_runtime_install(request):
            raise ValueError("provider_options.root is required")
    """)
    providers = Providers.load(["odd"])
    with pytest.raises(ProviderError, match="returned list .* not a ProviderCommand"):
        providers.runtime_update("odd", request())
    with pytest.raises(ProviderError, match="does not provide vq_admin_runtime_verify"):
        providers.runtime_verify("odd", request())
    with pytest.raises(ProviderError, match="provider_options.root is required"):
        providers.runtime_install("odd", request())


def test_provider_command_rejects_malformed_argv():
    from vq_admin_hookspecs import EvidenceError

    for argv in [(), ("",), ("/bin/x", 3), ("/bin/x", "a\nb"), ("/bin/x", "a\0b")]:
        with pytest.raises(EvidenceError):
            ProviderCommand(argv=argv)
    with pytest.raises(EvidenceError):
        ProviderCommand(argv=("/bin/x",), env=(("BAD NAME", "v"),))


def test_site_example_is_installed_and_listed():
    providers = Providers.load(["site_example"])
    assert providers.info["site_example"].distribution == "vq-site-example"
    assert "vq_admin_runtime_verify" in providers.info["site_example"].hooks
