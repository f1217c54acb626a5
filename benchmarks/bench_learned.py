"""Learned timeouts against a fixed one: false kills over a long run with heavy-tailed
step durations, and how soon a hang after it is reaped.

Run::

    python -m benchmarks.bench_learned                 # 2,000 steps, 5 seeds
    python -m benchmarks.bench_learned --quick         # 300 steps, 1 seed

Each run drives the real server (``TimerServer``: ingest, the learned deadline, expiry)
on a fake clock, so 2,000 steps take a fraction of a second and every figure is exact
rather than subject to this machine's load. A worker runs ``--steps`` blocks of scope
``"step"`` whose durations are lognormal (median ``--median``, ``--sigma``: 1.0 puts
1% of the steps above 10x the median and the longest of 2,000 near 25x), with a
checkpoint step ``--checkpoint`` times the median every ``--checkpoint-every`` steps (a
phase change in the same scope), then hangs in one more block. Two timeouts are
compared on the very same durations:

* **learned**: ``expires(after=learned(initial=--initial), scope="step")`` (defaults
  otherwise: factor 5, the observed maximum, floor 1 s, warm-up 20);
* **fixed 10x median**: ``expires(after=10 x median)``, the common "ten times a
  typical step";
* **fixed 10x longest**: ``expires(after=10 x the longest step of the run)``, chosen in
  hindsight (no run knows its longest step before it ends).

A *false kill* is a healthy step whose timer expired (the server would have reaped it);
the *hang latency* is from the hung block's start to its expiry.
"""

from __future__ import annotations

import argparse
import functools
import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from aiotimer import Request, learned
from aiotimer.events import Event, TimerExpired
from aiotimer.server import TimerServer
from aiotimer.testing import FakeClock, MemorySource, RecordingReaper
from benchmarks._util import format_table

KILL = int(signal.SIGKILL)
WORKER = (1 << 22) + 77  # a pid no Linux process has (above PID_MAX_LIMIT)
TICK = (1 << 22) + 78  # a second one, whose empty releases make the server look at its clock


@dataclass(frozen=True, slots=True)
class Outcome:
    """One timeout's run: false kills, the hang's latency, the value at the end."""

    false_kills: int
    hang_latency: float
    timeout_at_end: float


def durations(steps: int, args: argparse.Namespace, seed: int) -> list[float]:
    """The steps' durations: lognormal, with a checkpoint step now and then."""
    rng = random.Random(seed)
    out = []
    for i in range(1, steps + 1):
        if args.checkpoint_every and i % args.checkpoint_every == 0:
            out.append(args.median * args.checkpoint)
        else:
            out.append(args.median * rng.lognormvariate(0.0, args.sigma))
    return out


async def run(steps: list[float], *, learned_initial: float | None, fixed: float) -> Outcome:
    """Drive one server through ``steps`` then a hang; count what expired."""
    clock, source, events = FakeClock(), MemorySource(), list[Event]()
    spec = None if learned_initial is None else learned(learned_initial)
    after = fixed if spec is None else spec.initial

    def acquire() -> Request:
        return Request(
            WORKER,
            "step",
            clock.time() + after,
            KILL,
            mono=clock.monotonic() + after,
            learned=spec,
        )

    def tick() -> None:
        source.push(Request(TICK, "tick", -1, 0))  # expiries due by now are handled

    async with TimerServer(
        sources=[source], clock=clock, reaper=RecordingReaper(), on_event=events.append
    ) as server:
        for took in steps:
            source.push(acquire())
            clock.advance(took)
            tick()  # a deadline passed within the step expires before its release
            source.push(Request(WORKER, "step", -1, 0))
        false_kills = sum(isinstance(e, TimerExpired) for e in events)
        source.push(acquire())  # the hang
        [timer] = server.get_state().timers  # seconds_left: from the hang's start
        clock.advance(timer.seconds_left)
        tick()
        [*_, hang] = [e for e in events if isinstance(e, TimerExpired)]
        assert hang.scope_id == "step"
        return Outcome(false_kills, timer.seconds_left, timer.seconds_left)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparison; print one row per seed and timeout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--median", type=float, default=0.05, help="seconds (default 0.05)")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma (default 1)")
    parser.add_argument("--checkpoint", type=float, default=40.0, help="x median (default 40)")
    parser.add_argument("--checkpoint-every", type=int, default=500, help="steps (0: none)")
    parser.add_argument("--initial", type=float, default=600.0, help="learned initial (600)")
    parser.add_argument("--quick", action="store_true", help="300 steps, 1 seed")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.seeds = 300, 1
    fixed = 10 * args.median
    rows: list[tuple[str, ...]] = []
    totals: dict[str, int] = {}
    for seed in range(args.seeds):
        steps = durations(args.steps, args, seed)
        ways: list[tuple[str, float | None, float]] = [
            (f"learned(initial={args.initial:g})", args.initial, 0.0),
            ("fixed 10x median", None, fixed),
            ("fixed 10x longest", None, 10 * max(steps)),
        ]
        for name, initial, after in ways:
            out = anyio.run(functools.partial(run, steps, learned_initial=initial, fixed=after))
            totals[name] = totals.get(name, 0) + out.false_kills
            rows.append(
                (
                    str(seed),
                    name,
                    f"{max(steps):.3f}",
                    str(out.false_kills),
                    f"{out.hang_latency:.3f}",
                )
            )
    print(
        f"{args.steps:,} steps of scope 'step': lognormal, median {args.median * 1e3:g} ms, "
        f"sigma {args.sigma:g}; a {args.checkpoint:g}x checkpoint step every "
        f"{args.checkpoint_every} steps; fixed timeout = 10 x median = {fixed:g} s"
    )
    header = ("seed", "timeout", "longest step s", "false kills", "hang reaped after s")
    print(format_table(header, rows))
    print("false kills in all: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
