"""The JSON-lines event log: one JSON object per event, appended by one writer task.

The loop never waits for the disk: :meth:`EventLog.put` only puts the event into a
bounded in-memory channel (dropping and counting it when the channel is full); the
:meth:`EventLog.run` task writes whatever is queued with ``aiofiles`` (a thread does the
blocking I/O) and flushes after each batch. :meth:`EventLog.close` ends the channel;
``run`` then writes what is left, flushes and returns.
"""

from __future__ import annotations

import os

import aiofiles
import anyio
import anyio.abc
import msgspec

from aiotimer.events import Event

__all__ = ["EventLog"]

_encode = msgspec.json.Encoder().encode


class EventLog:
    """Appends events to ``path`` as JSON lines without ever blocking the caller."""

    def __init__(self, path: str | os.PathLike[str], *, max_queued: int = 10_000) -> None:
        self.path = os.fspath(path)
        self.dropped = 0
        self._send, self._receive = anyio.create_memory_object_stream[Event](max_queued)

    def put(self, event: Event) -> None:
        """Queue ``event`` for writing; if the queue is full, drop it and count it."""
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            self.dropped += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # closed: the server is stopping and the log is being flushed

    def close(self) -> None:
        """End the channel: :meth:`run` drains what is queued and returns."""
        self._send.close()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Open the file (append), then write queued events until :meth:`close`."""
        async with aiofiles.open(self.path, "ab") as f, self._receive:
            task_status.started()
            async for event in self._receive:
                lines = [_encode(event.to_dict())]
                while True:
                    try:
                        lines.append(_encode(self._receive.receive_nowait().to_dict()))
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await f.write(b"\n".join(lines) + b"\n")
                await f.flush()
