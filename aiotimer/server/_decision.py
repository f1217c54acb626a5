"""The rule before an expiry, as a pure step of the server's machine
(:mod:`aiotimer.server._machine`): whose input must be applied before the timers due at
a decision's instant are acted on. Pure: no I/O, no clock.

The rule: before a worker is acted on at deadline ``D``, everything its transport held
for it at ``D`` is applied; a release sent before the deadline always wins. A
:class:`Decision` is made at one instant (``at``); the engine's sources bound what they
hold at that instant (:meth:`~aiotimer.sources._base.Drain.hold`), and the decision,
given the workers due at ``at`` (which applying input changes: a release takes a worker
out, an acquire that has expired already puts one in), answers each time either "look
for these workers first" (:class:`Look`) or "act" (``None``). It answers "act" only once
every worker due at ``at`` has been looked for and the drains are done with them, so a
budget never decides; the shell only spreads the work over turns of the loop (the reap
is late, never wrong: :mod:`aiotimer.server._drains`). It terminates: each
:class:`Look` names at least one worker not looked for before, and after a look for
anyone it answers "act".
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass

__all__ = ["Decision", "Look"]


@dataclass(frozen=True, slots=True)
class Look:
    """Look for these workers' input in every drain, and apply it, before acting."""

    pids: frozenset[int] | None
    """The workers (``None``: anyone, as too many are due to name them)."""


class Decision:
    """One decision at instant ``at`` (see the module docs)."""

    __slots__ = ("_looked", "at")

    def __init__(self, at: float) -> None:
        self.at = at
        self._looked: set[int] | None = set()  # None: looked for anyone

    def next(self, due: AbstractSet[int] | None) -> Look | None:
        """The input still to apply before acting on the workers ``due`` at :attr:`at`
        now (``None``: too many to name), the drains being done with every earlier
        :class:`Look`: a new :class:`Look`, or ``None``: act."""
        looked = self._looked
        if looked is None:
            return None
        if due is None:
            self._looked = None
            return Look(None)
        new = frozenset(due - looked)
        if not new:
            return None
        looked |= new
        return Look(new)

    def looked_for(self, pid: int) -> bool:
        """Whether ``pid``'s input was looked for (or anyone's)."""
        return self._looked is None or pid in self._looked

    def __repr__(self) -> str:
        looked = "anyone" if self._looked is None else f"{len(self._looked)} workers"
        return f"<Decision at={self.at:.6f} looked for {looked}>"
