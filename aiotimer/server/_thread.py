"""Thread mode: a :class:`~aiotimer.server.TimerServer` in its own event loop, in a
daemon thread, for synchronous programs (the torch style).

Other threads talk to the server through its thread-safe methods (``acquire``,
``release``, ``submit``, ``snapshot``, ``get_state``, ...), which hand their work to the
server's loop; :attr:`TimerServerThread.loop` is that loop while the thread runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from aiotimer.errors import ServerStateError

if TYPE_CHECKING:
    from aiotimer.server._server import TimerServer

__all__ = ["LoopName", "TimerServerThread", "loop_factory"]


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event-loop factory for ``loop`` (``"auto"``: uvloop when installed)."""
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    if loop == "uvloop":
        uvloop = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    if loop == "asyncio":
        return asyncio.new_event_loop
    raise ValueError(f"unknown event loop {loop!r}: use 'auto', 'asyncio' or 'uvloop'")


LoopName = Literal["auto", "asyncio", "uvloop"]


class TimerServerThread:
    """Runs a :class:`TimerServer` in its own event loop in a daemon thread.

    For synchronous programs (the torch style)::

        with TimerServerThread(TimerServer(fifo="/run/agent.fifo")):
            run_workers()

    ``loop`` picks the event loop: ``"auto"`` (uvloop when installed), ``"asyncio"`` or
    ``"uvloop"``. The thread can be started again after :meth:`stop`.
    """

    def __init__(self, server: TimerServer, *, loop: LoopName = "auto") -> None:
        self.server = server
        self._factory = loop_factory(loop)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread; return once the server's sources accept requests.

        Raises:
            ServerStateError: already started.
            SourceError: a source could not be opened (the thread has ended).
            TimeoutError: the server did not start within ``timeout`` seconds (the
                thread is then stopped).
        """
        if self._thread is not None:
            raise ServerStateError("the server thread is already started")
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="aiotimer-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop(timeout)
            raise TimeoutError(f"the timer server did not start within {timeout} s")
        if self._error is not None:
            error, self._error = self._error, None
            self.stop()
            raise error

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server and return once the thread has ended. Idempotent.

        Raises:
            TimeoutError: the thread did not end within ``timeout`` seconds.
        """
        thread = self._thread
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already finished
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"the timer server thread did not end within {timeout} s")
        self._thread = self._loop = self._stop = None

    @property
    def running(self) -> bool:
        """True while the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop while the thread runs it, else ``None``."""
        return self._loop

    @property
    def thread_id(self) -> int | None:
        """The identifier of the server's thread while it runs, else ``None``."""
        thread = self._thread
        return None if thread is None else thread.ident

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=self._factory) as runner:
            runner.run(self._amain())

    async def _amain(self) -> None:
        self._stop = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        try:
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            return
        finally:
            self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.server.aclose()

    def __enter__(self) -> TimerServerThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<TimerServerThread {'running' if self.running else 'stopped'} {self.server!r}>"
