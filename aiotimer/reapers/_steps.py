"""The steps of a reap plan (dump the stacks, send a signal, wait for the exit), as data,
and their one-line rendering. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from aiotimer.events import signal_name

__all__ = ["DumpStacks", "SendSignal", "Step", "Wait", "check_seconds", "format_plan"]


@dataclass(frozen=True, slots=True)
class SendSignal:
    """Send ``signum`` to the worker, or to its process group when ``group``."""

    signum: int
    group: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait up to ``seconds`` for the worker to exit; stop escalating if it does."""

    seconds: float


@dataclass(frozen=True, slots=True)
class DumpStacks:
    """Ask the worker to dump its stacks; give up after ``timeout`` seconds."""

    timeout: float = 2.0


Step = SendSignal | Wait | DumpStacks


def check_seconds(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def format_plan(plan: Sequence[Step]) -> str:
    """A short human-readable rendering of a plan, for events and logs.

    >>> format_plan((DumpStacks(), SendSignal(15, True), Wait(5.0), SendSignal(9, True)))
    'dump stacks (2s) -> SIGTERM to group -> wait 5s -> SIGKILL to group'
    """
    if not plan:
        return "nothing (report only)"
    parts: list[str] = []
    for step in plan:
        if isinstance(step, DumpStacks):
            parts.append(f"dump stacks ({step.timeout:g}s)")
        elif isinstance(step, Wait):
            parts.append(f"wait {step.seconds:g}s")
        else:
            parts.append(signal_name(step.signum) + (" to group" if step.group else ""))
    return " -> ".join(parts)
