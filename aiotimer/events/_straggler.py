"""Events of the straggler detector (:mod:`aiotimer.core._straggler`): a rank slower than
its peers was named, and it stopped being one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from aiotimer.events._base import Event, clip_scope

__all__ = ["StragglerDetected", "StragglerRecovered"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerDetected(Event):
    """Rank ``rank`` is slower than its peers in ``scope`` (a scope site): its slowness
    ``ratio`` (``basis`` ``"cycle"``: its iteration, start to start; ``"own"``: its time
    outside the scope, its peers waiting for it inside) was at least the threshold over
    its last ``window`` blocks, for several evaluations in a row; ``excess`` is the
    seconds per iteration it is behind its peers' median. ``pid`` is its process."""

    kind: ClassVar[str] = "straggler"
    level: ClassVar[int] = logging.WARNING
    rank: int
    pid: int | None
    scope: str
    ratio: float
    basis: str
    excess: float
    window: int

    def describe(self) -> str:
        """One human-readable line."""
        what = "its iterations" if self.basis == "cycle" else "its time outside the scope"
        return (
            f"rank {self.rank} is a straggler in {clip_scope(self.scope)}: {what} "
            f"{self.ratio:.2f}x its peers' ({self.excess * 1000:.1f} ms more per iteration, "
            f"median of {self.window} blocks)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerRecovered(Event):
    """Rank ``rank`` is no longer slower than its peers in ``scope``: its ``ratio`` fell
    below the recovery threshold, or ``reason`` says why it is no longer judged (its
    process was replaced)."""

    kind: ClassVar[str] = "straggler_recovered"
    rank: int
    scope: str
    ratio: float
    window: int
    reason: str = "recovered"

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"rank {self.rank} is no longer a straggler in {clip_scope(self.scope)} "
            f"({self.reason}, ratio {self.ratio:.2f})"
        )
