"""Server CPU per reap: hung workers, one after another, beside torch's file server.

Run from the repository root::

    python -m benchmarks.bench_reap_cpu              # 100 reaps per server, ~75 s
    python -m benchmarks.bench_reap_cpu --reaps 20   # a smoke run

Each round starts a fresh server in its own process (``aiotimer serve`` with default
settings, and torch 2.13's ``FileTimerServer`` at ``max_interval=0.1`` when torch
imports: :mod:`benchmarks.many_workers.servers`), then forks hung workers ``--batch`` at
a time: each sets its server's own client up, acquires a 50 ms block and waits, the
reap signal blocked, for the server to send it (``sigwaitinfo``), then exits; the next
batch starts when the last one has exited. The figure is the server's CPU time (every
thread: :class:`~benchmarks._util.CpuMeter`) from before the first worker to a second
after the last one, per reap. Everything a reap brings about counts: the new worker's
acquire read and its process pinned, the expiry, the signal, its exit noticed, the
events and log lines, the journal. torch's reap is an ``os.kill`` in its polling loop,
which wakes 10 times a second whether or not anything expires, and it finds each expiry
up to a poll later (its round lasts longer, and its idle wake-ups are in its figure).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

from benchmarks._util import CpuMeter, format_table
from benchmarks.many_workers.servers import (
    SPECS,
    ServerSpec,
    make_sender,
    start_server,
    torch_version,
)
from benchmarks.many_workers.worker import REAP_SIGNAL

BLOCK = 0.05  # seconds each hung worker's block lasts before it expires
SETTLE = 1.0  # seconds measured after the last exit (log lines, the journal)


@dataclass(frozen=True, slots=True)
class Round:
    """What one server cost for ``reaps`` hung workers."""

    server: str
    reaps: int
    seconds: float
    cpu_seconds: float

    @property
    def ms_per_reap(self) -> float:
        return self.cpu_seconds / self.reaps * 1e3


def _hang(kind: str, target: object, scope: str) -> None:
    """A forked worker: acquire a short block and wait to be reaped; never returns."""
    code = 70
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {REAP_SIGNAL})
        sender = make_sender(kind, target)
        if sender.acquire(scope, time.monotonic() + BLOCK):
            signal.sigwaitinfo({REAP_SIGNAL})
            code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def run_round(spec: ServerSpec, reaps: int, batch: int) -> Round:
    """Reap ``reaps`` hung workers with ``spec``'s server, ``batch`` at a time."""
    with tempfile.TemporaryDirectory(prefix="aiotimer-reapcpu-") as workdir:
        server = start_server(spec, workdir, os.path.join(workdir, "server.log"))
        try:
            server.wait_ready()
            kind, target = server.client
            cpu, t0 = CpuMeter(server.pid), time.monotonic()
            done = 0
            while done < reaps:
                pids = []
                for i in range(min(batch, reaps - done)):
                    pid = os.fork()
                    if pid == 0:
                        _hang(kind, target, f"hang{i}")
                    pids.append(pid)
                for pid in pids:
                    _, status = os.waitpid(pid, 0)
                    if status != 0:
                        raise RuntimeError(f"a hung worker was not reaped (status {status})")
                done += len(pids)
            time.sleep(SETTLE)
            used, t1 = cpu.seconds(), time.monotonic()
        finally:
            server.stop()
    return Round(spec.name, reaps, t1 - t0, used)


def main(argv: list[str] | None = None) -> int:
    """Run one round per server and print the table; 0 always (figures only)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_reap_cpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--reaps", type=int, default=100, help="hung workers per server")
    parser.add_argument("--batch", type=int, default=4, help="hung workers at a time (4)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's server")
    args = parser.parse_args(argv)
    if args.reaps < 1 or args.batch < 1:
        parser.error("--reaps and --batch must be at least 1")
    by_name = {s.name: s for s in SPECS}
    specs = [by_name["aiotimer"]]
    if not args.no_torch and torch_version() is not None:
        specs.append(by_name["torch-file-0.1"])
    load0 = os.getloadavg()[0]
    rounds = [run_round(s, args.reaps, args.batch) for s in specs]
    rows = [
        [
            r.server,
            f"{r.reaps}",
            f"{r.seconds:.1f}",
            f"{r.cpu_seconds * 1e3:.1f}",
            f"{r.ms_per_reap:.2f}",
        ]
        for r in rounds
    ]
    print(f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}, {args.batch} hung at a time")
    print(format_table(["server", "reaps", "seconds", "CPU ms", "ms/reap"], rows))
    if len(rounds) == 2:
        print(f"  ratio {rounds[0].ms_per_reap / rounds[1].ms_per_reap:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
