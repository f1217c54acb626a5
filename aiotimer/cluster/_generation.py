"""Job-wide restarts: the generation key, the decision to bump it, and what a node makes
of each value it reads there. Pure: no I/O, no clock reads.

How this works
--------------
In job scope every node's workers run under one job-wide *generation*, stored in
``/aiotimer/v1/<job>/generation`` as a :class:`GenerationRecord`; it is each worker's
``AIOTIMER_RESTART_COUNT``. When a node sees one of its workers fail during generation
``g``, it asks :func:`next_generation` what to write and writes it with a
compare-and-set on the key's revision (etcd transaction):

- the key already holds a generation past ``g``, or the job gave up: another node has
  restarted (or ended) the job for this same failure wave; write nothing;
- the job-wide budget (``max_restarts`` within ``window`` seconds, counted in wall time
  since nodes share no monotonic clock; times more than :data:`CLOCK_SKEW` ahead are
  not counted) still allows it: write ``max(stored, g) + 1``
  with the back-off delay every node waits before starting its workers again;
- otherwise write ``gave_up``: every node stops its workers and ends its run.

Every node watches the key and hands each value it reads to its
:class:`GenerationFollower`, which says what to do: restart the node's workers, give the
run up, write a value back, or nothing.

Generations only move forward
-----------------------------
The store is not to be trusted blindly: etcd may lose the key (restored from an old
snapshot, restarted on an empty data directory, an ``etcdctl del``), and whoever can
write to it can write anything there. Three rules keep job restarts working:

1. **A bump never goes back.** A writer bumps to ``max(stored, seen) + 1``: a node that
   ran generation ``g`` writes more than ``g`` whatever the store says, so followers,
   which act only on what is newer than what they know, see it.
2. **What a node knows is written back.** A follower that reads the key absent, not a
   valid record (garbage), or behind the record it knows writes back what it knows: the
   generation, the restart times the budget counts, a give-up (with a compare-and-set
   on the value it read, so concurrent followers write it once). A value behind it that
   it has never seen is a bump by a node that did not know the job's generation (one
   that joined after the store lost it): it becomes a bump to ``known + 1``, under the
   budget like any other.
3. **Every bump is paid from the budget.** A follower counts each bump it acts on in a
   ledger of its own, against the same ``max_restarts`` in ``window``. A real bump was
   allowed by its writer's count, so it fits; a bump the ledger has no room for (forged,
   or written by a node with another budget) ends the job as an exhausted budget does,
   instead of restarting every node outside any budget. The ledger's window is a
   little shorter than the writers' (:data:`LEDGER_SLACK`), so the time a value takes
   to reach a follower never makes it refuse a bump its writer allowed.

Give-ups are always obeyed: stopping is the safe direction.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from aiotimer.cluster._record import Count, Time
from aiotimer.supervisor import RestartPolicy

__all__ = [
    "CLOCK_SKEW",
    "LEDGER_SLACK",
    "MAX_GENERATION",
    "FollowStep",
    "GenerationFollower",
    "GenerationRecord",
    "next_generation",
]

#: The highest generation a record may hold (exact in every JSON reader).
MAX_GENERATION: Final[int] = 2**53 - 1
#: How far apart nodes' wall clocks may be: a restart time further in the future is not
#: counted (a forged list of future restarts cannot spend the budget in advance).
CLOCK_SKEW: Final[float] = 60.0
#: How much shorter a follower's budget window is than the writers' (seconds).
LEDGER_SLACK: Final[float] = 1.0
#: How many of the values it acted on a follower remembers (to tell a stale value
#: written back by a lagging node from a new bump).
_REMEMBERED: Final[int] = 64


class GenerationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The job-wide restart state (times are epoch seconds).

    ``restarts`` are the times of the restarts the budget still counts; ``node``,
    ``rank`` and ``reason`` say what caused the last bump; ``delay`` is the back-off
    every node waits before starting generation ``generation`` (a follower waits at
    most its own policy's back-off cap).
    """

    generation: Annotated[int, msgspec.Meta(ge=0, le=MAX_GENERATION)] = 0
    restarts: tuple[Time, ...] = ()
    at: Time | None = None
    node: str | None = None
    rank: Count | None = None
    reason: str = ""
    delay: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # clamped by the follower
    gave_up: str | None = None


def _who(node: str | None, rank: int | None) -> str:
    return f"node {node or '?'}" + ("" if rank is None else f" rank {rank}")


def _window_text(policy: RestartPolicy) -> str:
    return "" if math.isinf(policy.window) else f" in {policy.window:g}s"


