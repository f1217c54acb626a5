"""Shared helpers for the benchmarks: timing with repeats, and a plain text table."""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "CpuMeter",
    "GcPauses",
    "Timing",
    "format_table",
    "gc_paused",
    "time_repeated",
]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds per run over several repeats of the same work of ``units`` units."""

    runs: tuple[float, ...]
    units: int

    @property
    def best(self) -> float:
        """Seconds per unit in the fastest run (the least disturbed by other load)."""
        return min(self.runs) / self.units

    @property
    def median(self) -> float:
        """Seconds per unit in the median run."""
        return statistics.median(self.runs) / self.units

    @property
    def rate(self) -> float:
        """Units per second in the fastest run."""
        return 1.0 / self.best


class GcPauses:
    """Records the cyclic GC's pauses, per generation, while used as a context manager
    (through :data:`gc.callbacks`)."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._start)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> str:
        """``gen0 n=.. max=..ms, gen1 ..., gen2 ...``."""
        return ", ".join(
            f"gen{g} n={len(p)} max={max(p, default=0.0) * 1e3:.1f}ms"
            for g, p in self.pauses.items()
        )


def wake_first() -> bool:
    """Make this process, which from now on only waits (for a reap signal, say), run
    first when its wait ends: the lowest ``SCHED_FIFO`` priority, where permitted (root or
    ``CAP_SYS_NICE``); ``False`` where not. Its signal's arrival is then timed when it
    happens, not when a busy host next gives it a turn (up to ~30 ms later at load 4).
    Never call it before a loop: at that priority a loop would starve the server."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        return False
    return True


def woken(*, idle: bool = False) -> None:
    """Undo :func:`wake_first` once the wait it was for has ended (its time taken):
    whatever the process does next (its exit, say) competes for a CPU like any other,
    instead of preempting the server it measures; ``idle``: runs only when nothing else
    wants the CPU (``SCHED_IDLE``; for a probe whose exit is not measured)."""
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic GC for the timed section, as :mod:`timeit` does."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_repeated(
    run: Callable[[int], object], *, units: int, repeat: int, keep_gc: bool = False
) -> Timing:
    """Call ``run(i)`` for ``i`` in ``range(repeat)``; each call does ``units`` units.

    Each call is timed with :func:`time.perf_counter`; the GC is paused during each
    call unless ``keep_gc``.
    """
    runs: list[float] = []
    for i in range(repeat):
        if keep_gc:
            start = time.perf_counter()
            run(i)
            runs.append(time.perf_counter() - start)
        else:
            with gc_paused():
                start = time.perf_counter()
                run(i)
                runs.append(time.perf_counter() - start)
    return Timing(tuple(runs), units)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Right-aligned columns under ``headers``, first column left-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        parts = [str(first).ljust(widths[0])]
        parts += [str(c).rjust(w) for c, w in zip(rest, widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


class CpuMeter:
    """The CPU time process ``pid`` spends between two readings, to the nanosecond.

    ``/proc/PID/stat`` counts whole clock ticks (10 ms): a server that runs a few ms per
    second reads as 0 % or twice its share over a few seconds. Each thread's
    ``/proc/PID/task/TID/schedstat`` holds its run time in nanoseconds, but a thread that
    exits takes its own with it; so a reading is the threads' sum when the same threads
    ran throughout, else the ticks.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = self._read()

    def _read(self) -> tuple[dict[int, int], float]:
        threads = {}
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            with (
                contextlib.suppress(OSError),
                open(f"/proc/{self.pid}/task/{tid}/schedstat", "rb") as f,
            ):
                threads[int(tid)] = int(f.read().split()[0])
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return threads, ticks

    def restart(self) -> None:
        """Measure from now on."""
        self._start = self._read()

    def seconds(self) -> float:
        """CPU seconds since the start (or the last :meth:`restart`)."""
        (before, ticks0), (after, ticks1) = self._start, self._read()
        if before.keys() <= after.keys():
            return sum(after[t] - before.get(t, 0) for t in after) / 1e9
        return ticks1 - ticks0
