"""The quota's cost at a full table (``aiotimer/server/_quota.py``), per admission.

Run from the repository root::

    python -m benchmarks.bench_quota                  # 1k and 10k workers
    python -m benchmarks.bench_quota --quick          # a fraction of a second
    python -m benchmarks.bench_quota --workers 10000 --rounds 2000

A table of ``workers`` workers holding 4 timers each is full (``max_timers`` = their
sum). Ten of them are one user's (the victims), the rest another's (the flood). Each
row shows, in this thread's CPU time (``time.thread_time``, so a loaded host inflates
the figures less than wall time would):

* ``scan``: the first admission, which makes the tally (one scan of the workers);
* ``victim``: an admission of a victim, which evicts one of the flood's timers;
* ``refusal``: a refused acquire of one of the flood's workers;
* ``changed``: an admission right after the table changed outside the quota (a release
  and a new acquire), which makes the tally again: what a flood that keeps releasing
  and acquiring at a full table costs per acquire.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from aiotimer.core._table import Timer, TimerTable
from aiotimer.server._quota import Quota

VICTIMS = 10
PER_WORKER = 4


def _full(workers: int) -> tuple[TimerTable, Quota]:
    table = TimerTable()
    quota = Quota(table, max_timers=workers * PER_WORKER, max_per_worker=1000)
    for pid in range(1, workers + 1):
        quota.own(pid, 0 if pid <= VICTIMS else 65534)
        for i in range(PER_WORKER):
            table.acquire(Timer(pid, f"s{i}", 100.0, 9))
            quota.added += 1
    return table, quota


def _admit(table: TimerTable, quota: Quota, pid: int, scope: str) -> None:
    admission = quota.admit(pid)
    if admission.refused is None:
        if admission.evict is not None:
            table.release(*admission.evict)
        if table.acquire(Timer(pid, scope, 100.0, 9)) is None:
            quota.added += 1


def measure(workers: int, rounds: int) -> tuple[float, float, float, float]:
    """(scan s, victim s, refusal s, changed s) per admission."""
    clock = time.thread_time
    table, quota = _full(workers)
    start = clock()
    quota.admit(1)
    scan = clock() - start
    start = clock()
    for k in range(rounds):
        _admit(table, quota, 1 + k % VICTIMS, f"v{k}")
    victim = (clock() - start) / rounds
    start = clock()
    for k in range(rounds):
        quota.admit(VICTIMS + 1 + k % (workers - VICTIMS))
    refusal = (clock() - start) / rounds
    changes = max(1, rounds // 20)
    start = clock()
    for k in range(changes):
        pid = VICTIMS + 1 + k % (workers - VICTIMS)
        table.release(pid, next(iter(table.live_scopes(pid))))
        _admit(table, quota, pid, f"c{k}")  # the table not full: no admission needed
        quota.admit(pid)
    changed = (clock() - start) / changes
    return scan, victim, refusal, changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1000,10000", help="comma-separated sizes")
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="1,000 workers, 200 rounds")
    args = parser.parse_args(argv)
    sizes = [1000] if args.quick else [int(n) for n in args.workers.split(",")]
    rounds = 200 if args.quick else args.rounds
    print(f"{'workers':>8} {'scan ms':>9} {'victim us':>10} {'refusal us':>11} {'changed ms':>11}")
    for workers in sizes:
        scan, victim, refusal, changed = measure(workers, rounds)
        print(
            f"{workers:>8,} {scan * 1e3:>9.2f} {victim * 1e6:>10.1f} {refusal * 1e6:>11.1f} "
            f"{changed * 1e3:>11.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
