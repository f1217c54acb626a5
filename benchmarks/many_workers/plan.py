"""The workload, planned before anything runs: pure data, the same for every server.

Each worker *slot* runs timed blocks at ``rate`` per second over ``duration`` seconds
(evenly spaced, each slot with its own random phase). A block has the run's ``timeout``
and does ``work`` seconds of work, drawn uniformly from ``WORK_RANGE`` times the timeout,
then releases, so it finishes well before its deadline. ``hangs`` blocks of the run,
spread uniformly over slots and time, hang instead: the worker stops in that block and
stays there until a server reaps it. Every ``PROBE_EVERY``-th hang is an *ingest probe*:
its deadline is the moment its acquire is written (an already-expired timer), so its
latency measures write -> applied -> signalled rather than deadline -> signalled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["PROBE_EVERY", "WORK_RANGE", "Block", "Workload", "plan_slots"]

#: A normal block works for this fraction of its timeout (uniform), then releases.
WORK_RANGE = (0.05, 0.3)
#: Every PROBE_EVERY-th planned hang is an ingest probe (deadline = its write time).
PROBE_EVERY = 4


@dataclass(frozen=True, slots=True)
class Workload:
    """What every slot of one run does."""

    workers: int
    duration: float  # seconds of planned blocks
    rate: float  # blocks per second per slot
    timeout: float  # seconds from a block's planned start to its deadline
    hangs: int  # planned hanging blocks in the whole run
    seed: int

    @property
    def live_timers(self) -> float:
        """Mean number of timers open at once over the whole run (planned)."""
        mean_work = sum(WORK_RANGE) / 2 * self.timeout
        return self.workers * self.rate * mean_work  # Little's law


@dataclass(frozen=True, slots=True)
class Block:
    """One timed block of a slot, times relative to the run's start."""

    start: float
    work: float  # seconds before its release (normal blocks)
    hang: bool = False
    probe: bool = False  # a hang whose deadline is its write time


def plan_slots(load: Workload) -> list[list[Block]]:
    """Every slot's blocks, in start order (deterministic for ``load.seed``)."""
    rng = random.Random(load.seed)
    step = 1.0 / load.rate
    slots: list[list[Block]] = []
    for _ in range(load.workers):
        phase = rng.uniform(0.0, step)
        count = int((load.duration - phase) / step)
        slots.append(
            [
                Block(phase + k * step, rng.uniform(*WORK_RANGE) * load.timeout)
                for k in range(max(count, 0))
            ]
        )
    # Hangs: a uniformly random slot and time each; the first block at or after it hangs.
    for h in range(load.hangs):
        blocks = slots[rng.randrange(load.workers)]
        at = rng.uniform(0.0, load.duration)
        k = next((i for i, b in enumerate(blocks) if b.start >= at and not b.hang), None)
        if k is not None:
            b = blocks[k]
            blocks[k] = Block(b.start, b.work, hang=True, probe=h % PROBE_EVERY == PROBE_EVERY - 1)
    return slots
