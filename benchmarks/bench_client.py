"""Client cost of one ``with expires()`` block (acquire + release), against torch's.

Run from the repository root::

    python -m benchmarks.bench_client            # about 10-20 s
    python -m benchmarks.bench_client --quick    # about 1 s, for a smoke run

Every case writes into the same FIFO, drained by a separate reader *process* (no GIL
contention with the measured client). The reader grows the pipe to 1 MiB, as aiotimer's
server does, and reads up to 1 MiB per call, sleeping 1 ms after a short read: like a busy
server, it batches, so most writes do not have to wake it. A marker file in the reader's
name makes aiotimer's client treat it as an aiotimer server (one persistent descriptor,
``mono`` extension); the "torch server" rows hide the marker, so the client opens, writes
and closes per request, exactly as it must with torch's ``FileTimerServer``.

Cases (each block is an acquire line plus a release line):

* ``raw os.write x2`` — two ``os.write`` of pre-encoded lines: the physical floor;
* the same two writes inside ``async with asyncio.timeout(60)``: the floor of an async
  block with a deadline, which the async two-tier block is held to;
* aiotimer ``with expires()`` sync and ``async with expires()`` (asyncio loop), with an
  explicit scope and with the default ``file:line#n`` scope;
* the async default-scope block with ``kill_after=0`` (one tier: no task cancellation at
  the deadline), the reference for what the cancellation tier costs;
* the same sync default-scope block with no ``client=``: through the process-wide client
  (``configure()``) and through env discovery (``AIOTIMER_FIFO``, no setup at all);
* ``default_scope()`` alone (``sys._getframe``; torch uses ``inspect.stack()``);
* where the rest goes, under the block: the client's fast path alone
  (``FifoClient.send_nowait`` of an acquire and its release: the encoding, the lock, the
  open-block map and the two writes, no ``Expires``), and the block encoder alone (both
  lines, no write);
* when torch is importable: ``torch.distributed.elastic.timer.expires`` with its
  ``FileTimerClient``, explicit and default scope — the reference of the ratios.

Cases are interleaved (every round times each case once) because the shared machine's
load drifts; rounds are short (2,000 blocks) and many (30), and the table shows the best
and the median round, in microseconds per block, the best as a multiple of the floor
(which moves with the machine's load as the rest does) and torch's cost over it. Each
round is timed by the measuring thread's CPU time (``--clock cpu``, the default): the
time the thread spends descheduled while other processes run is not counted, so a
loaded machine distorts the figures far less than with ``--clock wall`` (where every
figure grows by 10-20 % on a 2-core machine with other work running). The load average
before and after the run is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiotimer import client as client_module
from aiotimer.client import FifoClient, configure, expires
from aiotimer.core._scope import default_scope
from aiotimer.wire import ENV_FIFO, MARKER_SUFFIX, Request, block_encoder, encode
from benchmarks._util import format_table, gc_paused

#: The clock every case is timed with (``--clock``): by default the measuring thread's CPU
#: time, which a busy shared machine inflates far less than wall time (the time this
#: thread waits while other processes run is not counted; system calls are).
_CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.thread_time, "wall": time.perf_counter}
_now: Callable[[], float] = time.thread_time

TARGET_US = 5.0
FLOOR = "raw os.write x2 (floor)"
ASYNC_FLOOR = "async with asyncio.timeout(60) + raw os.write x2"
#: The sync default-scope block may cost at most this many times the two-write floor.
SYNC_FLOOR_RATIO = 3.0
#: The async two-tier block may cost at most this many times ``asyncio.timeout()`` around
#: the same two writes.
ASYNC_FLOOR_RATIO = 1.25
VERDICTS = (
    "aiotimer: with expires(), default scope",
    "aiotimer: async with expires(), default scope",
)
ONE_TIER = "aiotimer: async with expires(kill_after=0), default scope"
#: The async block with its cancellation tier may cost at most this much more than the
#: same block with one tier (no task cancellation: what async blocks cost before).
TIERS_SLACK = 1.5
CONFIGURED = "aiotimer: with expires(), default scope, configure()"
DISCOVERED = "aiotimer: with expires(), default scope, env discovery"
#: The zero-setup path (the client found through the environment) may cost at most this
#: much more than the same block after ``configure()``.
DISCOVERY_SLACK = 1.10
#: Under the block: the client's fast path alone, and the encoder of both lines alone.
NOWAIT_ONLY = "aiotimer: FifoClient.send_nowait() acquire + release alone"
ENCODER_ONLY = "aiotimer: block encoder alone (both lines, no write)"

_READER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ
except OSError:
    pass
print("ready", flush=True)
while True:
    chunk = os.read(fd, 1 << 20)
    if not chunk:
        break
    if len(chunk) < 1 << 16:
        time.sleep(0.001)
"""


