"""The steps of a reap: stack dumps, signals sent, refused or failed, and the outcome
(reaped, abandoned, survived)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Final

from aiotimer.events._base import (
    Event,
    clip,
    clip_scope,
    clip_text,
    holding_task,
    scope_list,
    signal_name,
)

__all__ = [
    "MAX_DUMP_LINE",
    "ReapAbandoned",
    "ReapFailed",
    "SignalRefused",
    "SignalSent",
    "StacksDumped",
    "WorkerReaped",
    "WorkerSurvived",
]


#: The most characters of one line of a stack dump in the logged description.
MAX_DUMP_LINE: Final[int] = 240


@dataclass(frozen=True, slots=True, kw_only=True)
class StacksDumped(Event):
    """A stack dump was requested from the worker; ``text`` is ``None`` if none came,
    and then ``reason`` says why (no hook in the worker, no py-spy, timed out ...)."""

    kind: ClassVar[str] = "stacks_dumped"
    level: ClassVar[int] = logging.WARNING
    pid: int
    text: str | None
    step: int
    steps: int
    reason: str | None = None

    def describe(self) -> str:
        """The dump, after a line naming the task holding the loop when the dump says
        so; each line of the dump cut at :data:`MAX_DUMP_LINE` characters."""
        where = f"worker {self.pid} (step {self.step}/{self.steps})"
        if self.text is None:
            # The server's own explanation, which ends with what to do: kept whole but
            # for a pathological dump directory path.
            why = f": {clip(self.reason, MAX_DUMP_LINE * 2)}" if self.reason else ""
            return f"no stack dump from {where}{why}"
        held = holding_task(self.text)
        culprit = "" if held is None else f"; the loop is held by task {clip_scope(held[0])}"
        lines = clip_text(self.text).splitlines()
        dump = "\n".join(clip(line, MAX_DUMP_LINE) for line in lines)
        return f"stacks of {where}{culprit}:\n{dump}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalSent(Event):
    """A non-lethal step of a reap was delivered (step ``step`` of ``steps``), e.g. the
    soft signal before a grace period: the worker is not reaped yet, a
    :class:`WorkerReaped` follows for the lethal step (unless it exits first)."""

    kind: ClassVar[str] = "signal_sent"
    pid: int
    signal: int
    group: bool
    step: int
    steps: int

    def describe(self) -> str:
        """One human-readable line."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        return f"sent {signal_name(self.signal)} to {target} (step {self.step}/{self.steps})"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReaped(Event):
    """A signal was delivered to the worker (step ``step`` of ``steps`` of its plan).

    ``scopes`` are the worker's timers that led to or were cleared by this reap, the
    first :data:`MAX_REPORTED_SCOPES` of them; ``omitted`` says how many more there were.
    ``stacks`` is the stack dump taken earlier in the same plan (its
    :class:`StacksDumped` event has it too), ``None`` if the plan took none or none came.
    """

    kind: ClassVar[str] = "worker_reaped"
    level: ClassVar[int] = logging.WARNING
    pid: int
    signal: int
    group: bool
    scopes: tuple[str, ...]
    step: int
    steps: int
    stacks: str | None = None
    omitted: int = 0

    @property
    def culprit(self) -> tuple[str, str | None] | None:
        """The task that held the worker's loop and its open block, when the stack dump
        names them (see :func:`~aiotimer.events.holding_task`)."""
        return holding_task(self.stacks)

    def describe(self) -> str:
        """One bounded line, naming the task that held the loop first when the dump
        says which (the dump itself is in the ``stacks_dumped`` line)."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        sent = f"sent {signal_name(self.signal)} to {target} (step {self.step}/{self.steps})"
        held = self.culprit
        if held is None:
            dumped = "; stack dump attached" if self.stacks is not None else ""
            return f"{sent}; scopes: {scope_list(self.scopes, self.omitted)}{dumped}"
        task, block = held
        inside = "" if block is None else f" in block {clip_scope(block)}"
        return (
            f"{sent}: the loop was held by task {clip_scope(task)}{inside}; "
            f"{len(self.scopes) + self.omitted} open block(s) cleared"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapFailed(Event):
    """Signalling the worker failed; ``retry_in`` seconds until the next attempt.

    Never a success: a later :class:`WorkerReaped` or :class:`ReapAbandoned` follows.
    """

    kind: ClassVar[str] = "reap_failed"
    level: ClassVar[int] = logging.ERROR
    pid: int
    signal: int
    error: str
    attempt: int
    retry_in: float

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"could not send {signal_name(self.signal)} to worker {self.pid} "
            f"(attempt {self.attempt}): {clip(self.error)}; retrying in {self.retry_in:.2f}s"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapAbandoned(Event):
    """The server gave up signalling the worker (refused target or out of attempts).

    The worker stays watched: its exit is still reported by :class:`WorkerExited`.
    """

    kind: ClassVar[str] = "reap_abandoned"
    level: ClassVar[int] = logging.CRITICAL
    pid: int
    signal: int
    error: str
    attempts: int

    def describe(self) -> str:
        """One human-readable line."""
        return (
            f"gave up sending {signal_name(self.signal)} to worker {self.pid} after "
            f"{self.attempts} attempt(s): {clip(self.error)}; the worker may still be running"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSurvived(Event):
    """The worker was still alive ``waited`` seconds after the last signal of its plan.

    ``unkillable`` is true when that signal was SIGKILL (a process stuck in the kernel,
    e.g. in D state); the worker stays watched.
    """

    kind: ClassVar[str] = "worker_survived"
    level: ClassVar[int] = logging.CRITICAL
    pid: int
    signal: int
    unkillable: bool
    waited: float

    def describe(self) -> str:
        """One human-readable line."""
        what = "unkillable" if self.unkillable else "still running"
        return (
            f"worker {self.pid} is {what} {self.waited:g}s after "
            f"{signal_name(self.signal)}; it stays watched"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalRefused(Event):
    """The server refused to send a signal: the kill policy, the worker's identity or the
    kernel (``EPERM``, ``EINVAL``: permanent, never retried) said no; ``reason`` says
    which. ``fallback`` says what was done instead: ``"pid"`` when a refused group
    signal went to the worker alone, ``""`` when nothing was sent."""

    kind: ClassVar[str] = "signal_refused"
    level: ClassVar[int] = logging.ERROR
    pid: int
    signal: int
    group: bool
    reason: str
    fallback: str = ""

    def describe(self) -> str:
        """One human-readable line."""
        target = f"process group of worker {self.pid}" if self.group else f"worker {self.pid}"
        instead = "; sent to the worker alone instead" if self.fallback == "pid" else ""
        reason = clip(self.reason)
        return f"refused to send {signal_name(self.signal)} to {target}: {reason}{instead}"
