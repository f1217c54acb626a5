"""``torch.distributed.elastic.timer.local_timer`` on aiotimer: the
``multiprocessing.Queue`` client and server (see :mod:`aiotimer.compat.torch`).

Besides torch's ``__all__`` it exports the API names torch's module imports, so
``from ...local_timer import TimerRequest`` switches too.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable
from typing import Any

from aiotimer._edges.clock import Clock
from aiotimer.compat.torch._api import RequestQueue, TimerClient, TimerServer
from aiotimer.compat.torch._clients import LocalTimerClient, MultiprocessingRequestQueue
from aiotimer.compat.torch._engine_server import EngineServer
from aiotimer.compat.torch._requests import TimerRequest
from aiotimer.events import Event
from aiotimer.reapers import Reaper
from aiotimer.server import TimerServer as _AioTimerServer

__all__ = [
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
]


class LocalTimerServer(EngineServer):
    """A ``multiprocessing.Queue`` timer server with torch's signature, on aiotimer's engine.

    Serves torch's ``LocalTimerClient`` (``TimerRequest`` objects, reaped with SIGKILL)
    and :class:`LocalTimerClient`. A subclass of
    :class:`~aiotimer.compat.torch.TimerServer`, as torch's is: every reap calls
    :meth:`_reap_worker`, so overriding or patching it works as in torch.
    ``max_interval`` and ``daemon`` are accepted for compatibility only (expiry is
    deadline-driven); ``reaper``, ``clock`` and ``on_event`` as for
    :class:`~aiotimer.compat.torch.FileTimerServer`.
    """

    def __init__(
        self,
        mp_queue: Any,
        max_interval: float = 60,
        daemon: bool = True,
        *,
        reaper: Reaper | None = None,
        clock: Clock | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        super().__init__(
            MultiprocessingRequestQueue(mp_queue),
            max_interval,
            daemon,
            reaper=reaper,
            clock=clock,
            on_event=on_event,
        )
        self._reap_signal = int(_signal.SIGKILL)
        self._build(
            _AioTimerServer(
                queue=mp_queue, reaper=self._hooks, clock=self._clock, on_event=self._dispatch
            )
        )

    def _reap_worker(self, worker_id: int) -> bool:
        """Send the expired timer's signal (SIGKILL for torch's requests) to the worker,
        pinned when it registered: never a recycled pid; ``True`` once sent. Called in
        the server's thread for every reap; override it to reap another way (it must
        not block).

        Raises:
            ProcessGoneError: the worker has exited (its timers are then cleared).
            RefusedTargetError: it must never be signalled (pid <= 1, this process).
            ReapError: the signal failed this time (retried).
        """
        return self._signal_worker(worker_id, self._reap_signal)

    def _reap_with(self, pid: int, signum: int) -> bool:
        # torch's signature has no signal: the reap in progress names it (one at a time,
        # all in the server's thread).
        self._reap_signal = signum
        return self._reap_worker(pid)
