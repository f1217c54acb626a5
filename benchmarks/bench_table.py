"""Timer-table cost per operation at 1k, 100k and 1M live timers.

Run from the repository root::

    python -m benchmarks.bench_table            # sizes 1k, 100k, 1M (under a minute)
    python -m benchmarks.bench_table --quick    # a fraction of a second, for a smoke run
    python -m benchmarks.bench_table --sizes 1000,10000 --rounds 20

Each table is pre-filled with ``size`` timers (64 per worker, deadlines spread over
[100, 1100) s) and then driven through a steady-state mix like a busy server's, one
*cycle* per request pair of a worker plus the server's own calls:

* acquire a new scope (deadline ``now + U(100, 1100)``);
* replace a scope acquired ``LAG // 2`` cycles ago (a re-armed timer);
* release the scope acquired ``LAG`` cycles ago;
* acquire a short timer that expires 4 cycles later;
* ``pop_expired(now)`` every 4th cycle (a few timers expire each time);
* ``next_deadline()`` (the server's sleep target).

The live count stays within ``size + LAG + [0, 4]``. Timer objects are built before
each timed block, so the figures are the table's own cost, tombstones and compaction
included.

The machine is shared and its load drifts, so the sizes are measured *interleaved*:
every round runs one block of cycles on each table in turn, and all sizes see the same
load. A size's block is ``max(20000, size // 6)`` cycles, so over the default 12 rounds
every table goes through about four heap compactions (one per ``size / 2`` cycles of 2
tombstones each). The headline is the amortised cost, total time over total operations
of all rounds, with its ratio to the smallest size; the best and median block are shown
too (a block that includes a compaction is slower than one that does not).

Then, per size, a *latency pass* times every cycle on its own over ``0.6 * size`` cycles
(enough to start at least one compaction) and reports the worst and the 99.99th
percentile cycle, and the worst of the cycles that ran part of a compaction: no single
call may stall the event loop for a whole heap rebuild. (A worst cycle outside
compactions is the machine: preemption, page faults.)
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from aiotimer.core._table import Timer, TimerTable
from benchmarks._util import format_table, gc_paused

#: Cycles between acquiring a dynamic scope and releasing it.
LAG = 64
#: Seconds the clock moves per cycle (the pre-filled timers never expire during a run).
TICK = 1e-6
#: Operations per cycle: 4 acquire/release calls, 1 next_deadline, 1/4 pop_expired.
OPS_PER_CYCLE = 5.25
TIMERS_PER_WORKER = 64
#: The fewest cycles in a timed block.
MIN_BLOCK = 20_000
TARGET_RATIO = 2.0


@dataclass(frozen=True, slots=True)
class Cycle:
    """The pre-built timers of one cycle."""

    new: Timer
    replacement: Timer
    release_pid: int
    release_scope: str
    short: Timer
    now: float
    pop: bool


def _timeout(rng: random.Random) -> float:
    return rng.uniform(100.0, 1100.0)


def prefill(size: int, rng: random.Random) -> TimerTable:
    """A table of ``size`` timers that do not expire during a run."""
    table = TimerTable()
    workers = max(1, size // TIMERS_PER_WORKER)
    for i in range(size):
        table.acquire(Timer(1 + i % workers, f"p{i}", _timeout(rng), 9))
    return table


class Planner:
    """Builds the timers of consecutive cycles (dynamic scopes ``d<j>``), block by block."""

    def __init__(self, workers: int, rng: random.Random) -> None:
        self._workers = workers
        self._rng = rng
        self._next = 0

    def block(self, cycles: int) -> list[Cycle]:
        """The next ``cycles`` cycles."""
        w, rng = self._workers, self._rng
        out: list[Cycle] = []
        for j in range(self._next, self._next + cycles):
            now = j * TICK  # the same expression for the same j: exact comparisons
            back = j - LAG // 2
            out.append(
                Cycle(
                    new=Timer(1 + j % w, f"d{j}", now + _timeout(rng), 9),
                    replacement=Timer(1 + back % w, f"d{back}", now + _timeout(rng), 9),
                    release_pid=1 + (j - LAG) % w,
                    release_scope=f"d{j - LAG}",
                    short=Timer(1 + j % w, f"x{j}", (j + 4) * TICK, 9),
                    now=now,
                    pop=j % 4 == 3,
                )
            )
        self._next += cycles
        return out


def drive(table: TimerTable, cycles: Sequence[Cycle]) -> int:
    """Run ``cycles`` against ``table``; return how many timers expired."""
    acquire, release = table.acquire, table.release
    pop_expired, next_deadline = table.pop_expired, table.next_deadline
    expired = 0
    for c in cycles:
        acquire(c.new)
        acquire(c.replacement)
        release(c.release_pid, c.release_scope)
        acquire(c.short)
        if c.pop:
            expired += len(pop_expired(c.now))
        next_deadline()
    return expired


def drive_timed(table: TimerTable, cycles: Sequence[Cycle]) -> tuple[list[float], list[bool]]:
    """Run ``cycles`` one at a time; return each cycle's seconds and whether a
    compaction was in progress during it."""
    seconds: list[float] = []
    compacting: list[bool] = []
    clock = time.perf_counter
    for c in cycles:
        was = table.compacting
        start = clock()
        drive(table, (c,))
        seconds.append(clock() - start)
        compacting.append(was or table.compacting)
    return seconds, compacting


@dataclass(slots=True)
class SizeRun:
    """One table under test and the timings of its blocks."""

    size: int
    table: TimerTable
    planner: Planner
    block_cycles: int
    seconds: list[float]
    cpu_seconds: list[float]
    cycle_seconds: list[float]
    cycle_compacting: list[bool]

    @classmethod
    def start(cls, size: int, seed: int) -> SizeRun:
        """A pre-filled table in its steady state (``LAG`` dynamic scopes live)."""
        rng = random.Random(seed)
        table = prefill(size, rng)
        planner = Planner(max(1, size // TIMERS_PER_WORKER), rng)
        drive(table, planner.block(2 * LAG))
        return cls(size, table, planner, max(MIN_BLOCK, size // 6), [], [], [], [])

    def run_block(self) -> None:
        """Build one block of cycles, then time driving the table through it."""
        block = self.planner.block(self.block_cycles)
        cpu, start = time.process_time(), time.perf_counter()
        drive(self.table, block)
        self.seconds.append(time.perf_counter() - start)
        self.cpu_seconds.append(time.process_time() - cpu)

    def run_latency_pass(self) -> None:
        """Time each of ``0.6 * size`` cycles (at least one compaction starts)."""
        cycles = self.planner.block(max(MIN_BLOCK, self.size * 6 // 10))
        self.cycle_seconds, self.cycle_compacting = drive_timed(self.table, cycles)

    def check(self) -> None:
        """The mix must have held the size steady."""
        if not self.size + LAG <= len(self.table) <= self.size + LAG + 4:
            raise AssertionError(f"live count drifted: {len(self.table)} for size {self.size}")

    @property
    def ops_per_block(self) -> float:
        """Table operations in one block."""
        return self.block_cycles * OPS_PER_CYCLE

    @property
    def amortised(self) -> float:
        """Seconds per operation over every block."""
        return sum(self.seconds) / (len(self.seconds) * self.ops_per_block)

    @property
    def amortised_cpu(self) -> float:
        """CPU seconds of this process per operation over every block (immune to waiting
        for a core on a loaded machine, not to the cache pollution of other processes)."""
        return sum(self.cpu_seconds) / (len(self.cpu_seconds) * self.ops_per_block)

    @property
    def worst_cycle(self) -> float:
        """Seconds of the slowest single cycle in the latency pass."""
        return max(self.cycle_seconds)

    @property
    def compactions(self) -> int:
        """Compactions started during the latency pass."""
        flags = [False, *self.cycle_compacting]
        return sum(now and not before for before, now in itertools.pairwise(flags))

    @property
    def worst_compacting_cycle(self) -> float:
        """Seconds of the slowest cycle that ran (part of) a compaction."""
        pairs = zip(self.cycle_seconds, self.cycle_compacting, strict=True)
        return max((sec for sec, compacting in pairs if compacting), default=0.0)

    @property
    def p9999_cycle(self) -> float:
        """The 99.99th percentile of single-cycle seconds in the latency pass."""
        ordered = sorted(self.cycle_seconds)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9999))]

    @property
    def best(self) -> float:
        """Seconds per operation in the fastest block."""
        return min(self.seconds) / self.ops_per_block

    @property
    def median(self) -> float:
        """Seconds per operation in the median block."""
        return statistics.median(self.seconds) / self.ops_per_block


def measure(sizes: Sequence[int], rounds: int, *, keep_gc: bool, seed: int) -> list[SizeRun]:
    """Drive one table per size, interleaved, for ``rounds`` rounds."""
    runs = [SizeRun.start(size, seed) for size in sizes]
    with nullcontext() if keep_gc else gc_paused():
        for _ in range(rounds):
            for run in runs:
                run.run_block()
        for run in runs:
            run.run_latency_pass()
    for run in runs:
        run.check()
    return runs


def parse_sizes(text: str) -> list[int]:
    """``"1000,100_000,1e6"`` -> ``[1000, 100000, 1000000]``."""
    sizes = [int(float(s.replace("_", ""))) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be positive integers")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table with ratios to the smallest size."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_table", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and runs (smoke test)")
    parser.add_argument("--sizes", type=parse_sizes, help="comma-separated live-timer counts")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 12)")
    parser.add_argument("--gc", action="store_true", help="keep the cyclic GC on while timing")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = args.sizes or ([1_000, 10_000] if args.quick else [1_000, 100_000, 1_000_000])
    rounds = args.rounds or (2 if args.quick else 12)

    print(
        f"timer table, mixed operations ({OPS_PER_CYCLE} ops/cycle), sizes interleaved over "
        f"{rounds} rounds, GC {'on' if args.gc else 'paused'} while timing"
    )
    runs = measure(sizes, rounds, keep_gc=args.gc, seed=args.seed)
    base = runs[0]
    rows = [
        [
            f"{r.size:,}",
            f"{r.block_cycles * rounds:,}",
            f"{1 / r.amortised / 1e6:.2f}",
            f"{r.amortised * 1e9:.0f}",
            f"{r.best * 1e9:.0f}",
            f"{r.median * 1e9:.0f}",
            f"{r.amortised / base.amortised:.2f}x",
            f"{r.median / base.median:.2f}x",
            f"{r.table.heap_size:,}",
        ]
        for r in runs
    ]
    headers = [
        "live timers",
        "cycles",
        "Mops/s",
        "ns/op",
        "best block",
        "median block",
        "ns/op vs first",
        "median vs first",
        "heap at end",
    ]
    print(format_table(headers, rows))
    print("\nlatency pass: every cycle (4 acquire/release, 1 next_deadline, 1/4 pop) timed alone")
    print(
        format_table(
            [
                "live timers",
                "cycles",
                "compactions",
                "p99.99 cycle us",
                "worst cycle us",
                "worst compacting cycle us",
            ],
            [
                [
                    f"{r.size:,}",
                    f"{len(r.cycle_seconds):,}",
                    str(r.compactions),
                    f"{r.p9999_cycle * 1e6:.1f}",
                    f"{r.worst_cycle * 1e6:.1f}",
                    f"{r.worst_compacting_cycle * 1e6:.1f}",
                ]
                for r in runs
            ],
        )
    )
    last = runs[-1]
    ratio = last.amortised / base.amortised
    verdict = "within" if ratio < TARGET_RATIO else "NOT within"
    print(
        f"cost per op at {last.size:,} live timers = {ratio:.2f}x the cost at {base.size:,} "
        f"(amortised; median block {last.median / base.median:.2f}x, best block "
        f"{last.best / base.best:.2f}x, CPU time {last.amortised_cpu / base.amortised_cpu:.2f}x): "
        f"{verdict} the {TARGET_RATIO:.0f}x target"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
