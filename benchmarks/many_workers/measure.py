"""One run: a server, N forked workers running their planned blocks, and the verdicts.

A zygote process (:mod:`.zygote`) forks every worker from itself (the modules they
need already imported, so hundreds start in seconds and share its pages). The parent
waits until each worker has its client set up, fixes the start time ``t0`` and lets them
go; it watches every worker through a pidfd (one epoll) and samples the server's
``/proc`` entries for CPU and RSS.

When a worker exits, the slot tells why. Let ``t`` be its first signal's arrival (from
the worker itself), or its exit when it had none (``SIGKILL``):

* it sat in a hanging block: a **reap**, latency ``t - deadline`` (an ingest probe's
  deadline is its write time, so its latency is write -> applied -> signalled); a
  signal *before* the deadline counts as a false kill;
* it had a block open past its deadline (the worker itself was late): a **late** kill,
  deserved, counted apart;
* otherwise every block it had was released before its deadline: a **false kill**.

A reaped slot gets a fresh worker (as an agent restarts one) that goes on with the
slot's first block planned at least ``RESPAWN_MARGIN`` seconds ahead. A hang not reaped
within the server's ``miss_window`` is **missed**: the harness kills the worker itself.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import multiprocessing
import os
import select
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._util import CpuMeter
from benchmarks.many_workers import worker as w
from benchmarks.many_workers.plan import Workload, plan_slots
from benchmarks.many_workers.servers import RunningServer, ServerSpec, start_server
from benchmarks.many_workers.zygote import zygote_main

__all__ = ["RunResult", "percentiles", "run_one"]

RESPAWN_MARGIN = 0.1  # seconds a replacement worker gets to start before its first block
READY_TIMEOUT = 60.0
SAMPLE_EVERY = 0.1  # seconds between samples of the server's RSS
GIVE_UP_SLACK = 2.0  # seconds past the last miss window before live workers are killed
_spawn = multiprocessing.get_context("spawn")
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99_9", 0.999))


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50/p90/p99/p99.9 (nearest rank) and max of ``values``; None when empty."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for name, q in QUANTILES:
        out[name] = ordered[max(math.ceil(q * len(ordered)) - 1, 0)] if ordered else None
    out["max"] = ordered[-1] if ordered else None
    return out


@dataclass
class RunResult:
    """What one (server, workers) run measured; latencies in milliseconds."""

    server: str
    workers: int
    latency_basis: str
    reap_ms: list[float] = field(default_factory=list)  # deadline -> first signal
    exit_ms: list[float] = field(default_factory=list)  # deadline -> process gone
    probe_ms: list[float] = field(default_factory=list)  # write -> applied -> signal
    host_lag_ms: list[float] = field(default_factory=list)  # the parent's timer wake-ups
    realtime_observed: int = 0  # reaps and probes whose worker waited at real-time priority
    false_kills: int = 0
    late_kills: int = 0
    missed: int = 0
    missed_states: list[str] = field(default_factory=list)  # each missed worker's /proc
    errors: int = 0
    hangs_planned: int = 0
    hangs_met: int = 0  # hanging blocks a worker reached (reaped, missed or killed early)
    hangs_skipped: int = 0  # the others: reached too late, or a reaped worker's
    missed_hangs: int = 0  # missed reaps of hangs (the rest of ``missed``: stuck workers)
    early_kills: int = 0  # false kills of a worker in a hang, before its deadline
    requests: int = 0
    failed_writes: int = 0
    skipped_blocks: int = 0
    late_releases: int = 0
    seconds: float = 0.0
    cpu_percent: float = 0.0
    rss_mb: float = 0.0
    rss_start_mb: float = 0.0
    live_timers: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The run's entry in ``results.json``."""
        return {
            "server": self.server,
            "workers": self.workers,
            "latency_basis": self.latency_basis,
            "reap_latency_ms": {**percentiles(self.reap_ms), "n": len(self.reap_ms)},
            "exit_latency_ms": {**percentiles(self.exit_ms), "n": len(self.exit_ms)},
            "ingest_lag_ms": {**percentiles(self.probe_ms), "n": len(self.probe_ms)},
            "host_lag_ms": {**percentiles(self.host_lag_ms), "n": len(self.host_lag_ms)},
            "realtime_observed": self.realtime_observed,
            "false_kills": self.false_kills,
            "late_kills": self.late_kills,
            "missed": self.missed,
            "missed_states": self.missed_states,
            "errors": self.errors,
            "hangs_planned": self.hangs_planned,
            "hangs_met": self.hangs_met,
            "hangs_skipped": self.hangs_skipped,
            "hangs_reaped": len(self.reap_ms) + len(self.probe_ms),
            "missed_hangs": self.missed_hangs,
            "early_kills": self.early_kills,
            "requests": self.requests,
            "requests_per_s": self.requests / self.seconds if self.seconds else 0.0,
            "failed_writes": self.failed_writes,
            "skipped_blocks": self.skipped_blocks,
            "late_releases": self.late_releases,
            "seconds": self.seconds,
            "cpu_percent": self.cpu_percent,
            "rss_mb": self.rss_mb,
            "rss_start_mb": self.rss_start_mb,
            "live_timers": self.live_timers,
            "samples_ms": {"reap": self.reap_ms, "exit": self.exit_ms, "probe": self.probe_ms},
        }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _proc_state(pid: int) -> str:
    """What the kernel says a live process is doing: state, signal masks, wait channel
    (evidence for a missed reap; ``?`` for what cannot be read)."""
    keys = (b"State", b"SigPnd", b"ShdPnd", b"SigBlk", b"SigCgt")
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            rows = [line.split(b":", 1) for line in f if line.split(b":", 1)[0] in keys]
        with open(f"/proc/{pid}/wchan", "rb") as f:
            wchan = f.read().decode()
    except OSError as exc:
        return f"? ({exc.strerror})"
    fields = [f"{k.decode()} {v.strip().decode()}" for k, v in rows]
    return ", ".join([*fields, f"wchan {wchan or '?'}"])


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class _Run:
    """The parent's bookkeeping for one run."""

    def __init__(self, spec: ServerSpec, load: Workload, server: RunningServer, workdir: str):
        self.spec = spec
        self.load = load
        self.plans = plan_slots(load)
        self.starts = [[b.start for b in blocks] for blocks in self.plans]
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else workdir
        fd, path = tempfile.mkstemp(dir=shm, prefix="aiotimer-slots-")
        os.close(fd)
        self.slots = w.Slots(path, load.workers)
        self.conn, theirs = _spawn.Pipe()
        self.zygote = _spawn.Process(
            target=zygote_main,
            args=(theirs, self.slots.path, self.plans, load.timeout, server.client),
            daemon=True,
        )
        self.zygote.start()
        theirs.close()
        self.epoll = select.epoll()
        self.live: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, slot)
        self.pid_of: dict[int, int] = {}  # slot -> pid of its live worker
        self.missed_slots: set[int] = set()
        self.result = RunResult(spec.name, load.workers, spec.latency_basis)
        self.result.hangs_planned = sum(b.hang for blocks in self.plans for b in blocks)
        self.result.live_timers = load.live_timers

    def fork(self, slot: int, first: int, initial: bool) -> None:
        self.slots.set(slot, w.NEXT_BLOCK, first)  # a worker that dies at once got there
        self.conn.send((slot, first, initial))
        pid = self.conn.recv()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone already: its slot says why
            pidfd = os.eventfd(1)
        self.epoll.register(pidfd, select.EPOLLIN)
        self.live[pidfd] = (pid, slot)
        self.pid_of[slot] = pid

    def go(self) -> None:
        self.conn.send("go")
        self.conn.recv()

    def close(self) -> None:
        for pidfd, (pid, _) in self.live.items():
            _kill(pid)
            os.close(pidfd)
        self.conn.close()
        self.zygote.join(10)
        self.epoll.close()
        os.unlink(self.slots.path)

    def on_exit(self, pidfd: int, now: float, t0: float) -> None:
        _, slot = self.live.pop(pidfd)
        self.epoll.unregister(pidfd)
        os.close(pidfd)
        del self.pid_of[slot]
        s, r = self.slots, self.result
        r.requests += int(s.get(slot, w.REQUESTS))
        r.failed_writes += int(s.get(slot, w.FAILED))
        r.skipped_blocks += int(s.get(slot, w.SKIPPED))
        r.hangs_skipped += int(s.get(slot, w.SKIPPED_HANGS))
        reached = int(s.get(slot, w.NEXT_BLOCK))
        r.late_releases += int(s.get(slot, w.LATE))
        signal_time = s.get(slot, w.SIGNAL_TIME)
        signalled = not math.isnan(signal_time)
        t = signal_time if signalled else now
        hang_deadline = s.get(slot, w.HANG_DEADLINE)
        resume_after = int(s.get(slot, w.HANG_BLOCK))
        in_hang = not math.isnan(hang_deadline)
        r.hangs_met += in_hang
        if slot in self.missed_slots:
            self.missed_slots.discard(slot)
            r.missed += 1
            r.missed_hangs += in_hang
        elif s.get(slot, w.CRASHED):
            r.errors += 1
        elif s.get(slot, w.DONE) and not signalled:
            return  # finished its blocks
        elif in_hang:
            if t < hang_deadline:
                r.false_kills += 1
                r.early_kills += 1
            else:
                probe = s.get(slot, w.HANG_PROBE) == 1.0
                r.realtime_observed += int(s.get(slot, w.REALTIME))
                (r.probe_ms if probe else r.reap_ms).append((t - hang_deadline) * 1e3)
                if not probe:
                    r.exit_ms.append((now - hang_deadline) * 1e3)
        elif s.get(slot, w.MIN_OPEN_DEADLINE) <= t:
            r.late_kills += 1
        else:  # signalled, or SIGKILLed, with every block released in time
            r.false_kills += 1
        # A fresh worker takes over the slot's remaining blocks.
        first = bisect.bisect_left(self.starts[slot], now - t0 + RESPAWN_MARGIN)
        first = max(first, resume_after + 1)
        # The blocks between where this worker got to and where the next one starts
        # are skipped (all the rest, when none follows).
        plan = self.plans[slot]
        jumped = plan[max(reached, resume_after + 1) : min(first, len(plan))]
        r.skipped_blocks += len(jumped)
        r.hangs_skipped += sum(b.hang for b in jumped)
        if first < len(plan):
            s.reset(slot)
            self.fork(slot, first, False)

    def kill_missed(self, now: float) -> None:
        """SIGKILL workers whose hang has waited past the server's miss window."""
        window = self.spec.miss_window
        for slot, pid in self.pid_of.items():
            deadline = self.slots.get(slot, w.HANG_DEADLINE)
            if slot not in self.missed_slots and now > deadline + window:
                self.missed_slots.add(slot)
                r = self.result
                r.missed_states.append(f"slot {slot} pid {pid}: {_proc_state(pid)}")
                _kill(pid)