def next_generation(
    current: GenerationRecord,
    *,
    seen: int,
    policy: RestartPolicy,
    now: float,
    u: float,
    node: str,
    rank: int | None,
    reason: str,
) -> GenerationRecord | None:
    """What to write after a failure during generation ``seen`` (None: nothing).

    Args:
        current: the record as read (``GenerationRecord()`` when the key is absent or
            holds no valid record).
        seen: the generation the failed worker ran under.
        policy: the job-wide budget (``max_restarts`` in ``window``) and back-off.
        now: wall-clock epoch seconds.
        u: uniform in ``[0, 1)``, for the back-off jitter.
        node, rank, reason: what failed, recorded for operators.
    """
    if current.gave_up is not None or current.generation > seen:
        return None
    horizon = now - policy.window
    counted = tuple(
        t
        for t in current.restarts
        if (math.isinf(policy.window) or t > horizon) and t <= now + CLOCK_SKEW
    )
    counted = counted[len(counted) - policy.max_restarts :] if policy.max_restarts else ()
    who = _who(node, rank)
    base = max(current.generation, seen)
    if len(counted) >= policy.max_restarts or base >= MAX_GENERATION:
        why = (
            f"job restart budget exhausted ({policy.max_restarts} restarts{_window_text(policy)})"
            if base < MAX_GENERATION
            else f"the job's generation is at its maximum ({MAX_GENERATION})"
        )
        return msgspec.structs.replace(
            current,
            generation=base,
            restarts=counted,
            at=now,
            node=node,
            rank=rank,
            reason=reason,
            delay=0.0,
            gave_up=f"{why}; {who}: {reason}",
        )
    return GenerationRecord(
        generation=base + 1,
        restarts=(*counted, now),
        at=now,
        node=node,
        rank=rank,
        reason=reason,
        delay=policy.backoff.delay(len(counted), u),
    )


@dataclass(frozen=True, slots=True)
class FollowStep:
    """What a follower makes of one value of the key (every field may be empty).

    ``write``: write this record back (compare-and-set on the value just read), then
    act on the rest. ``act``: the record to act on: a give-up (``gave_up`` set: end the
    node's run) or a newer generation (restart the node's workers at
    ``act.generation`` after ``act.delay``, already clamped). ``note``: what was
    detected, one line for the log.
    """

    write: GenerationRecord | None = None
    act: GenerationRecord | None = None
    note: str | None = None


class GenerationFollower:
    """One node's view of the generation key (see "Generations only move forward").

    Args:
        policy: the job-wide budget and back-off (the node's ``--max-restarts``,
            ``--restart-window`` and ``--backoff``).
        known: the record the node's workers started under; ``None``: the first valid
            value read is taken as it is (a node catching up).
    """

    def __init__(self, policy: RestartPolicy, known: GenerationRecord | None = None) -> None:
        self.policy = policy
        self.known = known
        self._ledger: collections.deque[float] = collections.deque()
        self._seen: collections.deque[GenerationRecord] = collections.deque(maxlen=_REMEMBERED)
        if known is not None:
            self._seen.append(known)

    def observe(self, stored: GenerationRecord | None, *, now: float) -> FollowStep:
        """The key was read holding ``stored`` (``None``: absent, or not a valid
        record) at monotonic time ``now``: what to do."""
        known = self.known
        if known is None:  # catching up: the record now, as it is
            current = GenerationRecord() if stored is None else stored
            self._remember(current)
            return FollowStep(act=self._clamped(current))
        if stored is None:
            if known == GenerationRecord():
                return FollowStep()
            return FollowStep(
                write=known,
                note=f"the generation key holds no valid record; writing back generation "
                f"{known.generation}",
            )
        if stored == known:
            return FollowStep()
        if known.gave_up is not None:  # this node has ended: keep the job ended
            if stored.gave_up is None:
                return FollowStep(write=known, note="the job's give-up was lost; writing it back")
            return FollowStep()
        if stored.gave_up is not None:
            self._remember(stored)
            return FollowStep(act=stored)
        if stored.generation > known.generation:
            return self._bump(stored, now, write=False)
        if stored in self._seen:  # a value this node saw before, written back by a laggard
            return FollowStep(
                write=known,
                note=f"the generation key went back to generation {stored.generation}; "
                f"writing back generation {known.generation}",
            )
        # A bump by a node that did not know the job's generation: carried forward.
        forward = msgspec.structs.replace(
            stored,
            generation=known.generation + 1,
            restarts=(*known.restarts, *(() if stored.at is None else (stored.at,))),
        )
        if forward.generation > MAX_GENERATION:
            forward = msgspec.structs.replace(forward, generation=MAX_GENERATION)
        return self._bump(forward, now, write=True, rewound=stored.generation)

    def _bump(
        self, record: GenerationRecord, now: float, *, write: bool, rewound: int | None = None
    ) -> FollowStep:
        policy = self.policy
        if not math.isinf(policy.window):
            horizon = now - max(policy.window - LEDGER_SLACK, policy.window / 2)
            while self._ledger and self._ledger[0] <= horizon:
                self._ledger.popleft()
        note = (
            None
            if rewound is None
            else f"a restart was written as generation {rewound}, behind this node's "
            f"{self.known.generation if self.known else 0}; carried forward as generation "
            f"{record.generation}"
        )
        if len(self._ledger) >= policy.max_restarts:
            record = msgspec.structs.replace(
                record,
                delay=0.0,
                gave_up=(
                    f"job restart budget exhausted ({policy.max_restarts} restarts"
                    f"{_window_text(policy)}): generation {record.generation} "
                    f"({_who(record.node, record.rank)}: {record.reason or 'no reason'}) "
                    "would be one more"
                ),
            )
            self._remember(record)
            return FollowStep(write=record, act=record, note=note)
        self._ledger.append(now)
        self._remember(record)
        return FollowStep(write=record if write else None, act=self._clamped(record), note=note)

    def _remember(self, record: GenerationRecord) -> None:
        self.known = record
        self._seen.append(record)

    def _clamped(self, record: GenerationRecord) -> GenerationRecord:
        cap = self.policy.backoff.cap
        return record if record.delay <= cap else msgspec.structs.replace(record, delay=cap)

    def __repr__(self) -> str:
        gen = None if self.known is None else self.known.generation
        return f"<GenerationFollower generation={gen} ledger={len(self._ledger)}>"
