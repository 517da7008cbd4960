"""Pytest plugin ``vq_admin`` (entry point ``pytest11``): provider conformance.

A site tests its provider package before an operator installs it::

    def test_my_provider_conforms(vq_provider_conformance):
        report = vq_provider_conformance("mysite", provider_options={"command": "/path/to/mysite-deploy"})
        report.assert_ok()          # fails with every named check and its reason

or, for a provider object that is not installed as an entry point::

    report = vq_provider_conformance("candidate", plugin=my_module)

The fixture runs :func:`vq_admin.conformance.run_conformance` with its
disposable directory below the test's ``tmp_path``.  Importing this module
is cheap: the kit is imported when the fixture is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import pytest

if TYPE_CHECKING:
    import pathlib

    from .conformance import Report


@pytest.fixture
def vq_provider_conformance(tmp_path: pathlib.Path) -> Callable[..., Any]:
    """``run(name, *, plugin=None, provider_options=None, script_args=(), source=None)`` -> Report; *source*
    ``(repository, full SHA)`` deploys the site's own source instead of the kit's fixture."""
    from .conformance import run_conformance

    def run(name: str, *, plugin: object | None = None, provider_options: dict[str, str] | None = None,
            script_args: tuple[str, ...] = (), keep: bool = False, source: tuple[str, str] | None = None) -> Report:
        return run_conformance(name, plugin=plugin, provider_options=provider_options, script_args=script_args,
                               workdir=str(tmp_path), keep=keep, source=source)

    return run
