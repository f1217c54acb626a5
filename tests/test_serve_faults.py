"""``aiotimer serve`` under bad arguments, full disks and undrained pipes.

Real processes: the server is ``python -m aiotimer serve``; sentinels are ``sleep``
processes whose deaths are timed through pidfds (see ``_procs``). The latency bounds
are the ones the watchdog promises (a reap within 100 ms of its deadline while the
server is flooded); everything else is bounded by seconds.
"""

from __future__ import annotations

import json
import math
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pids import fake_pid
from _procs import BOUND, Sentinel, env, events, line, send, serve_argv, serving

from aiotimer.cli import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--fifo", "/nonexistent/t.fifo"], "the directory of the FIFO"),
        (["--event-log", "/nonexistent/log.jsonl"], "the directory of the event log"),
        (["--event-log", "/"], "is a directory"),
        (["--dump-dir", "/nonexistent"], "'/nonexistent' does not exist"),
        (["--mode", "999"], "octal permission bits"),
        (["--grace", "soon"], "finite number of seconds"),
        (["--dump-timeout", "inf"], "finite number of seconds"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    if "--fifo" not in argv:
        argv = ["--fifo", str(tmp_path / "t.fifo"), *argv]
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiotimer serve: error: "), err
    assert says in err


BAD_NUMBERS = {
    ("serve", "--metrics-port", "70000"): "argument --metrics-port: need a port number "
    "0..65535, got '70000'",
    ("serve", "--metrics-port", "-1"): "argument --metrics-port: need a port number "
    "0..65535, got '-1'",
    ("run", "--metrics-port", "70000"): "argument --metrics-port: need a port number "
    "0..65535, got '70000'",
    ("run", "--nproc", "0"): "argument --nproc: need a whole number >= 1, got '0'",
    ("run", "--nproc", "-3"): "argument --nproc: need a whole number >= 1, got '-3'",
    ("run", "--backoff", "5:1"): "argument --backoff: the initial delay (5s) must not "
    "exceed the cap (1s), got '5:1'",
}


def bad_argv(case: tuple[str, ...], fifo: Path) -> list[str]:
    command, *options = case
    if command == "serve":
        return [command, "--fifo", str(fifo), *options]
    return [command, *options, "--", "true"]


@pytest.mark.parametrize("case", BAD_NUMBERS, ids=" ".join)
def test_bad_numbers_of_serve_and_run_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: tuple[str, ...]
) -> None:
    """Each bad number is refused in one line saying what to give, with the same words
    for serve and run, exit status 2, before anything starts."""
    with pytest.raises(SystemExit) as exc:
        main(bad_argv(case, tmp_path / "t.fifo"))
    assert exc.value.code == 2
    command = case[0]
    assert capsys.readouterr().err == (
        f"aiotimer {command}: error: {BAD_NUMBERS[case]} (see aiotimer {command} --help)\n"
    )
    assert not (tmp_path / "t.fifo").exists()


@pytest.mark.process
@pytest.mark.timeout(60)
def test_bad_numbers_as_a_user_types_them_are_one_line_and_exit_2(tmp_path: Path) -> None:
    """The same through the real command (one process per subcommand, side by side):
    no traceback, one line, exit status 2."""
    cases = [("serve", "--metrics-port", "70000"), ("run", "--nproc", "0")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "aiotimer", *bad_argv(case, tmp_path / "t.fifo")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for case in cases
    ]
    for case, proc in zip(cases, procs, strict=True):
        out, err = proc.communicate(timeout=BOUND)
        assert (proc.returncode, out) == (2, ""), err
        assert (
            err
            == f"aiotimer {case[0]}: error: {BAD_NUMBERS[case]} (see aiotimer {case[0]} --help)\n"
        )


@pytest.mark.process
@pytest.mark.timeout(30)
def test_an_event_log_on_a_read_only_file_system_is_one_line_and_exit_1(
    tmp_path: Path, tiny_tmpfs: Path
) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_tmpfs)], check=True)
    argv = serve_argv(tmp_path / "t.fifo", "--event-log", str(tiny_tmpfs / "log.jsonl"))
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, env=env(), timeout=BOUND
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Read-only file system" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.process
@pytest.mark.timeout(60)
def test_an_undrained_stderr_and_a_garbage_flood_never_delay_a_reap(tmp_path: Path) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    # stderr is a pipe nobody reads: its 64 KiB fill up after a few hundred log lines.
    with (
        serving(fifo, "--event-log", str(log), stderr=subprocess.PIPE) as server,
        Sentinel() as sentinel,
    ):
        garbage = b"".join(b"garbage line %d, not JSON\n" % i for i in range(5_000))
        unknown = b"".join(
            b'{"pid": %d, "scope_id": "s", "expiration_time": 1e12, "signal": 9}\n'
            % fake_pid(i + 1)
            for i in range(5_000)
        )
        send(fifo, garbage + unknown)
        sentinel.arm(fifo, after=0.5)
        sentinel.lateness()  # it died
        assert server.poll() is None
        server.send_signal(signal.SIGTERM)  # flushes the event log
        server.wait(BOUND)
    assert sentinel.reap_latency(events(log)) < 0.1


