"""``torch.distributed.elastic.timer.api`` on aiotimer: the abstract API and
``configure``/``expires`` (see :mod:`aiotimer.compat.torch`)."""

from __future__ import annotations

from aiotimer.compat.torch._api import RequestQueue, TimerClient, TimerServer, configure, expires
from aiotimer.compat.torch._requests import TimerRequest

__all__ = ["RequestQueue", "TimerClient", "TimerRequest", "TimerServer", "configure", "expires"]
