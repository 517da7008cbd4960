"""The provider conformance kit: run a provider's hooks against a disposable
root with scheduler doubles and check the provider contract.

Used by ``vq admin provider test NAME`` and by the pytest plugin
:mod:`vq_admin.testing`.  See :mod:`.kit` for the checks and
docs/provider-maintenance.md for the operator view.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..document import Document, FullSha
from ..evidence import Check

if TYPE_CHECKING:
    from .world import SchedulerCall

SCHEMA = "vq-admin/conformance/1"


class SourceUnderTest(Document, frozen=True, kw_only=True):
    """The site's own source the kit deployed (``--source-repo PATH --sha SHA``): the repository, the commit
    (A) and the commits of its tree made on top of it (B, C); and the checks that cannot run on it."""

    repo: str
    sha: FullSha
    commits: dict[str, FullSha]
    not_run: list[str]
    why: str


@dataclass
class Report:
    """The named checks of one conformance run."""

    provider: str
    checks: list[Check] = field(default_factory=list)
    workdir: str | None = None
    scheduler_calls: list[SchedulerCall] = field(default_factory=list)
    error: str | None = None
    source: SourceUnderTest | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def check(self, name: str) -> Check:
        for found in self.checks:
            if found.name == name:
                return found
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "passed": self.passed, "error": self.error,
                "checks": [asdict(c) for c in self.checks], "workdir": self.workdir,
                "scheduler_calls": [call.to_value() for call in self.scheduler_calls],
                "source": self.source.to_value() if self.source else None}

    def text(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [f"provider {self.provider}: conformance {verdict} "
                 f"({len(self.checks) - len(self.failed())} of {len(self.checks)} checks passed)"]
        if self.error:
            lines.append(f"  ERROR {self.error}")
        if self.source:
            lines.append(f"  source {self.source.repo} at {self.source.sha} (A; B and C: its tree, "
                         f"{self.source.commits['B']} and {self.source.commits['C']})")
        lines += [f"  {'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        if self.source and self.source.not_run:
            lines.append(f"  not run: {', '.join(self.source.not_run)}: {self.source.why}")
        if self.scheduler_calls:
            lines.append(f"  scheduler doubles called {len(self.scheduler_calls)} times")
        if self.workdir:
            lines.append(f"  disposable directory kept: {self.workdir}")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raise AssertionError carrying :meth:`text` unless every check passed."""
        if not self.passed:
            raise AssertionError(self.text())


def run_conformance(name: str, *, plugin: object | None = None, provider_options: Mapping[str, str] | None = None,
                    script_args: Sequence[str] = (), workdir: str | None = None, keep: bool = False,
                    commands: Mapping[str, Sequence[str]] | None = None,
                    source: tuple[str, str] | None = None) -> Report:
    """Run the kit on provider *name* (an installed entry point, or *plugin* given in-process).

    ``provider_options`` default to ``{"root": "{root}"}``; ``{root}`` in any
    value expands to the disposable runtime root.  The disposable directory is
    a fresh temporary directory (below *workdir* when given) removed at the
    end unless *keep*.

    ``commands`` gives the built-in ``command`` provider its command lines
    (``update_command``, ``install_command``, ``verify_command``, each a
    sequence of words; ``{root}`` expands in every word).

    ``source`` (``(repository, full SHA)``) deploys the site's own source instead of the kit's fixture:
    A is that commit, B and C commits of its tree made in a clone (:class:`.world.World`); the checks of
    a deploy that fails validation on purpose are not run (the report's ``source`` names them).
    """
    from ..plugins import Providers
    from . import generations
    from .kit import Kit
    from .world import World

    providers = Providers.from_plugins({name: plugin}) if plugin is not None else Providers.load([name])
    providers.remember = False  # the kit asks the same question twice on purpose: the answers must agree
    options = {"root": "{root}", **dict(provider_options or {})}
    base = tempfile.mkdtemp(prefix="vq-conformance-", dir=workdir)
    report = Report(provider=name)
    try:
        world = World(base, source)
        if source is not None:
            from .kit import FAILED_VALIDATION

            report.source = SourceUnderTest(
                repo=source[0], sha=source[1], commits=dict(world.sha), not_run=list(FAILED_VALIDATION),
                why="they deploy a commit whose selftest fails on purpose, which the kit cannot make of the site's "
                    "own source")
        kit = Kit(providers, name, world, options, script_args, commands)
        report.checks = kit.run()
        if kit.releases is not None:  # activation and prune, when the provider offers them
            generations.run(kit, kit.releases)
        report.scheduler_calls = world.scheduler_calls()
    except Exception as exc:  # the kit's own failure must still produce a report
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        if keep:
            report.workdir = base
        else:
            shutil.rmtree(base, ignore_errors=True)
    return report
