"""``torch.distributed.elastic.timer``'s API on aiotimer's engine: switch with one import.

Replace::

    import torch.distributed.elastic.timer as timer

with::

    import aiotimer.compat.torch as timer

and keep the rest: ``timer.configure(timer.FileTimerClient(path))``, ``with
timer.expires(after=60): ...``, ``timer.FileTimerServer(path, run_id).start()``,
``timer.LocalTimerServer(mp_queue).start()``. torch's submodule paths answer too:
``aiotimer.compat.torch.api``, ``.local_timer``, ``.file_based_local_timer`` and
``.debug_info_logging`` export what torch's modules of those names export. Importing
this module does not import torch; the requests and lines it produces are the ones
torch's servers and clients expect, in both directions.

What is different (aiotimer's semantics; see docs/migrating-from-torch.md):

* **Prompt expiry.** The servers sleep until the next deadline instead of polling:
  ``max_interval`` is accepted (and kept) but does not bound latency any more.
* **No self-kill.** torch 2.13's ``FileTimerServer`` signals its own process after it
  reaps a worker; this one does not, unless built with ``self_kill=True``.
* **Identity-safe reaping.** Workers are pinned (pidfd) when they register, so a
  recycled pid is never signalled, and a worker that exits has its timers cleared at
  once. pid ``<= 1``, negative pids and the server itself are never signalled.
* **Monotonic deadlines.** The compat clients send, besides torch's epoch
  ``expiration_time``, the same deadline on ``time.monotonic()`` (the ``mono`` key) to
  aiotimer servers, so wall-clock steps cannot fire or postpone a timer.
* **Typed errors** that still satisfy torch's ``except`` clauses:
  :class:`TimerNotConfiguredError` is a ``RuntimeError``,
  :class:`TimerServerUnavailableError` a ``BrokenPipeError``,
  :class:`TimerRequestTooLargeError` a ``RuntimeError``.
* **Unique default scopes.** ``expires()`` without ``scope=`` names the caller's
  ``file:line`` plus a counter (cheap, no ``inspect.stack()``), so every block is its own
  timer. torch 2.13 names every such block ``.../contextlib.py#137`` (its ``expires`` is
  a ``@contextmanager``): all of a process's default-scope blocks share one timer. Pass
  the same ``scope=`` to share one timer on purpose.
* A release that fails never hides the exception of the block it closes.

The servers are subclasses of :class:`TimerServer` run by aiotimer's
:class:`~aiotimer.server.TimerServer` in a daemon thread: every reap calls their
``_reap_worker``, every worker exit is checked with ``is_process_running``, and
``_run_watchdog()`` runs one synchronous round, so subclasses and patches written for
torch's servers keep working (see :mod:`aiotimer.compat.torch._engine_server`). A second
``start()`` is logged and ignored; ``stop()`` is idempotent and a stopped server can be
started again. The clients use aiotimer's :class:`~aiotimer.client.FifoClient` and
:class:`~aiotimer.client.QueueClient`.
"""

from __future__ import annotations

from aiotimer.compat.torch._api import (
    RequestQueue,
    TimerClient,
    TimerServer,
    configure,
    expires,
)
from aiotimer.compat.torch._clients import (
    FileTimerClient,
    LocalTimerClient,
    MultiprocessingRequestQueue,
)
from aiotimer.compat.torch._requests import (
    FileTimerRequest,
    TimerNotConfiguredError,
    TimerRequest,
    TimerRequestTooLargeError,
    TimerServerUnavailableError,
)
from aiotimer.compat.torch.debug_info_logging import log_debug_info_for_expired_timers
from aiotimer.compat.torch.file_based_local_timer import FileTimerServer
from aiotimer.compat.torch.local_timer import LocalTimerServer

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "TimerClient",
    "TimerNotConfiguredError",
    "TimerRequest",
    "TimerRequestTooLargeError",
    "TimerServer",
    "TimerServerUnavailableError",
    "configure",
    "expires",
    "log_debug_info_for_expired_timers",
]
