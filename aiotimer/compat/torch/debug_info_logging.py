"""``torch.distributed.elastic.timer.debug_info_logging`` on aiotimer
(see :mod:`aiotimer.compat.torch`)."""

from __future__ import annotations

from aiotimer.compat.torch._servers import log_debug_info_for_expired_timers

__all__ = ["log_debug_info_for_expired_timers"]
