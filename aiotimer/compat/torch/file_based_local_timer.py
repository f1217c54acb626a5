"""``torch.distributed.elastic.timer.file_based_local_timer`` on aiotimer: the named-pipe
client and server (see :mod:`aiotimer.compat.torch`).

Besides torch's ``__all__`` it exports the names torch's module imports, so
``from ...file_based_local_timer import TimerRequest`` switches too.
"""

from __future__ import annotations

from aiotimer.compat.torch._api import TimerClient
from aiotimer.compat.torch._clients import FileTimerClient
from aiotimer.compat.torch._requests import FileTimerRequest, TimerRequest
from aiotimer.compat.torch._servers import FileTimerServer, log_debug_info_for_expired_timers

__all__ = [
    "FileTimerClient",
    "FileTimerRequest",
    "FileTimerServer",
    "TimerClient",
    "TimerRequest",
    "log_debug_info_for_expired_timers",
]
