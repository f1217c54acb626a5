"""What learned timeouts tell: a block the learned value would have reaped."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from aiotimer.core import format_seconds
from aiotimer.events._base import Event, clip_scope

__all__ = ["LearnedWouldReap"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedWouldReap(Event):
    """A block of a learned scope ran ``duration`` seconds: longer than the value in
    force for it (``value``, learned from ``samples`` durations), shorter than its
    ``initial``. Had it been timed at the value and reaped, it would have been a false
    kill; it was not (report only or shadow mode), and its duration has widened the
    scope's value to ``widened_to`` (see :mod:`aiotimer.core._learned`).
    """

    kind: ClassVar[str] = "learned_would_reap"
    level: ClassVar[int] = logging.WARNING
    pid: int
    scope_id: str
    duration: float
    value: float
    samples: int
    initial: float
    widened_to: float

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"block {clip_scope(self.scope_id)} of worker {self.pid} ran "
            f"{format_seconds(self.duration)}, past its learned timeout "
            f"{format_seconds(self.value)} (from {self.samples:,} samples; initial "
            f"{format_seconds(self.initial)}): the learned value would have reaped it; "
            f"widened to {format_seconds(self.widened_to)}"
        )
