"""Server CPU at the request rates real jobs run: per second and per request, beside torch.

Run from the repository root::

    python -m benchmarks.bench_server_cpu                        # 100, 500, 2000 req/s
    python -m benchmarks.bench_server_cpu --rates 140 --seconds 10 --profile /tmp/prof

Each round starts a fresh server in its own process (``aiotimer serve`` with default
settings, and torch 2.13's ``FileTimerServer`` at ``max_interval=0.1`` when torch
imports: :mod:`benchmarks.many_workers.servers`) and ``--feeders`` worker processes that
send timed blocks open loop (each block: an acquire with ``--timeout`` seconds to its
deadline, 0.5 by default, then its release 5-30 % of 0.5 s later, whatever the timeout;
``rate`` requests per second in all, each feeder with its own phase), with the server's
own client. The figure is the server's CPU time
(every thread, to the nanosecond: :class:`~benchmarks._util.CpuMeter`) while they run:
in % of one core, and per request. Feeders set their client up before the clock starts;
a request their client cannot write is counted (``failed``), as is a feeder the server
signalled (``reaped``: it lost a release).
aiotimer's row also gives its expiry wake-ups per second (``ServerCounters.wakeups``,
read from its control socket).

``--aiotimer-args '--no-journal'`` passes more options to ``aiotimer serve`` (what one
part of the server costs). ``--profile DIR`` runs the aiotimer server under
:mod:`cProfile` (its loop thread) and writes ``DIR/aiotimer-RATE.prof`` per rate; it
prints the functions that cost most while serving (``python -m pstats`` reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks._util import CpuMeter, format_table
from benchmarks.many_workers.servers import (
    SPECS,
    RunningServer,
    ServerSpec,
    make_sender,
    start_server,
    torch_version,
)
from benchmarks.many_workers.worker import REAP_SIGNAL, Sender

TIMEOUT = 0.5  # seconds per block (``--timeout``)
#: A block's work, as a fraction of :data:`WORK_OF` seconds (many_workers' fraction).
WORK = (0.05, 0.3)
#: Seconds the work fraction applies to: the default timeout's, whatever ``--timeout``
#: is, so a longer timeout moves only the deadlines, never the rate of releases.
WORK_OF = 0.5
WARMUP = 0.5  # seconds of feeding before the CPU is sampled


@dataclass(frozen=True, slots=True)
class Round:
    """What one server measured at one rate."""

    server: str
    rate: float  # requests per second asked for
    sent: int  # requests the feeders sent in the measured window
    failed: int  # of which their client could not write
    seconds: float
    cpu_seconds: float
    wakeups: float | None  # aiotimer's expiry wake-ups per second while fed
    reaped: int  # feeders the server signalled (a lost release)

    @property
    def cpu_percent(self) -> float:
        return self.cpu_seconds / self.seconds * 100

    @property
    def us_per_request(self) -> float:
        return self.cpu_seconds / max(self.sent, 1) * 1e6


@dataclass(frozen=True, slots=True)
class _Fed:
    """What one feeder did in the measured window."""

    sent: int  # requests written
    failed: int  # requests its client could not write (torch's drops them)
    reaped: bool  # the server signalled it: a release was lost


def _feed(
    sender: Sender, *, rate: float, timeout: float, start: float, end: float, seed: int
) -> _Fed:
    """One feeder's blocks: ``rate`` requests/s from ``start`` to ``end`` (monotonic),
    each ``timeout`` seconds from its start to its deadline, counted from ``start +
    WARMUP`` on."""
    rng = random.Random(seed)
    step = 2.0 / rate  # two requests per block
    t = start + rng.uniform(0.0, step)
    pending: list[tuple[float, str]] = []  # (release time, scope), in time order
    sent = failed = k = 0
    measured_from = start + WARMUP
    while t < end or pending:
        acquire_next = t < end and (not pending or t <= pending[0][0])
        when = t if acquire_next else pending[0][0]
        time.sleep(max(when - time.monotonic(), 0.0))
        if acquire_next:
            scope = f"b{k}"
            k += 1
            ok = sender.acquire(scope, t + timeout)
            if ok:  # else: nothing to release
                pending.append((t + rng.uniform(*WORK) * WORK_OF, scope))
                pending.sort()
            t += step
        else:
            ok = sender.release(pending.pop(0)[1])
        if measured_from <= when < end:
            sent += 1
            failed += not ok
    sender.finish()
    return _Fed(sent, failed, REAP_SIGNAL in signal.sigpending())


def _feeder(
    kind: str, target: object, *, rate: float, timeout: float, seed: int, ready: int, go: int
) -> None:
    """A feeder process: set its client up, say so on ``ready``, read its start and
    end times from ``go``, feed, and write what it did on ``ready``. The reap signal stays
    blocked, so a feeder that loses a release lives on to the end of its blocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {REAP_SIGNAL})
    sender = make_sender(kind, target)
    os.write(ready, b"r")
    start, end = struct.unpack("dd", os.read(go, 16))
    fed = _feed(sender, rate=rate, timeout=timeout, start=start, end=end, seed=seed)
    os.write(ready, json.dumps([fed.sent, fed.failed, fed.reaped]).encode())