@pytest.mark.process
@pytest.mark.timeout(60)
def test_a_full_disk_under_the_event_log_never_stops_reaping(
    tmp_path: Path, tiny_tmpfs: Path
) -> None:
    fifo, log, stderr = tmp_path / "t.fifo", tiny_tmpfs / "events.jsonl", tmp_path / "stderr"
    with stderr.open("wb") as err, serving(fifo, "--event-log", str(log), stderr=err) as server:
        # ~300 bytes of log per rejection event, 64 events per 32 KiB read (the rest of a
        # read is one more): 400 KiB of 200-byte lines overflow 64 KiB.
        send(fifo, b"".join(b"junk %04d %s\n" % (i, b"x" * 190) for i in range(2_000)))
        deadline = time.monotonic() + BOUND
        while b"write failed" not in stderr.read_bytes():
            assert time.monotonic() < deadline, "the full disk was never reported"
            time.sleep(0.05)
        with Sentinel() as sentinel:  # the disk is full: reaping goes on
            sentinel.arm(fifo, after=0.3)
            assert sentinel.lateness() < 0.1
        assert server.poll() is None
    # Once there is room again the log says what it lost, then goes on: the event log's
    # own test shows it on a full tmpfs (test_eventlog.py), without serve's 5 s retry.


def _soft_nofile_128() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.process
@pytest.mark.timeout(90)
def test_a_low_open_file_limit_still_watches_every_worker(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) leaves no room for 300 pidfds")
    fifo = tmp_path / "t.fifo"
    workers: list[subprocess.Popen[bytes]] = []
    with serving(fifo, preexec=_soft_nofile_128):
        try:
            workers = [subprocess.Popen(["sleep", "300"]) for _ in range(300)]
            send(fifo, b"".join(line(w.pid, "hung", 1.5) for w in workers))
            deadline = time.monotonic() + BOUND
            for w in workers:
                w.wait(timeout=max(0.1, deadline - time.monotonic()))
                assert w.returncode == -signal.SIGKILL
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()


FLOODER = r"""
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
junk = b"".join(b'{"pid": %d, "scope_id": "j", "expiration_time": oops}\n' % i for i in range(64))
junk += b"".join(b"garbage %d from a flooder that never stops\n" % i for i in range(64))
junk += b"x\n" * 2048  # the cheapest lines to send: the dearest to reject
print("ready", flush=True)
sys.stdin.readline()  # the go
print("flooding", flush=True)  # before its first write, which waits while the pipe is full
os.write(fd, junk)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    os.write(fd, junk)
"""

#: The host's own share, the reference the server's reaps are measured against: a
#: process busy until each deadline (epoch seconds on stdin, one line), as the server is
#: busy with the flood; it prints how late it saw each pass (the time the scheduler kept
#: it off a CPU then) and the share of a CPU it had (its CPU time over wall time).
PROBE = r"""
import json, sys, time
deadlines = json.loads(sys.stdin.readline())
late, wall, cpu = [], time.monotonic(), time.process_time()
for due in deadlines:
    while time.time() < due:
        pass
    late.append(time.time() - due)
share = (time.process_time() - cpu) / (time.monotonic() - wall)
print(json.dumps({"late": late, "share": share}), flush=True)
"""


def _p99(values: list[float]) -> float:
    """The nearest-rank 99th percentile."""
    ordered = sorted(values)
    return ordered[math.ceil(0.99 * len(ordered)) - 1]


