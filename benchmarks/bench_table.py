"""Timer-table cost per operation at 1k, 100k and 1M live timers.

Run from the repository root::

    python -m benchmarks.bench_table            # sizes 1k, 100k, 1M
    python -m benchmarks.bench_table --quick    # seconds, for a smoke run
    python -m benchmarks.bench_table --sizes 1000,10000

The table is pre-filled with ``size`` timers (64 per worker, deadlines spread over
[100, 1100) s) and then driven through a steady-state mix like a busy server's, one
*cycle* per request pair of a worker plus the server's own calls:

* acquire a new scope (deadline ``now + U(100, 1100)``);
* replace a scope acquired ``LAG // 2`` cycles ago (a re-armed timer);
* release the scope acquired ``LAG`` cycles ago;
* acquire a short timer that expires 4 cycles later;
* ``pop_expired(now)`` every 4th cycle (a few timers expire each time);
* ``next_deadline()`` (the server's sleep target).

The live count stays within ``size + LAG + [0, 4]``. Timer objects are built before timing, so
the figures are the table's own cost, tombstones and compaction included. The cost per
operation is the run time divided by the operations it made; the best of ``--repeat``
runs is reported (the median too) with the ratio to the smallest size. A run lasts at
least ``size`` cycles, so that at every size it spans about two heap compactions (a
compaction comes after about ``size / 2`` cycles of 2 tombstones each) and their
amortised cost is counted fairly.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from aiotimer._table import Timer, TimerTable
from benchmarks._util import Timing, format_table, gc_paused

#: Cycles between acquiring a dynamic scope and releasing it.
LAG = 64
#: Seconds the clock moves per cycle (the pre-filled timers never expire during a run).
TICK = 1e-6
#: Operations per cycle: 4 acquire/release calls, 1 next_deadline, 1/4 pop_expired.
OPS_PER_CYCLE = 5.25
TIMERS_PER_WORKER = 64
#: Cycles built (untimed) at a time, to bound memory at 1M timers.
BLOCK = 50_000
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


@dataclass(frozen=True, slots=True)
class SizeResult:
    """Cost per operation at one table size."""

    size: int
    cycles: int
    timing: Timing
    heap_size: int
    setup_s: float


def measure(size: int, cycles: int, repeat: int, *, keep_gc: bool, seed: int) -> SizeResult:
    """Cost per mixed operation with ``size`` live timers, ``cycles`` cycles per run.

    Only :func:`drive` is timed; the cycles are built between timed blocks.
    """
    rng = random.Random(seed)
    start = time.perf_counter()
    table = prefill(size, rng)
    planner = Planner(max(1, size // TIMERS_PER_WORKER), rng)
    drive(table, planner.block(2 * LAG))  # reach the steady state: LAG dynamic scopes live
    setup_s = time.perf_counter() - start
    runs: list[float] = []
    with nullcontext() if keep_gc else gc_paused():
        for _ in range(repeat):
            elapsed, left = 0.0, cycles
            while left:
                block = planner.block(min(BLOCK, left))
                t0 = time.perf_counter()
                drive(table, block)
                elapsed += time.perf_counter() - t0
                left -= len(block)
            runs.append(elapsed)
    if not size + LAG <= len(table) <= size + LAG + 4:  # the mix must hold the size steady
        raise AssertionError(f"live count drifted: {len(table)} timers for size {size}")
    timing = Timing(tuple(runs), round(cycles * OPS_PER_CYCLE))
    return SizeResult(size, cycles, timing, table.heap_size, setup_s)


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
    parser.add_argument(
        "--cycles",
        type=int,
        help="minimum cycles per timed run (default 20000; runs last "
        "at least `size` cycles so that each spans a couple of heap compactions)",
    )
    parser.add_argument("--repeat", type=int, help="timed runs per size (default 3)")
    parser.add_argument("--gc", action="store_true", help="keep the cyclic GC on while timing")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = args.sizes or ([1_000, 10_000] if args.quick else [1_000, 100_000, 1_000_000])
    min_cycles = args.cycles or (400 if args.quick else 20_000)
    repeat = args.repeat or (2 if args.quick else 3)

    print(
        f"timer table, mixed operations ({OPS_PER_CYCLE} ops/cycle, max({min_cycles:,}, size) "
        f"cycles x {repeat} runs per size, GC {'on' if args.gc else 'paused'} while timing)"
    )
    results = [
        measure(n, max(min_cycles, n), repeat, keep_gc=args.gc, seed=args.seed) for n in sizes
    ]
    base = results[0].timing
    rows = [
        [
            f"{r.size:,}",
            f"{r.cycles:,}",
            f"{r.timing.rate / 1e6:.2f}",
            f"{r.timing.best * 1e9:.0f}",
            f"{r.timing.median * 1e9:.0f}",
            f"{r.timing.best / base.best:.2f}x",
            f"{r.timing.median / base.median:.2f}x",
            f"{r.heap_size:,}",
        ]
        for r in results
    ]
    headers = [
        "live timers",
        "cycles/run",
        "Mops/s",
        "ns/op best",
        "ns/op median",
        "best vs first",
        "median vs first",
        "heap at end",
    ]
    print(format_table(headers, rows))
    last = results[-1]
    ratio = last.timing.best / base.best
    verdict = "within" if ratio < TARGET_RATIO else "NOT within"
    print(
        f"cost per op at {last.size:,} live timers = {ratio:.2f}x the cost at "
        f"{results[0].size:,} (median {last.timing.median / base.median:.2f}x); "
        f"{verdict} the {TARGET_RATIO:.0f}x target"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
