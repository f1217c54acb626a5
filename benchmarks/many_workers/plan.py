"""The workload, planned before anything runs: pure data, the same for every server.

Each worker *slot* runs timed blocks at ``rate`` per second over ``duration`` seconds
(evenly spaced, each slot with its own random phase). A block has the run's ``timeout``
and does ``work`` seconds of work, drawn uniformly from ``WORK_RANGE`` times the timeout
(or times ``work_of`` seconds: a training loop's step, whose block ends within it),
then releases, so it finishes well before its deadline. ``hangs`` blocks of the run,
spread uniformly over slots and time, hang instead: the worker stops in that block and
stays there until a server reaps it. Every ``PROBE_EVERY``-th hang is an *ingest probe*:
its deadline is the moment its acquire is written (an already-expired timer), so its
latency measures write -> applied -> signalled rather than deadline -> signalled.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["PROBE_EVERY", "WORKLOADS", "WORK_RANGE", "Block", "Preset", "Workload", "plan_slots"]

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
    work_of: float | None = None  # seconds WORK_RANGE is a fraction of (None: timeout)

    @property
    def work_scale(self) -> float:
        """Seconds a block's work is a fraction of (:data:`WORK_RANGE`)."""
        return self.timeout if self.work_of is None else self.work_of

    @property
    def live_timers(self) -> float:
        """Mean number of timers open at once over the whole run (planned)."""
        mean_work = sum(WORK_RANGE) / 2 * self.work_scale
        return self.workers * self.rate * mean_work  # Little's law


@dataclass(frozen=True, slots=True)
class Preset:
    """A named workload: what it models, and its rate, timeout and hangs."""

    models: str
    rate: float  # blocks per second per worker
    timeout: float
    hangs: int | None  # None: the harness's default (200; quick 60)


#: ``--workload`` presets (explicit ``--rate``/``--timeout``/``--hangs`` override them).
WORKLOADS: dict[str, Preset] = {
    "training": Preset(
        "a training loop: 1 block per step, 2 steps/s, 60 s timeouts, no hangs",
        rate=2.0,
        timeout=60.0,
        hangs=0,
    ),
    "stress": Preset(
        "a stress test: 10 blocks/s, 0.5 s timeouts, hangs throughout",
        rate=10.0,
        timeout=0.5,
        hangs=None,
    ),
}


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
                Block(phase + k * step, rng.uniform(*WORK_RANGE) * load.work_scale)
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
