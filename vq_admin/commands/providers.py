"""``vq admin providers``: what is installed, and what the configuration selects.

Installed providers are listed from package metadata without importing them;
only the ones the configuration selects are loaded (and their hooks shown).
The configuration is read as by every verb: missing or invalid is exit 2.
"""

from __future__ import annotations

import argparse
from ..config import load_config
from ..document import Document
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome
from ..plugins import BUILTIN, Providers, installed_providers


class ProviderRow(Document, frozen=True, kw_only=True):
    """One provider of ``vq admin providers --json`` (``hooks``: null when it was not loaded)."""

    name: str
    distribution: str | None
    version: str | None
    builtin: bool
    selected: bool
    loaded: bool
    hooks: list[str] | None


def run(args: argparse.Namespace) -> int:
    selected = load_config(args.config).provider_names()
    loaded = Providers.load(selected)
    rows = [ProviderRow(name=name, distribution=info.distribution, version=info.version, builtin=info.builtin,
                        selected=name in selected or not selected and name == BUILTIN, loaded=True,
                        hooks=list(info.hooks)) for name, info in sorted(loaded.info.items())]
    rows += [ProviderRow(name=name, distribution=offer.distribution, version=offer.version, builtin=False,
                         selected=False, loaded=False, hooks=None)
             for name, offers in sorted(installed_providers().items()) if name not in loaded.info for offer in offers]
    if args.json:
        return emit(SCHEMAS["providers"], Outcome.OK, {"providers": [row.to_value() for row in rows]})
    for row in rows:
        mark = "*" if row.selected else " "
        hooks = ", ".join(row.hooks) if row.hooks is not None else "(not loaded: not selected)"
        print(f"{mark} {row.name:<16} {row.distribution} {row.version}  {hooks}")
    return 0
