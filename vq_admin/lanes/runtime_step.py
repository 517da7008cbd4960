"""What a runtime-lane step (mirror feed, allocation or detached deploy) is built from: explicit inputs,
never the lane object; each step owns whatever state it keeps between its plan and its run."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # annotations only: this module imports nothing of the lanes at run time
    from ..config import HostConfig, RuntimeProfile
    from ..context import RunContext
    from ..report.receipt import Receipt
    from ..ssh.transport import Transport
    from .staging import SourceStage

_S = TypeVar("_S", bound="RuntimeStep")


class RuntimeStep:
    """The inputs every runtime-lane step is built from, and what follows from them alone."""

    def __init__(self, ctx: RunContext, host: HostConfig, profile: RuntimeProfile, receipt: Receipt, sha: str,
                 stage: SourceStage):
        self.ctx = ctx
        self.host = host
        self.profile = profile
        self.receipt = receipt
        self.sha = sha
        self.stage = stage

    @classmethod
    def like(cls: type[_S], other: RuntimeStep) -> _S:
        """A step of this kind built from the same inputs as *other*."""
        return cls(other.ctx, other.host, other.profile, other.receipt, other.sha, other.stage)

    def build_transport(self) -> Transport:
        """Where the profile builds (``update_host``, else the login host)."""
        return self.ctx.remote(self.host, self.profile.update_host)

    def log_dir(self, attempt: str) -> str:
        """Where *attempt* (a deploy's or a confirmation's) keeps its transcripts on the host."""
        return os.path.join(self.host.scratch_root or "", ".vq-admin", "runtime-deploy", self.profile.program, attempt)

    def receipt_id(self) -> str:
        """The receipt's id, given it now when it has none (a step's transcript copies live next to it)."""
        if self.receipt.id is None:
            self.receipt.id = self.ctx.state.new_receipt_id(self.receipt.lane, self.receipt.host, self.receipt.program)
        return self.receipt.id

