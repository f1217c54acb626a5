"""``torch.distributed.elastic.timer.local_timer`` on aiotimer: the
``multiprocessing.Queue`` client and server (see :mod:`aiotimer.compat.torch`).

Besides torch's ``__all__`` it exports the API names torch's module imports, so
``from ...local_timer import TimerRequest`` switches too.
"""

from __future__ import annotations

from aiotimer.compat.torch._api import RequestQueue, TimerClient, TimerServer
from aiotimer.compat.torch._clients import LocalTimerClient, MultiprocessingRequestQueue
from aiotimer.compat.torch._requests import TimerRequest
from aiotimer.compat.torch._servers import LocalTimerServer

__all__ = [
    "LocalTimerClient",
    "LocalTimerServer",
    "MultiprocessingRequestQueue",
    "RequestQueue",
    "TimerClient",
    "TimerRequest",
    "TimerServer",
]
