"""The fast path of a :class:`~aiotimer.client.FifoClient`: a block's acquire and
release, each one ``os.write`` under the link's lock, with nothing built that the write
does not need.

:class:`FifoBlocks` holds what the client's blocks share: this process's encoders of
both lines of a block (:func:`~aiotimer.wire.block_encoder`, by signal, dump and
``kill_after``), the open blocks by scope id (their acquire line, replayed after a
restart, and their release line, ready for the block's end), and the scope ids of the
open learned blocks (whose lines are always stamped). The client's ``send_nowait`` is
this path by a request's fields; a block whose client has not replaced ``send_nowait``
calls :meth:`FifoBlocks.acquire` and :meth:`FifoBlocks.release` directly (the client's
``_block_nowait``), which saves the argument shuffling of the generic path and a clock
read (the block passes the one it read).

Either call returns ``False`` having written nothing when the write would need a wait:
no persistent descriptor, a backlog to write first, the marker due for its check
(acquires only), a full or broken pipe. The slow path (``FifoClient.send``) does the
rest.
"""

from __future__ import annotations

import os
import time
from typing import Final

import msgspec

from aiotimer.client._fifo_link import FifoLink
from aiotimer.wire import PIPE_BUF, BlockEncoder, Request, block_encoder, encode

__all__ = ["FifoBlocks", "stamped"]

#: The most block encoders kept beside the two defaults (a few per process).
_MAX_ENCODERS: Final[int] = 64
_monotonic: Final = time.monotonic
_write: Final = os.write
_ryu: Final = msgspec.json.encode
_AT: Final = b', "at": '


def stamped(line: bytes, at: float) -> bytes:
    """``line`` (a request ending in ``}\n``) with the ``at`` extension appended: the
    bytes of ``encode()`` of its request with ``at``, or ``line`` as it is when that
    would not fit in one atomic write."""
    if 1e-4 <= at < 1e16:  # where msgspec writes what repr() writes (see wire._encoder)
        out = line[:-2] + _AT + _ryu(at) + b"}\n"
        if len(out) <= PIPE_BUF:
            return out
    return line


class FifoBlocks:
    """The open blocks of this process through one client, and their fast path.

    Attributes:
        pid: this process's id (refreshed in a forked child, with the encoders).
        start_time: this process's start time (``/proc/self/stat``), on every acquire.
        open_scopes: the open blocks: scope id -> (acquire line, release line).
        learned_scopes: the scope ids of the open learned blocks.
    """

    __slots__ = (
        "_encode_block",
        "_encode_dump_block",
        "_encoders",
        "_link",
        "_signal",
        "learned_scopes",
        "open_scopes",
        "pid",
        "start_time",
    )

    def __init__(
        self,
        link: FifoLink,
        open_scopes: dict[str, tuple[bytes, bytes]],
        signal: int,
        pid: int,
        start_time: int | None,
    ) -> None:
        self._link = link
        self._signal = signal
        self.open_scopes = open_scopes
        self.learned_scopes: set[str] = set()
        self._encoders: dict[tuple[int | None, bool, float], BlockEncoder] = {}
        self.reset(pid, start_time)

    def reset(self, pid: int, start_time: int | None) -> None:
        """Forget every block and encoder: this is process ``pid`` now (a forked child's
        blocks are not its parent's)."""
        self.pid = pid
        self.start_time = start_time
        self._encode_block = block_encoder(pid, self._signal, start_time)
        self._encode_dump_block = block_encoder(pid, self._signal, start_time, dump=True)
        self._encoders.clear()
        self.open_scopes.clear()
        self.learned_scopes.clear()

    def acquire(  # noqa: PLR0917 (positional: the hot path)
        self,
        scope_id: str,
        expiration_time: float,
        mono: float,
        now: float,
        signal: int | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
    ) -> bool:
        """Write the acquire of ``scope_id``'s block (deadlines ``expiration_time`` on
        the epoch and ``mono`` on ``time.monotonic()``, read at ``now`` on it; ``signal``
        ``None`` for the client's) at once and remember the block, or return ``False``
        having written nothing. Rings the bell when the deadline is near."""
        link = self._link
        if now > link.recheck_at:  # the marker is due for its check: the slow path's
            return False
        if signal is None and not dump and not kill_after:
            encode_block = self._encode_block
        else:  # encoder(), its common case inlined: an async block's two tiers
            encode_block = self._encoders.get((signal, dump, kill_after)) or self.encoder(
                signal, dump, kill_after
            )
        lines = encode_block(scope_id, expiration_time, mono)
        line = stamped(lines[0], now) if link.stamps else lines[0]
        lead = mono - now
        lock = link.lock
        lock.acquire()  # not `with`: half the cost, and this is the path of every block
        try:
            fd = link.fd
            if fd is None or link.backlog:
                return False
            _write(fd, line)
            if lead < link.bell_lead:
                link.ring_locked(lead, now)
        except OSError:
            return False  # full, or broken: the slow path knows what to do
        finally:
            lock.release()
        self.open_scopes[scope_id] = lines
        return True

    def release(self, scope_id: str, cancelled: bool = False) -> bool:
        """Forget ``scope_id``'s block and write its release at once (``cancelled``: its
        task was cancelled at its deadline, and the line says so), or return ``False``
        having written nothing (the block is forgotten either way)."""
        link = self._link
        tracked = self.open_scopes.pop(scope_id, None)
        learned = self.learned_scopes
        at = _monotonic() if link.stamps or (learned and learned_ended(learned, scope_id)) else None
        if tracked is None or cancelled:
            line = encode(Request(self.pid, scope_id, -1, 0, cancelled=cancelled, at=at))
        else:
            line = tracked[1] if at is None else stamped(tracked[1], at)
        lock = link.lock
        lock.acquire()
        try:
            fd = link.fd
            if fd is None or link.backlog:
                return False
            _write(fd, line)
        except OSError:
            return False
        finally:
            lock.release()
        return True

    def encoder(self, signal: int | None, dump: bool, kill_after: float = 0.0) -> BlockEncoder:
        """The block encoder of this process's blocks reaped with ``signal`` (``None``:
        the client's), asking for a stack dump first if ``dump``, with a first tier
        ``kill_after`` seconds before the reap if ``kill_after > 0``."""
        key = (signal, dump, kill_after)
        if signal == self._signal:
            signal = None
        if signal is None and not kill_after:
            return self._encode_dump_block if dump else self._encode_block
        encoder = self._encoders.get(key)
        if encoder is None:
            if len(self._encoders) >= _MAX_ENCODERS:
                self._encoders.clear()
            encoder = self._encoders[key] = block_encoder(
                self.pid,
                self._signal if signal is None else signal,
                self.start_time,
                dump=dump,
                kill_after=kill_after or None,
            )
        return encoder


def learned_ended(learned: set[str], scope_id: str) -> bool:
    """Whether ``scope_id``'s block was a learned one (it is forgotten now it ends)."""
    if scope_id in learned:
        learned.discard(scope_id)
        return True
    return False