@dataclass
class Case:
    """One measured way of running ``blocks`` blocks; ``run`` returns elapsed seconds."""

    name: str
    blocks: int
    run: Callable[[int], float]
    reference: bool = False
    rounds: list[float] = field(default_factory=list)

    def best_us(self) -> float:
        return min(self.rounds) / self.blocks * 1e6

    def median_us(self) -> float:
        ordered = sorted(self.rounds)
        return ordered[len(ordered) // 2] / self.blocks * 1e6


@contextmanager
def draining_fifo() -> Iterator[Path]:
    """A FIFO with a reader process draining it, and an aiotimer marker naming it."""
    with tempfile.TemporaryDirectory(prefix="aiotimer-bench-") as tmp:
        fifo = Path(tmp) / "bench.fifo"
        os.mkfifo(fifo, 0o600)
        reader = subprocess.Popen(
            [sys.executable, "-c", _READER, str(fifo)], stdout=subprocess.PIPE, text=True
        )
        try:
            keep = os.open(fifo, os.O_WRONLY)  # holds the pipe open between cases
            try:
                assert reader.stdout is not None and reader.stdout.readline() == "ready\n"
                marker = {"server": "aiotimer", "pid": reader.pid, "protocol": 1}
                Path(str(fifo) + MARKER_SUFFIX).write_text(json.dumps(marker))
                yield fifo
            finally:
                os.close(keep)
        finally:
            reader.kill()
            reader.wait()
            if reader.stdout is not None:
                reader.stdout.close()


@contextmanager
def marker_hidden(fifo: Path) -> Iterator[None]:
    """Without the marker the client must treat the reader as torch's server."""
    marker = Path(str(fifo) + MARKER_SUFFIX)
    hidden = marker.with_name(marker.name + ".hidden")
    marker.rename(hidden)
    try:
        yield
    finally:
        hidden.rename(marker)


def aiotimer_cases(fifo: Path, blocks: int, runner: asyncio.Runner) -> list[Case]:
    client = FifoClient(fifo)
    torch_mode = FifoClient(fifo)
    pid = os.getpid()
    acquire_line = encode(
        Request(pid=pid, scope_id="x.py:1#1", expiration_time=1.0, signal=9, mono=1.0)
    )
    release_line = encode(Request(pid=pid, scope_id="x.py:1#1", expiration_time=-1, signal=0))
    raw_fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)

    def raw(n: int) -> float:
        write = os.write
        start = _now()
        for _ in range(n):
            write(raw_fd, acquire_line)
            write(raw_fd, release_line)
        return _now() - start

    async def timeout_raw(n: int) -> float:
        write, timeout = os.write, asyncio.timeout
        start = _now()
        for _ in range(n):
            async with timeout(60):
                write(raw_fd, acquire_line)
                write(raw_fd, release_line)
        return _now() - start

    def sync_scoped(n: int) -> float:
        start = _now()
        for _ in range(n):
            with expires(after=30, scope="bench", client=client):
                pass
        return _now() - start

    def sync_default(n: int) -> float:
        start = _now()
        for _ in range(n):
            with expires(after=30, client=client):
                pass
        return _now() - start

    async def async_blocks(n: int, scoped: bool, kill_after: float | None = None) -> float:
        start = _now()
        if scoped:
            for _ in range(n):
                async with expires(after=30, scope="bench", client=client, kill_after=kill_after):
                    pass
        else:
            for _ in range(n):
                async with expires(after=30, client=client, kill_after=kill_after):
                    pass
        return _now() - start

    def sync_configured(n: int) -> float:
        configure(client, dump_hook=False)
        try:
            start = _now()
            for _ in range(n):
                with expires(after=30):
                    pass
            return _now() - start
        finally:
            configure(None)

    def sync_discovered(n: int) -> float:
        os.environ[ENV_FIFO] = str(fifo)
        try:
            client_module.current_client()  # discovered once, as any worker's first block
            start = _now()
            for _ in range(n):
                with expires(after=30):
                    pass
            return _now() - start
        finally:
            del os.environ[ENV_FIFO]

    def scope_only(n: int) -> float:
        start = _now()
        for _ in range(n):
            default_scope()
        return _now() - start

    def nowait_only(n: int) -> float:
        nowait = client.send_nowait
        with expires(after=30, scope="bench", client=client):
            pass  # connected: the fast path below never falls back to send()
        fallbacks = 0
        start = _now()
        for _ in range(n):
            mono = time.monotonic() + 30
            if not (
                nowait("bench", time.time() + 30, None, mono, False)
                and nowait("bench", -1, 0, None, False)
            ):
                # the marker fell due for its check (a slow, loaded run) or the pipe is
                # full: one block by the slow path checks it, and the loop goes on
                fallbacks += 1
                if fallbacks > max(1, n // 100):
                    raise RuntimeError("the fast path kept falling back to send()")
                with expires(after=30, scope="bench", client=client):
                    pass
        return _now() - start

    encode_block = block_encoder(pid, client.signal)

    def encoder_only(n: int) -> float:
        start = _now()
        for _ in range(n):
            encode_block("x.py:1#1", time.time() + 30, time.monotonic() + 30)
        return _now() - start

    def sync_torch_server(n: int) -> float:
        with marker_hidden(fifo):
            torch_mode.close()
            start = _now()
            for _ in range(n):
                with expires(after=30, scope="bench", client=torch_mode):
                    pass
            return _now() - start

    few = max(1, blocks // 20)
    return [
        Case(FLOOR, blocks, raw),
        Case(ASYNC_FLOOR, blocks, lambda n: runner.run(timeout_raw(n))),
        Case("aiotimer: with expires(), scope given", blocks, sync_scoped),
        Case("aiotimer: with expires(), default scope", blocks, sync_default),
        Case(
            "aiotimer: async with expires(), scope given",
            blocks,
            lambda n: runner.run(async_blocks(n, True)),
        ),
        Case(
            "aiotimer: async with expires(), default scope",
            blocks,
            lambda n: runner.run(async_blocks(n, False)),
        ),
        Case(ONE_TIER, blocks, lambda n: runner.run(async_blocks(n, False, 0.0))),
        Case(CONFIGURED, blocks, sync_configured),
        Case(DISCOVERED, blocks, sync_discovered),
        Case("aiotimer: default_scope() alone", blocks, scope_only),
        Case(NOWAIT_ONLY, blocks, nowait_only),
        Case(ENCODER_ONLY, blocks, encoder_only),
        Case("aiotimer: with expires(), torch server (no marker)", few, sync_torch_server),
    ]


def torch_cases(fifo: Path, blocks: int) -> list[Case]:
    """torch's ``expires`` + ``FileTimerClient``; empty when torch is not importable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.distributed.elastic import timer as torch_timer  # noqa: PLC0415
    except ImportError:
        return []
    client: Any = torch_timer.FileTimerClient(str(fifo))
    torch_expires: Any = torch_timer.expires

    def scoped(n: int) -> float:
        start = _now()
        for _ in range(n):
            with torch_expires(after=30, scope="bench", client=client):
                pass
        return _now() - start

    def default(n: int) -> float:
        start = _now()
        for _ in range(n):
            with torch_expires(after=30, client=client):
                pass
        return _now() - start

    # torch's blocks cost ~50 us (open/write/close) and its default scope (inspect.stack)
    # milliseconds: fewer blocks per round keep every round short.
    return [
        Case(
            "torch: expires() + FileTimerClient, scope given",
            max(1, blocks // 20),
            scoped,
            reference=True,
        ),
        Case("torch: expires() + FileTimerClient, default scope", max(1, blocks // 200), default),
    ]


def measure(cases: Sequence[Case], rounds: int) -> None:
    for case in cases:  # warm up: connect, fill caches
        case.run(max(1, case.blocks // 10))
    for _ in range(rounds):
        for case in cases:
            with gc_paused():
                case.rounds.append(case.run(case.blocks))


def report(cases: Sequence[Case]) -> str:
    """The table, then one verdict line per default-scope case (sync and async)."""
    by_name = {c.name: c for c in cases}
    floor = by_name[FLOOR].best_us()
    reference = next((c for c in cases if c.reference), None)
    headers = ["case (us per block = acquire + release)", "best", "median", "x floor", "vs torch"]
    rows = []
    for case in cases:
        best = case.best_us()
        ratio = "" if reference is None else f"{reference.best_us() / best:.1f}x"
        rows.append(
            [case.name, f"{best:.2f}", f"{case.median_us():.2f}", f"{best / floor:.1f}", ratio]
        )
    lines = [format_table(headers, rows), ""]
    torch_default = by_name.get("torch: expires() + FileTimerClient, default scope")
    torch_scoped = reference
    for name in VERDICTS:
        best = by_name[name].best_us()
        verdict = "meets" if best < TARGET_US else "MISSES"
        line = (
            f"{name}: {best:.2f} us best, {best / floor:.1f}x the two-write floor "
            f"({verdict} the < {TARGET_US:g} us target)"
        )
        if torch_scoped is not None and torch_default is not None:
            line += (
                f"; torch: {torch_scoped.best_us() / best:.0f}x slower with a scope given, "
                f"{torch_default.best_us() / best:.0f}x with its default scope"
            )
        lines.append(line)
    sync = by_name[VERDICTS[0]].best_us()
    verdict = "meets" if sync <= floor * SYNC_FLOOR_RATIO else "MISSES"
    lines.append(
        f"sync block: {sync:.2f} us best, {sync / floor:.2f}x two bare os.write ({verdict} "
        f"the <= {SYNC_FLOOR_RATIO:g}x target)"
    )
    async_floor = by_name[ASYNC_FLOOR].best_us()
    two_tier = by_name[VERDICTS[1]].best_us()
    verdict = "meets" if two_tier <= async_floor * ASYNC_FLOOR_RATIO else "MISSES"
    lines.append(
        f"async two-tier block: {two_tier:.2f} us best, {two_tier / async_floor:.2f}x "
        f"asyncio.timeout() + two bare os.write, {async_floor:.2f} us ({verdict} the "
        f"<= {ASYNC_FLOOR_RATIO:g}x target)"
    )
    one_tier = by_name[ONE_TIER].best_us()
    two_tiers = by_name["aiotimer: async with expires(), default scope"].best_us()
    verdict = "meets" if two_tiers <= one_tier * TIERS_SLACK else "MISSES"
    lines.append(
        f"async block with its cancellation tier: {two_tiers:.2f} us best, "
        f"{two_tiers / one_tier:.2f}x the one-tier block ({verdict} the <= "
        f"{TIERS_SLACK:.1f}x target)"
    )
    configured, discovered = by_name[CONFIGURED].best_us(), by_name[DISCOVERED].best_us()
    verdict = "meets" if discovered <= configured * DISCOVERY_SLACK else "MISSES"
    lines.append(
        f"env discovery: {discovered:.2f} us best, {discovered / configured:.2f}x the "
        f"configure() block ({verdict} the <= {DISCOVERY_SLACK:.2f}x target)"
    )
    lines.append(_breakdown(by_name, floor))
    if reference is None:
        lines.append("no reference measured (torch is not importable, or --no-torch)")
    return "\n".join(lines)


def _breakdown(by_name: dict[str, Case], floor: float) -> str:
    """Where the sync default-scope block's microseconds go, from the cases under it
    (best rounds, so the parts only roughly add up)."""
    block = by_name[VERDICTS[0]].best_us()
    nowait = by_name[NOWAIT_ONLY].best_us()
    encoder = by_name[ENCODER_ONLY].best_us()
    scope = by_name["aiotimer: default_scope() alone"].best_us()
    return (
        f"sync block, where the {block:.2f} us go: two writes {floor:.2f}, encoding both "
        f"lines {encoder:.2f}, the rest of the client's fast path (lock, open-block map, "
        f"clock, calls) {nowait - floor - encoder:.2f}, default_scope() {scope:.2f}, the "
        f"block around them (Expires, enter/exit, clocks) {block - nowait - scope:.2f}"
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--blocks", type=int, default=None, help="blocks per round")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's reference")
    parser.add_argument(
        "--clock",
        choices=sorted(_CLOCKS),
        default="cpu",
        help="time each case by this thread's CPU time (default) or by wall time",
    )
    args = parser.parse_args(argv)
    global _now
    _now = _CLOCKS[args.clock]
    # Short rounds, many of them: the best round is the least disturbed by other load.
    blocks = args.blocks or (300 if args.quick else 2_000)
    rounds = args.rounds or (3 if args.quick else 30)
    load_before = _load()
    with draining_fifo() as fifo, asyncio.Runner() as runner:
        cases = aiotimer_cases(fifo, blocks, runner)
        if not args.no_torch:
            cases += torch_cases(fifo, blocks)
        measure(cases, rounds)
    print(
        f"client cost per block ({args.clock} time), {blocks:,} blocks x {rounds} "
        "interleaved rounds; "
        f"load average {load_before} before, {_load()} after ({os.cpu_count()} cores)"
    )
    print(report(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
