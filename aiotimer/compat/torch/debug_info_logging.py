"""``torch.distributed.elastic.timer.debug_info_logging`` on aiotimer
(see :mod:`aiotimer.compat.torch`)."""

from __future__ import annotations

import logging

__all__ = ["log_debug_info_for_expired_timers"]

logger = logging.getLogger("aiotimer.compat.torch")


def log_debug_info_for_expired_timers(run_id: str, expired_timers: dict[int, list[str]]) -> None:
    """Log the expired timers of run ``run_id`` (pid -> JSON lines), as torch does.

    :class:`~aiotimer.compat.torch.FileTimerServer` calls it through
    :mod:`aiotimer.compat.torch.file_based_local_timer` once per expired timer, so
    patching it there (as torch's tests do) sees every call.

    Args:
        run_id: the job's id, as given to the server.
        expired_timers: the expired timers' requests (``to_json()`` lines) by pid;
            nothing is logged when it is empty.
    """
    if expired_timers:
        logger.info("Timers expired for run:[%s] [%s].", run_id, expired_timers)
