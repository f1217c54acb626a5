"""Launch detection: what started this process, read from the environment.

``aiotimer run`` (the :class:`~aiotimer.supervisor.Supervisor`) gives each worker its
rank, world size, restart count and run id in environment variables, under aiotimer's
names and under torch's (so torch-style worker code runs unchanged); torchrun sets
torch's. :func:`launch_info` reads them back. The names are defined here, once, for both
the writer and the reader.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from aiotimer.wire import ENV_FIFO, TORCH_ENV_FIFO

__all__ = [
    "ENV_RESTART_COUNT",
    "ENV_RUN_ID",
    "LaunchInfo",
    "Launcher",
    "launch_info",
]

#: How many times this worker's slot has been restarted (``aiotimer run``).
ENV_RESTART_COUNT: Final[str] = "AIOTIMER_RESTART_COUNT"
#: The run's id (``aiotimer run --run-id``).
ENV_RUN_ID: Final[str] = "AIOTIMER_RUN_ID"
TORCH_ENV_RESTART_COUNT: Final[str] = "TORCHELASTIC_RESTART_COUNT"
TORCH_ENV_MAX_RESTARTS: Final[str] = "TORCHELASTIC_MAX_RESTARTS"
TORCH_ENV_RUN_ID: Final[str] = "TORCHELASTIC_RUN_ID"


class Launcher(enum.Enum):
    """What launched a process."""

    AIOTIMER = "aiotimer run"
    TORCHRUN = "torchrun"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class LaunchInfo:
    """What launched this process, and the worker's place in the run.

    Every field but ``launcher`` is ``None`` when its variable is missing or not
    understood. ``fifo`` is the timer server's FIFO the launcher exported.
    """

    launcher: Launcher
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    restart_count: int | None = None
    max_restarts: int | None = None
    run_id: str | None = None
    fifo: str | None = None

    def __bool__(self) -> bool:
        """True when a launcher (``aiotimer run`` or torchrun) started this process."""
        return self.launcher is not Launcher.NONE


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError, TypeError):
        return None


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """What launched this process (``aiotimer run``, torchrun, or nothing). Never raises.

    ``aiotimer run`` is recognised by ``AIOTIMER_RUN_ID`` (it sets torch's variables
    too, so torch-style code sees a torchelastic launch), torchrun by
    ``TORCHELASTIC_RUN_ID`` (torch's ``is_torchelastic_launched()`` test). Ranks come
    from ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE``; the restart count from
    ``AIOTIMER_RESTART_COUNT`` (aiotimer) or ``TORCHELASTIC_RESTART_COUNT`` (torchrun).

    Args:
        environ: the environment to read (default: ``os.environ``).
    """
    env = os.environ if environ is None else environ
    if ENV_RUN_ID in env:
        launcher, run_id, restarts = Launcher.AIOTIMER, env[ENV_RUN_ID], ENV_RESTART_COUNT
    elif TORCH_ENV_RUN_ID in env:
        launcher, run_id, restarts = (
            Launcher.TORCHRUN,
            env[TORCH_ENV_RUN_ID],
            TORCH_ENV_RESTART_COUNT,
        )
    else:
        return LaunchInfo(Launcher.NONE)
    return LaunchInfo(
        launcher,
        rank=_int(env, "RANK"),
        local_rank=_int(env, "LOCAL_RANK"),
        world_size=_int(env, "WORLD_SIZE"),
        restart_count=_int(env, restarts),
        max_restarts=_int(env, TORCH_ENV_MAX_RESTARTS),
        run_id=run_id,
        fifo=env.get(ENV_FIFO) or env.get(TORCH_ENV_FIFO),
    )
