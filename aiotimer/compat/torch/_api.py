"""torch's abstract API (``TimerClient``, ``RequestQueue``, the polling ``TimerServer``)
and ``configure``/``expires``."""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from types import TracebackType
from typing import Any

from aiotimer.client import release_failed
from aiotimer.compat.torch._requests import TimerNotConfiguredError, TimerRequest
from aiotimer.core import default_scope, scope_at_site, scope_site

logger = logging.getLogger("aiotimer.compat.torch")


# -- the abstract API (torch's shapes) ---------------------------------------------------


class TimerClient(abc.ABC):
    """Acquires and releases timers for the process that holds it (torch's ABC).

    Subclass it for a custom transport; :func:`expires` calls :meth:`acquire` and
    :meth:`release`.
    """

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Set the timer ``scope_id`` of this worker to expire at ``expiration_time``
        (epoch seconds)."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """Release the timer ``scope_id`` of this worker (unknown scopes are ignored)."""


class RequestQueue(abc.ABC):
    """A consumer queue of timer requests (torch's ABC)."""

    @abc.abstractmethod
    def size(self) -> int:
        """The number of requests in the queue now (it may grow before :meth:`get`)."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds in all."""


class TimerServer(abc.ABC):
    """torch's ``TimerServer`` ABC, for servers with a table of their own.

    A subclass implements the four abstract methods; :meth:`start` runs torch's
    watchdog over them in a thread: each round (:meth:`_run_watchdog`) takes a batch
    from ``request_queue`` (waiting up to ``max_interval``), registers it, and reaps
    every worker with expired timers. Unlike torch's, :meth:`stop` is idempotent and a
    stopped server can be started again.

    :class:`FileTimerServer` and :class:`LocalTimerServer` are subclasses whose table is
    aiotimer's deadline-driven engine: they do not poll, and call ``_reap_worker`` at
    each reap (see :mod:`aiotimer.compat.torch._engine_server`).
    """

    def __init__(
        self, request_queue: RequestQueue, max_interval: float, daemon: bool = True
    ) -> None:
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_event = threading.Event()

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquires (set or replace a timer) and releases (negative expiration)."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of ``worker_ids``."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """The timers with ``expiration_time <= deadline``, by worker id."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap ``worker_id``; ``True`` on success (an exception also counts as reaped)."""

    def _reap_worker_no_throw(self, worker_id: Any) -> bool:
        """:meth:`_reap_worker`, treating an exception as a successful reap (torch's rule)."""
        try:
            return self._reap_worker(worker_id)
        except Exception:
            logger.exception("_reap_worker(%r) raised; the worker is considered reaped", worker_id)
            return True

    def _run_watchdog(self) -> None:
        """One watchdog round: take a batch, register it, reap the expired workers."""
        batch_size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(batch_size, self._max_interval))
        reaped: set[Any] = set()
        for worker_id, expired in self.get_expired_timers(time.time()).items():
            scopes = [r.scope_id for r in expired]
            logger.info("reaping worker %r; expired timers: %s", worker_id, scopes)
            if self._reap_worker_no_throw(worker_id):
                reaped.add(worker_id)
            else:
                logger.error("could not reap worker %r; retrying next round", worker_id)
        self.clear_timers(reaped)

    def _watchdog_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._run_watchdog()
            except Exception:
                logger.exception("the watchdog round failed")

    def start(self) -> None:
        """Start the watchdog thread. A second call while it runs is logged and ignored
        (torch starts a second watchdog thread on the same table)."""
        if self._watchdog_thread is not None:
            logger.warning("%s.start(): already running; ignored", type(self).__name__)
            return
        self._stop_event = threading.Event()
        self._watchdog_thread = threading.Thread(
            target=self._watchdog_loop,
            args=(self._stop_event,),
            name=f"{type(self).__name__}-watchdog",
            daemon=self._daemon,
        )
        self._watchdog_thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread and wait for it to end its round. Idempotent."""
        thread, self._watchdog_thread = self._watchdog_thread, None
        self._stop_event.set()
        if thread is not None:
            thread.join()


# -- configure / expires ----------------------------------------------------------------

_timer_client: TimerClient | None = None


def configure(timer_client: TimerClient | None) -> None:
    """Set the client :func:`expires` uses when given none (``None`` removes it)."""
    global _timer_client
    _timer_client = timer_client
    logger.debug("timer client configured: %s", type(timer_client).__name__)


class _Expires(contextlib.ContextDecorator):
    """The context manager :func:`expires` returns (usable once), and, as torch's
    ``@contextmanager`` is, a decorator: ``@expires(after=5)`` times every call."""

    __slots__ = ("_after", "_client", "_entered", "_per_call_scope", "scope")

    def __init__(
        self, after: float, scope: str, client: TimerClient | None, *, per_call_scope: bool
    ) -> None:
        self._after = after
        self.scope = scope
        self._client = client
        self._entered = False
        self._per_call_scope = per_call_scope

    def _recreate_cm(self) -> _Expires:
        # ContextDecorator's hook: a fresh block per call (a default scope gets a new id
        # at the decorator's line, an explicit one is shared, as in torch).
        scope = scope_at_site(scope_site(self.scope)) if self._per_call_scope else self.scope
        return _Expires(self._after, scope, self._client, per_call_scope=False)

    def __enter__(self) -> None:
        if self._entered:
            raise RuntimeError("an expires() block can be entered only once")
        self._entered = True
        client = self._client if self._client is not None else _timer_client
        if client is None:
            raise TimerNotConfiguredError(
                "no timer client: call aiotimer.compat.torch.configure(FileTimerClient(path)) "
                "before using expires(), or pass client=; aiotimer.expires() also finds the "
                "server through TORCHELASTIC_TIMER_FILE"
            )
        self._client = client
        client.acquire(self.scope, time.time() + self._after)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._client is not None
        try:
            self._client.release(self.scope)
        except Exception as release_exc:
            release_failed(self.scope, release_exc, exc, logger=logger)


def expires(after: float, scope: str | None = None, client: TimerClient | None = None) -> _Expires:
    """A block that must finish within ``after`` seconds, or its process is reaped.

    torch's signature: ``with expires(after=10): ...``. Calls ``client.acquire(scope,
    time.time() + after)`` on entry and ``client.release(scope)`` on exit.

    Args:
        after: seconds from entering the block to its deadline.
        scope: the timer's id; by default ``"file.py:LINE#N"`` for the caller's line,
            unique per block (blocks that pass the same ``scope`` share one timer).
        client: the client; by default the one given to :func:`configure`.

    Raises:
        TimerNotConfiguredError: (on entry) no client given or configured.
        TimerServerUnavailableError: (on entry or exit) no server reads the FIFO.

    A failing release never hides the block's own exception (it is logged instead).
    Like torch's, it is also a decorator: ``@expires(after=5)`` times every call.
    """
    return _Expires(
        after, default_scope() if scope is None else scope, client, per_call_scope=scope is None
    )
