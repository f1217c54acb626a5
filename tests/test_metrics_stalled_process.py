"""Connections that never read their answers cannot lock a scraper out of ``/metrics``.

A real ``aiotimer serve --metrics-port P``; a local client holds 20 connections (more
than the 16 the port serves at once), each pipelining ``GET /metrics`` requests and never
reading an answer, and opening a new one whenever the server closes one. Once the
server's answers fill those connections' buffers, every slot is taken by a connection
stuck sending its answer. A fresh scraper then asks 20 times, one connection each: every
one is answered (a connection stuck on an answer its peer does not take gives its place
to a newcomer, as one waiting for a request does).

Tolerances: each scrape gets 5 s (it needs a few milliseconds); the stall is waited for
at most 15 s.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from _procs import BOUND, serving

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

STALLED = 20
SCRAPES = 20
SCRAPE_TIMEOUT = 5.0
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
#: Requests pipelined per connection: their answers (~4 KiB each) overflow any buffer
#: a peer with a 4 KiB receive buffer lets the kernel give them.
PIPELINED = 10_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Stallers(threading.Thread):
    """Keeps :data:`STALLED` connections that pipeline requests and never read."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.opened = 0
        self.conns: list[tuple[socket.socket, memoryview]] = []

    def connect(self) -> tuple[socket.socket, memoryview]:
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn.connect(("127.0.0.1", self.port))
        conn.setblocking(False)
        self.opened += 1
        return conn, memoryview(REQUEST * PIPELINED)

    def run(self) -> None:
        self.conns = [self.connect() for _ in range(STALLED)]
        while not self.stop.is_set():
            for i, (conn, left) in enumerate(self.conns):
                try:
                    sent = conn.send(left) if left else 0
                    self.conns[i] = (conn, left[sent:])
                    if not left:  # all sent: probe for a reset by the server
                        conn.send(b"")
                        conn.getpeername()
                except BlockingIOError:
                    pass
                except OSError:
                    conn.close()
                    self.conns[i] = self.connect()
            self.stop.wait(0.02)
        for conn, _ in self.conns:
            conn.close()


def scrape(port: int) -> bool:
    """One ``GET /metrics`` on a new connection: whether a whole 200 came back."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError:
        return False
    head, _, body = data.partition(b"\r\n\r\n")
    return head.startswith(b"HTTP/1.1 200") and b"aiotimer_" in body


def test_connections_that_never_read_do_not_lock_a_scraper_out(tmp_path: Path) -> None:
    port = free_port()
    with serving(tmp_path / "t.fifo", "--no-control", "--metrics-port", str(port)) as server:
        deadline = time.monotonic() + BOUND
        while not scrape(port):
            assert time.monotonic() < deadline, "the metrics port never answered"
            time.sleep(0.05)
        stallers = Stallers(port)
        stallers.start()
        try:
            # Stalled: the last of the pipelined requests stays unsent, the server having
            # stopped reading them because it cannot send their answers.
            deadline = time.monotonic() + BOUND
            while len(stallers.conns) < STALLED or not all(left for _, left in stallers.conns):
                assert time.monotonic() < deadline, "the connections never stalled"
                time.sleep(0.1)
            time.sleep(0.5)
            answered = sum(scrape(port) for _ in range(SCRAPES))
        finally:
            stallers.stop.set()
            stallers.join(BOUND)
        assert answered == SCRAPES, f"{answered} of {SCRAPES} scrapes answered"
        assert server.poll() is None
