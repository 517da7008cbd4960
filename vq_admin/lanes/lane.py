"""What the lane runner needs of a lane: its receipt, and ``run()`` returning it."""

from __future__ import annotations

from typing import Protocol

from ..receipt import Receipt


class Lane(Protocol):
    """A helper update, runtime update, rollback or prune of one host (``vq_admin.lanes``)."""

    receipt: Receipt

    def run(self) -> Receipt: ...
