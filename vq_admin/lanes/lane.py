"""What the lane runner needs of a lane (:class:`Lane`), and what the runtime lane's first agent call
and command-file check read of it (:class:`RuntimeLane`): protocols, so that no module but the lane
itself imports :class:`vq_admin.lanes.runtime.RuntimeUpdate`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..report.receipt import Receipt

if TYPE_CHECKING:
    from vq_admin_hookspecs import ProviderCommand, RuntimeRequest

    from ..config import HostConfig, RuntimeProfile
    from ..context import RunContext
    from ..plan import Step
    from ..ssh.transport import Transport
    from .runtime_step import RuntimeStep


class Lane(Protocol):
    """A helper update, runtime update, rollback or prune of one host (``vq_admin.lanes``)."""

    receipt: Receipt

    def run(self) -> Receipt: ...


class RuntimeLane(Protocol):
    """A runtime update or rollback, as :mod:`.first_call` and :mod:`.command_files` read it."""

    ctx: RunContext
    host: HostConfig
    profile: RuntimeProfile
    receipt: Receipt
    sha: str
    #: The inputs its steps are built from (:mod:`.runtime_step`).
    inputs: RuntimeStep
    #: The planned pre-verify and its read-back step.
    pre: tuple[Step, Step]

    def request(self, *, archive: str | None, where: str | None = None) -> RuntimeRequest: ...

    def planned_deploy(self) -> ProviderCommand: ...

    def build_transport(self) -> Transport: ...
