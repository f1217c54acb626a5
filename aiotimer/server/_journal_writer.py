"""The thread that writes the journal file, so that the loop never waits for a disk.

The loop hands it the latest encoded journal (:meth:`JournalWriter.offer`) and goes on:
it does not wait for the write, so a write costs the loop no wake-up of its own (an
``anyio.to_thread`` call would wake it again when the thread is done). Only the latest
offer is written; one superseded before the thread got to it is skipped.

A write that fails is reported once and tried again every ``retry`` seconds, with the
latest offer, until one succeeds (then that is reported too); meanwhile :attr:`problem`
says why, for the server's status. Nothing offered, the
thread sleeps without a timeout: an idle server wakes nobody.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["JournalWriter"]

logger = logging.getLogger("aiotimer")


class JournalWriter:
    """Writes what is offered to ``path`` with ``write(data)``, in its own thread.

    Args:
        path: the journal (for the messages).
        write: writes the whole file (raises :class:`OSError` when it cannot).
        retry: seconds between attempts while writing fails.
    """

    def __init__(self, path: Path, write: Callable[[bytes], None], *, retry: float) -> None:
        self._path = path
        self._write = write
        self._retry = retry
        self._lock = threading.Condition()
        self._pending: bytes | None = None
        self._closing = False
        self._problem: str | None = None
        self._thread = threading.Thread(target=self._run, name="aiotimer-journal", daemon=True)
        self._thread.start()

    @property
    def failing(self) -> bool:
        """Whether the last write failed."""
        return self._problem is not None

    @property
    def problem(self) -> str | None:
        """Why the last write failed (``None``: it worked, or none was tried yet)."""
        return self._problem

    def offer(self, data: bytes) -> None:
        """Write ``data`` soon (replacing what was offered and not yet written)."""
        with self._lock:
            self._pending = data
            self._lock.notify()

    def close(self, timeout: float = 2.0) -> None:
        """Write what is pending, then stop; wait at most ``timeout`` seconds (a write
        stuck on a dead file system is left behind, and reported)."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error(
                "the journal %s is still being written after %g s; left behind",
                self._path,
                timeout,
            )

    def _run(self) -> None:
        while True:
            with self._lock:
                while self._pending is None and not self._closing:
                    self._lock.wait()
                data, self._pending = self._pending, None
                closing = self._closing
            if data is not None:
                self._attempt(data)
            if closing:
                return
            if self._problem is not None:
                with self._lock:  # try again after ``retry``, with the latest offer
                    if self._pending is None:
                        self._pending = data
                    self._lock.wait_for(lambda: self._closing, self._retry)

    def _attempt(self, data: bytes) -> None:
        try:
            self._write(data)
        except OSError as exc:
            if self._problem is None:
                logger.error(
                    "cannot write journal %s (%s); a restarted server may not learn "
                    "the open timers; retrying every %g s",
                    self._path,
                    exc,
                    self._retry,
                )
            self._problem = str(exc) or repr(exc)
        else:
            if self._problem is not None:
                logger.warning("journal %s is written again", self._path)
            self._problem = None
