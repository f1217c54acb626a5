"""Logging that never blocks the loop: noise rate limits and a queued stderr."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer._edges.logs import EventLogger, NoiseLimiter, queued_logging
from aiotimer.events import ControlRefused, RequestRejected, WorkerReaped


@given(st.lists(st.tuples(st.sampled_from("ab"), st.floats(0, 100)), max_size=200))
def test_every_noise_event_is_logged_or_summed_up_exactly_once(
    offers: list[tuple[str, float]],
) -> None:
    limiter, logged, summed = NoiseLimiter(interval=5.0), 0, 0
    for kind, now in sorted(offers, key=lambda o: o[1]):
        log, ended = limiter.offer(kind, now, lambda: "sample")
        logged += log
        summed += ended.count if ended is not None else 0
    summed += sum(s.count for s in limiter.due(0.0, everything=True))
    assert logged + summed == len(offers)
    assert limiter.next_due() is None


def test_noise_is_logged_once_per_window_then_summed_up_with_a_sample() -> None:
    limiter = NoiseLimiter(interval=5.0)
    assert limiter.offer("rejected", 0.0, lambda: "first") == (True, None)
    calls: list[str] = []
    for i in range(1, 1000):
        assert (
            limiter.offer("rejected", i / 1000, lambda: calls.append("x") or "second")[0] is False
        )
    assert calls == ["x"], "only the sample is described"
    assert limiter.next_due() == 5.0
    assert limiter.due(4.9) == []
    [summary] = limiter.due(5.0)
    assert (summary.count, summary.sample) == (999, "second")
    assert "999 more rejected" in summary.describe()


def _rejected(i: int) -> RequestRejected:
    return RequestRejected(time=1.0, reason="malformed JSON", line=f"x{i}", source="fifo:/x")


def test_a_flood_of_rejections_costs_two_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    events = EventLogger(interval=60.0)
    with caplog.at_level(logging.INFO, logger="aiotimer"):
        for i in range(10_000):
            events.log(_rejected(i))
        events.log(WorkerReaped(time=1.0, pid=7, signal=9, group=False, scopes=(), step=1, steps=1))
        events.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "'x0'" in messages[0] and "SIGKILL" in messages[1]
    assert "9,999 more request_rejected" in messages[2] and "'x1'" in messages[2]


def test_a_cap_refusal_of_another_worker_is_logged_whatever_one_worker_floods(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = EventLogger(interval=60.0)

    def refused(pid: int, n: int) -> RequestRejected:
        line = f"acquire 's{n}' of pid {pid}"
        return RequestRejected(time=1.0, reason="cap", line=line, source="fifo:/x", pid=pid)

    with caplog.at_level(logging.INFO, logger="aiotimer"):
        for i in range(1000):
            events.log(refused(4242, i))
            events.log(_rejected(i))  # garbage, meanwhile
            events.log(ControlRefused(time=1.0, pid=99, uid=65534))
        events.log(refused(5151, 0))  # another worker: its first refusal is logged
        events.close()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("of pid 5151" in m for m in messages) == 1
    assert sum("uid 65534" in m for m in messages) == 2  # the first, then the summary
    assert any("999 more request_rejected (worker 4242)" in m for m in messages)
    assert any("999 more control_refused event(s)" in m for m in messages)
    assert len(messages) == 7, messages  # 4 first lines, 3 summaries


#: Seconds the unread flood may take before the logger is deemed blocked.
FLOOD_BOUND = 30.0


def test_a_stream_nobody_reads_never_blocks_the_logger() -> None:
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w")
    log = logging.getLogger("aiotimer.test-queued")

    def flood() -> None:
        for i in range(50_000):  # ~3 MB: 50 times what the pipe holds, 5 queues full
            log.warning("line %d of a flood nobody reads", i)

    try:
        with queued_logging(logging.INFO, stream):
            # Nobody reads until the flood has ended: a logger that waited for the stream
            # would wait forever, so finishing at all is the proof (the bound only keeps
            # a failing run short; the flood takes well under a second on an idle core).
            flooding = threading.Thread(target=flood, daemon=True)
            flooding.start()
            flooding.join(FLOOD_BOUND)
            finished = not flooding.is_alive()
            # Drain now: the writer thread catches up and reports what it dropped.
            drained = bytearray()
            reader = threading.Thread(target=lambda: drained.extend(_read_all(read_fd)))
            reader.start()
            flooding.join(FLOOD_BOUND)
        stream.close()
        reader.join(10)
    finally:
        os.close(read_fd)
    assert finished, "logging waited for the stream"
    assert b"log record(s) were dropped" in drained


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_a_turn_of_the_loop_hands_its_records_over_in_one_batch_and_none_is_lost() -> None:
    # Records logged in the loop's thread wait for the end of the loop's turn: a reap's
    # few lines cost the writer one wake-up and one write, not one each.
    stream = _CountingStream()
    log = logging.getLogger("aiotimer.test-burst")

    async def burst() -> None:
        for i in range(5):
            log.warning("burst %d", i)
        log.debug("below the level")
        await asyncio.sleep(0)  # the turn ends: the batch is handed over

    with queued_logging(logging.INFO, stream, fmt="%(message)s"):
        asyncio.run(burst())
    assert stream.getvalue().splitlines() == [f"burst {i}" for i in range(5)]
    assert stream.writes == 1


def test_records_a_closed_loop_still_held_are_written_at_the_end() -> None:
    stream = _CountingStream()
    log = logging.getLogger("aiotimer.test-closed-loop")
    loop = asyncio.new_event_loop()
    with queued_logging(logging.INFO, stream, fmt="%(message)s"):
        # Logged in the loop's last callback: the hand-over it schedules never runs.
        loop.call_soon(lambda: [log.warning("last %d", i) for i in range(3)] and loop.stop())
        loop.run_forever()
        loop.close()
        log.warning("after the loop")
    assert stream.getvalue().splitlines() == ["last 0", "last 1", "last 2", "after the loop"]