@pytest.mark.process
@pytest.mark.timeout(90)
def test_ten_writers_flooding_garbage_never_delay_a_reap_nor_lose_a_kill_record(
    tmp_path: Path,
) -> None:
    """A 4 s flood from 10 writers (the pipe stays full throughout; longer floods only
    repeat the same steady state), 100 sentinels due during it from its first second:
    every kill is logged, the first ten (due within its first 1.25 s) are each reaped
    within 100 ms, and the reap latency's p99 (nearest rank: the 99th of 100) is under
    50 ms, on an idle host; a loaded one gives the server a smaller share of a CPU, so
    the bounds are stretched by the share a probe as busy as the server had in the same
    run, plus the probe's own lateness. A server that read the flood before reaping
    would be seconds late whatever the host. Two-byte garbage lines cost the server most
    per byte sent; it decodes at most 1,024 lines a step, so even the first steps of the
    flood are short.

    The sentinels' timers are sent before the flood begins: a line sent during it waits
    behind up to 1 MiB of garbage in the pipe (a FIFO keeps its order), and its reap
    would then time that wait (the server's ingest), not the reap."""
    fifo, log, flood_seconds, lead = tmp_path / "t.fifo", tmp_path / "events.jsonl", 4.0, 1.0
    with serving(fifo, "--event-log", str(log)) as server:
        sentinels = [Sentinel() for _ in range(100)]
        flooders: list[subprocess.Popen[bytes]] = []
        probe: subprocess.Popen[bytes] | None = None
        try:
            flooders = [
                subprocess.Popen(
                    [sys.executable, "-c", FLOODER, str(fifo), str(flood_seconds)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                for _ in range(10)
            ]
            for f in flooders:  # every flooder has opened the FIFO
                assert f.stdout is not None and f.stdout.readline() == b"ready\n"
            start = time.monotonic()
            for i, s in enumerate(sentinels):  # deadlines spread over the flood
                due = start + lead + i * (flood_seconds - lead - 0.5) / len(sentinels)
                s.arm(fifo, after=due - time.monotonic())
            probe = subprocess.Popen(
                [sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            deadlines = [s.wall_deadline for s in sentinels]
            assert probe.stdin is not None
            probe.stdin.write(json.dumps(deadlines).encode() + b"\n")
            probe.stdin.flush()
            for f in flooders:
                assert f.stdin is not None
                f.stdin.write(b"go\n")
                f.stdin.flush()
            for f in flooders:  # every flooder is writing before the first deadline
                assert f.stdout is not None and f.stdout.readline() == b"flooding\n"
            assert time.monotonic() < start + lead, "the flood began after the first deadline"
            for s in sentinels:
                s.lateness()  # it died
            for f in flooders:
                assert f.wait(BOUND) == 0
            host = json.loads(probe.communicate(timeout=BOUND)[0])
        finally:
            for f in [*flooders, *([probe] if probe is not None else [])]:
                if f.poll() is None:
                    f.kill()
                f.communicate()
            for s in sentinels:
                s.close()
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    records = events(log)
    # The server's work before a reap takes longer on a CPU shared with other work: the
    # bounds are CPU-time bounds stretched by the share the probe had (1 when idle).
    stretch = 1 / min(1.0, max(host["share"], 0.05))
    first = [s.reap_latency(records) for s in sentinels[:10]]  # due by 1.25 s in
    bound = 0.1 * stretch + max(host["late"][:10])
    assert max(first) < bound, f"the first reaps were late: {first}; bound {bound:.3f} s"
    late = [s.reap_latency(records) for s in sentinels]
    p99, bound = _p99(late), 0.05 * stretch + _p99(host["late"])
    assert p99 < bound, (
        f"reap latency p99 {p99:.3f} s, bound {bound:.3f} s (CPU share {host['share']:.2f}); "
        f"the worst: {sorted(late)[-5:]}"
    )


@pytest.mark.process
@pytest.mark.timeout(60)
def test_one_writer_at_the_timer_cap_never_starves_other_workers(tmp_path: Path) -> None:
    """One writer fills the table (``--max-timers 2000``, all for one pid) and keeps
    sending new timers; five workers hung meanwhile still get their timers (each takes
    the place of one of the leaker's) and are reaped within 100 ms of their deadline."""
    fifo, log, stderr = tmp_path / "t.fifo", tmp_path / "events.jsonl", tmp_path / "stderr"
    cap = ("--max-timers", "2000", "--max-timers-per-worker", "2000")
    with (
        stderr.open("wb") as err,
        serving(fifo, "--event-log", str(log), *cap, stderr=err) as server,
        Sentinel() as leaker,
    ):
        body = line(leaker.pid, "leak", 300.0)
        leak = [body.replace(b'"leak"', b'"leak-%d"' % i) for i in range(3000)]
        send(fifo, b"".join(leak[:2000]))  # the table is full
        sentinels = [Sentinel() for _ in range(5)]
        try:
            for sentinel in sentinels:
                sentinel.arm(fifo, after=0.5)
            send(fifo, b"".join(leak[2000:]))  # the leaker goes on, refused
            for sentinel in sentinels:
                sentinel.wait_dead()
        finally:
            for sentinel in sentinels:
                sentinel.close()
        assert leaker.proc.poll() is None, "the leaker's timers are not due"
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    records = events(log)
    assert max(s.reap_latency(records) for s in sentinels) < 0.1
    evicted = [r for r in records if r["event"] == "timer_evicted"]
    assert {(r["pid"], r["for_pid"]) for r in evicted} == {(leaker.pid, s.pid) for s in sentinels}
    said = stderr.read_text()  # evictions and refusals: one line, then a count, per worker
    assert f"timer 'leak-0' of worker {leaker.pid} dropped: the server holds its max" in said
    assert f"4 more timer_evicted (worker {leaker.pid}) event(s)" in said
    assert f"999 more request_rejected (worker {leaker.pid}) event(s)" in said
    stopped = [r for r in records if r["event"] == "server_stopped"][-1]["counters"]
    assert (stopped["evicted"], stopped["cap_rejected"]) == (5, 1000)


def test_a_source_failing_while_serving_ends_serve_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from aiotimer.sources import _fifo_reader  # noqa: PLC0415

    async def broken(self: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_fifo_reader.FifoReader, "run", broken)
    assert main(["serve", "--fifo", str(tmp_path / "t.fifo"), "--loop", "asyncio"]) == 1
    err = capsys.readouterr().err
    assert "aiotimer serve: error: source fifo:" in err and "Input/output error" in err