def _fork_feeders(
    kind: str, target: object, *, rate: float, timeout: float, count: int
) -> list[tuple[int, int, int]]:
    """Fork ``count`` feeders sharing ``rate``, each set up and waiting for its start:
    ``(pid, its report pipe, its start pipe)``."""
    feeders = []
    for i in range(count):
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(ready_r)
                os.close(go_w)
                _feeder(
                    kind,
                    target,
                    rate=rate / count,
                    timeout=timeout,
                    seed=i,
                    ready=ready_w,
                    go=go_r,
                )
            except BaseException:
                traceback.print_exc()
                code = 70
            finally:
                os._exit(code)
        os.close(ready_w)
        os.close(go_r)
        feeders.append((pid, ready_r, go_w))
    for pid, ready, _ in feeders:
        if os.read(ready, 1) != b"r":
            raise RuntimeError(f"feeder {pid} failed to start (see its traceback)")
    return feeders


def _wakeups(fifo: str) -> int | None:
    """aiotimer's ``ServerCounters.wakeups``, through ``aiotimer status --json``."""
    done = subprocess.run(
        [sys.executable, "-m", "aiotimer", "status", "--fifo", fifo, "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        return None
    return int(json.loads(done.stdout)["counters"]["wakeups"])


def run_round(
    spec: ServerSpec,
    rate: float,
    seconds: float,
    feeders: int,
    profile: Path | None,
    *,
    timeout: float = TIMEOUT,
    aiotimer_args: Sequence[str] = (),
) -> Round:
    """Measure ``spec``'s server at ``rate`` requests/s for ``seconds`` (``aiotimer_args``:
    more ``aiotimer serve`` options)."""
    with tempfile.TemporaryDirectory(prefix="aiotimer-cpu-") as workdir:
        prof = None if profile is None else str(profile / f"{spec.name}-{rate:g}.prof")
        server: RunningServer = start_server(
            spec,
            workdir,
            os.path.join(workdir, "server.log"),
            profile=prof,
            aiotimer_args=aiotimer_args,
        )
        try:
            server.wait_ready()
            kind, target = server.client
            fifo = target if spec.kind == "aiotimer" else None
            wake0 = _wakeups(fifo) if fifo else None  # outside the window: it costs CPU
            children = _fork_feeders(kind, target, rate=rate, timeout=timeout, count=feeders)
            start = time.monotonic() + 0.1
            for _, _, go in children:
                os.write(go, struct.pack("dd", start, start + WARMUP + seconds))
                os.close(go)
            time.sleep(max(start + WARMUP - time.monotonic(), 0.0))
            cpu, t0 = CpuMeter(server.pid), time.monotonic()
            time.sleep(max(start + WARMUP + seconds - time.monotonic(), 0.0))
            used, t1 = cpu.seconds(), time.monotonic()
            sent = failed = reaped = 0
            for pid, report, _ in children:
                _, status = os.waitpid(pid, 0)
                with os.fdopen(report, "rb") as f:
                    data = f.read()
                if status != 0 or not data:
                    raise RuntimeError(f"a feeder failed (wait status {status})")
                one_sent, one_failed, one_reaped = json.loads(data)
                sent, failed, reaped = sent + one_sent, failed + one_failed, reaped + one_reaped
            fed = time.monotonic() - start
            wake1 = _wakeups(fifo) if fifo else None
        finally:
            server.stop()
    wakeups = None if wake0 is None or wake1 is None else (wake1 - wake0) / fed
    return Round(spec.name, rate, sent, failed, t1 - t0, used, wakeups, reaped)


def _profile_summary(path: Path, top: int) -> str:
    """The functions of aiotimer, anyio and asyncio that cost most (own time)."""
    import pstats  # noqa: PLC0415

    stats = pstats.Stats(str(path))
    rows = []
    for (file, line, name), (_, calls, own, total, _) in stats.stats.items():  # type: ignore[attr-defined]
        if any(part in file for part in ("aiotimer/", "anyio/", "asyncio/")) and calls >= 10:
            where = file.split("site-packages/")[-1].split("/aiotimer/")[-1]
            rows.append((own, total, calls, f"{where}:{line}({name})"))
    rows.sort(reverse=True)
    return format_table(
        ["calls", "own ms", "total ms", "function"],
        [[f"{c:,}", f"{o * 1e3:.1f}", f"{t * 1e3:.1f}", n] for o, t, c, n in rows[:top]],
    )


def main(argv: list[str] | None = None) -> int:
    """Run every (server, rate) round and print the table; 0 always (figures only)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_server_cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rates", default="100,500,2000", help="requests/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round")
    parser.add_argument("--feeders", type=int, default=8, help="feeder processes (8)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        help="seconds from a block's start to its deadline (0.5; a training loop's "
        "blocks: 60); each block's work stays 5-30 percent of 0.5 s",
    )
    parser.add_argument("--no-torch", action="store_true", help="skip torch's server")
    parser.add_argument("--profile", type=Path, help="cProfile the aiotimer server into DIR")
    parser.add_argument(
        "--aiotimer-args",
        default="",
        help="more `aiotimer serve` options, e.g. '--no-journal' (what one part costs)",
    )
    args = parser.parse_args(argv)
    by_name = {s.name: s for s in SPECS}
    specs = [by_name["aiotimer"]]
    if not args.no_torch and torch_version() is not None:
        specs.append(by_name["torch-file-0.1"])
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    for rate in (float(r) for r in args.rates.split(",")):
        rounds = [
            run_round(
                s,
                rate,
                args.seconds,
                args.feeders,
                args.profile if s.kind == "aiotimer" else None,
                timeout=args.timeout,
                aiotimer_args=shlex.split(args.aiotimer_args),
            )
            for s in specs
        ]
        for r in rounds:
            wakeups = "-" if r.wakeups is None else f"{r.wakeups:.1f}"
            rows.append(
                [
                    r.server,
                    f"{r.rate:,.0f}",
                    f"{r.sent / r.seconds:,.0f}",
                    f"{r.cpu_percent:.2f}",
                    f"{r.us_per_request:.1f}",
                    wakeups,
                    str(r.failed),
                    str(r.reaped),
                ]
            )
        if len(rounds) == 2:
            rows.append(
                [
                    "  ratio",
                    "",
                    "",
                    f"{rounds[0].cpu_seconds / max(rounds[1].cpu_seconds, 1e-9):.2f}x",
                    "",
                    "",
                    "",
                    "",
                ]
            )
    print(
        f"load average {os.getloadavg()[0]:.2f}, {args.feeders} feeders, "
        f"{args.seconds:g} s per round, {args.timeout:g} s timeouts"
    )
    print(
        format_table(
            ["server", "rate", "req/s", "CPU %", "us/request", "wake-ups/s", "failed", "reaped"],
            rows,
        )
    )
    if args.profile is not None:
        for path in sorted(args.profile.glob("aiotimer-*.prof")):
            print(f"\n{path}:")
            print(_profile_summary(path, 25))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    raise SystemExit(main())
