"""What one run carries: configuration, state, transports, providers, options."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .config import Config, HostConfig
from .state.records import StateDir
from .ssh.transport import Session, Transport

if TYPE_CHECKING:  # loaded only when a run needs a provider (vq_admin.plugins imports pluggy)
    from .plugins import Providers


@dataclass(frozen=True)
class RunOptions:
    json: bool = False
    dry_run: bool = False
    force: bool = False
    cluster_install: bool = False
    update_script_args: tuple[str, ...] = ()
    verbose: bool = False
    #: ``--wait-lock SECONDS``: how long a held lane lock or host-side lease is waited for (None: not at all)
    wait_lock: float | None = None
    #: ``--accept-regression REASON`` and ``--retry-confirmation`` (CONTRACT section 13)
    accept_regression: str | None = None
    retry_confirmation: bool = False
    #: ``--config`` and ``--state-dir`` as given on the command line (for the ``next`` hint)
    config: str | None = None
    state_dir: str | None = None


@dataclass
class RunContext:
    config: Config
    state: StateDir
    session: Session
    providers: Providers
    options: RunOptions = field(default_factory=RunOptions)
    narrate: Callable[[str], None] = lambda message: None
    #: The host-side lease a lane takes in its first call (:func:`vq_admin.lease.host_lease`, deferred).
    lease: Any = None
    #: The host-side lease the run holds, however it was taken (the run's record entry goes through it).
    held_lease: Any = None

    def login(self, host: HostConfig) -> Transport:
        """The scheduler login host itself (verification always runs here)."""
        return self.session.for_host(host.transport, host.ssh)

    def remote(self, host: HostConfig, destination: str | None) -> Transport:
        """*destination* over ssh when set, else the login host."""
        return self.session.ssh(destination) if destination else self.login(host)


def stderr_narrator(enabled: bool) -> Callable[[str], None]:
    def narrate(message: str) -> None:
        if enabled:  # narration quotes remote stderr: escaped like the summary
            from .report.output import CONTINUATION, safe_text

            text = safe_text(message).replace("\n", "\n" + CONTINUATION)
            try:
                print(f"vq-admin: {text}", file=sys.stderr, flush=True)
            except BrokenPipeError:  # narration is not the record: a closed stderr never ends a run
                pass

    return narrate
