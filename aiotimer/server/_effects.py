"""What the server's machine (:mod:`aiotimer.server._machine`) asks its shell to do:
typed, frozen records. Pure: no I/O.

Two kinds. *Effects* are carried out and forgotten: :class:`JournalAcquired` and its
siblings (tell the journal a change), :class:`ProceedReap` (carry on a reap begun),
:class:`Arm` (set the alarm), and every :class:`~aiotimer.events.Event` (emit it: an
event is its own effect). *Questions* need an answer before the machine goes on, and
are always the last record of what a step returns: :class:`Pin` (answered by
:meth:`~aiotimer.server._machine.Machine.pinned` or
:meth:`~aiotimer.server._machine.Machine.unattached`), :class:`ActOn` (answered by
:meth:`~aiotimer.server._machine.Machine.acted` with an :class:`Acted`) and
:class:`NeedInput` (answered by
:meth:`~aiotimer.server._machine.Machine.input_taken`, possibly turns of the loop later,
once the drains are done with it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # for types only: the records import nothing at run time
    from aiotimer.core import Timer
    from aiotimer.events import Event
    from aiotimer.reapers import Step

__all__ = [
    "ActOn",
    "Acted",
    "Arm",
    "Effect",
    "JournalAcquired",
    "JournalCleared",
    "JournalForgot",
    "JournalReleased",
    "MachineError",
    "NeedInput",
    "Pin",
    "ProceedReap",
    "Question",
]


class MachineError(RuntimeError):
    """An input the machine's state does not allow (the shell's bug): an answer to a
    question it did not ask, or a new input while a question is open."""


# -- questions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pin:
    """Start watching worker ``pid`` (its first acquire; ``start_time`` as its request
    said), then answer with its user (:meth:`Machine.pinned`: pinned, or kept unpinned
    for lack of file descriptors) or :meth:`Machine.unattached` (the reaper cannot
    attach it: its requests are reported as unknown)."""

    pid: int
    start_time: int | None


@dataclass(frozen=True, slots=True)
class ActOn:
    """``timer`` of a watched worker expired at ``now``: pin its worker again if it is
    unpinned, then begin a reap with ``plan`` (an empty plan, asked only for an
    unpinned worker: report only; ``due`` is when the server could first act, for the
    reap latency), and answer how it went (:class:`Acted`). A first signal leaves here,
    before the expiry is reported."""

    timer: Timer
    plan: tuple[Step, ...]
    now: float
    due: float


class Acted(enum.Enum):
    """What became of an :class:`ActOn` (told back to the machine)."""

    #: A reap began: it covers the worker's other timers, and goes on at ProceedReap.
    BEGUN = "begun"
    #: A reap began and its first signal was refused: it covers this timer alone.
    REFUSED = "refused"
    #: The worker is pinned and nothing began: an empty plan, or a reap in progress.
    NOT_BEGUN = "not begun"
    #: The worker is still unpinned (out of file descriptors): report only.
    UNPINNED = "unpinned"
    #: Pinning it again found it gone (its exit is reported on its own).
    GONE = "gone"
    #: The worker is not watched (any more): as for the server's own process.
    UNWATCHED = "unwatched"


@dataclass(frozen=True, slots=True)
class NeedInput:
    """Before deciding, apply what the drains hold for workers ``pids`` (``None``:
    anyone): hand each batch they return to :meth:`Machine.submit`, then answer
    :meth:`Machine.input_taken`. ``hold``: a new decision, the drains bound what they
    hold now first (see :mod:`aiotimer.sources._base`)."""

    pids: frozenset[int] | None
    hold: bool


Question = Pin | ActOn | NeedInput


# -- effects -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProceedReap:
    """Report the first action of the reap begun on ``pid`` and carry the rest of it
    out; it clears ``scopes`` (and ``omitted`` more, not listed)."""

    pid: int
    scopes: tuple[str, ...]
    omitted: int


@dataclass(frozen=True, slots=True)
class Arm:
    """Set the alarm to the monotonic ``deadline`` (``math.inf``: never)."""

    deadline: float


@dataclass(frozen=True, slots=True)
class JournalAcquired:
    """Tell the journal: ``timer`` was set."""

    timer: Timer


@dataclass(frozen=True, slots=True)
class JournalReleased:
    """Tell the journal: timer ``(pid, scope_id)`` left the table."""

    pid: int
    scope_id: str


@dataclass(frozen=True, slots=True)
class JournalCleared:
    """Tell the journal: a reap cleared worker ``pid``'s timers."""

    pid: int


@dataclass(frozen=True, slots=True)
class JournalForgot:
    """Tell the journal: worker ``pid`` has gone."""

    pid: int


if TYPE_CHECKING:
    #: Everything a step of the machine returns (an event is its own effect).
    Effect: TypeAlias = (
        Event
        | ProceedReap
        | Arm
        | JournalAcquired
        | JournalReleased
        | JournalCleared
        | JournalForgot
        | Pin
        | ActOn
        | NeedInput
    )