def renice(pid: int, nice: int) -> None:
    """Set the nice value of every thread of process ``pid`` (on Linux a nice value is
    per thread, and torch's servers reap from a thread started before this call)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def run_one(
    spec: ServerSpec,
    load: Workload,
    out: Path,
    on_tick: Callable[[], None] | None = None,
    *,
    server_nice: int = 0,
    profile: Path | None = None,
) -> RunResult:
    """Run ``load`` against a fresh ``spec`` server (at nice ``server_nice`` when not 0,
    the same for every server); return what it measured. The server's log goes to
    ``out/logs/`` (kept only when not empty). ``profile``: a directory where an aiotimer
    server runs under :mod:`cProfile` (``aiotimer-WORKERS.prof``)."""
    log = out / "logs" / f"{spec.name}-{load.workers}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aiotimer-many-") as workdir:
        prof = None
        if profile is not None and spec.kind == "aiotimer":
            profile.mkdir(parents=True, exist_ok=True)
            prof = str(profile / f"{spec.name}-{load.workers}.prof")
        server = start_server(spec, workdir, str(log), profile=prof)
        try:
            run = _Run(spec, load, server, workdir)  # its zygote starts meanwhile
            try:
                server.wait_ready()
                if server_nice:
                    renice(server.pid, server_nice)
                _drive(run, server.pid, on_tick)
            finally:
                run.close()
        finally:
            server.stop()
    if log.exists() and not log.stat().st_size:
        log.unlink()
    return run.result


def _drive(run: _Run, server_pid: int, on_tick: Callable[[], None] | None) -> None:
    load, r = run.load, run.result
    for slot in range(load.workers):
        run.fork(slot, 0, True)
    deadline = time.monotonic() + READY_TIMEOUT
    while not all(run.slots.get(i, w.READY) for i in range(load.workers)):
        if time.monotonic() > deadline or any(
            run.slots.get(i, w.CRASHED) for i in range(load.workers)
        ):
            raise RuntimeError("workers did not start (see their tracebacks above)")
        time.sleep(0.01)
    r.rss_start_mb = _rss_mb(server_pid)
    cpu = CpuMeter(server_pid)
    t0 = time.monotonic() + 0.2
    run.slots.t0 = t0
    run.go()
    # Every block is over and every hang past its miss window by then: whoever lives on
    # is stuck outside its blocks (e.g. in a client whose queue lock died with a worker).
    give_up = t0 + load.duration + load.timeout + run.spec.miss_window + GIVE_UP_SLACK
    next_sample = 0.0
    while run.live:
        now = time.monotonic()
        if now >= next_sample:
            r.rss_mb = max(r.rss_mb, _rss_mb(server_pid))
            run.kill_missed(now)
            if on_tick is not None:
                on_tick()
            next_sample = now + SAMPLE_EVERY
        if now > give_up:
            for pid, slot in run.live.values():
                run.missed_slots.add(slot)
                _kill(pid)
            give_up = math.inf
        exits = run.epoll.poll(max(next_sample - now, 0.0))
        if not exits:  # a timer wake-up: how late the host let this process run
            r.host_lag_ms.append(max(time.monotonic() - next_sample, 0.0) * 1e3)
        for pidfd, _ in exits:
            run.on_exit(pidfd, time.monotonic(), t0)
    end = time.monotonic()
    r.seconds = end - t0
    r.cpu_percent = cpu.seconds() / (end - t0 + 0.2) * 100
    r.rss_mb = max(r.rss_mb, _rss_mb(server_pid))
