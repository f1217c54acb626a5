"""Job-wide restarts: the generation key and the decision to bump it. Pure.

How this works
--------------
In job scope every node's workers run under one job-wide *generation*, stored in
``/aiotimer/v1/<job>/generation`` as a :class:`GenerationRecord`; it is each worker's
``AIOTIMER_RESTART_COUNT``. When a node sees one of its workers fail during generation
``g``, it asks :func:`next_generation` what to write and writes it with a
compare-and-set on the key's revision (etcd transaction):

- the key already holds a generation past ``g``, or the job gave up: another node has
  restarted (or ended) the job for this same failure wave; write nothing;
- the job-wide budget (``max_restarts`` within ``window`` seconds, counted in wall time
  since nodes share no monotonic clock) still allows it: write ``g + 1`` with the
  back-off delay every node waits before starting its workers again;
- otherwise write ``gave_up``: every node stops its workers and ends its run.

Every node watches the key and acts on each new value, so a bump by any node restarts
all of them, and a node that starts late, or restarts itself, reads the current
generation first and starts its workers with it.
"""

from __future__ import annotations

import math

import msgspec

from aiotimer.supervisor._restart import RestartPolicy

__all__ = ["GenerationRecord", "next_generation"]


class GenerationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The job-wide restart state (times are epoch seconds).

    ``restarts`` are the times of the restarts the budget still counts; ``node``,
    ``rank`` and ``reason`` say what caused the last bump; ``delay`` is the back-off
    every node waits before starting generation ``generation``.
    """

    generation: int = 0
    restarts: tuple[float, ...] = ()
    at: float | None = None
    node: str | None = None
    rank: int | None = None
    reason: str = ""
    delay: float = 0.0
    gave_up: str | None = None


def next_generation(
    current: GenerationRecord,
    *,
    seen: int,
    policy: RestartPolicy,
    now: float,
    u: float,
    node: str,
    rank: int | None,
    reason: str,
) -> GenerationRecord | None:
    """What to write after a failure during generation ``seen`` (None: nothing).

    Args:
        current: the record as read (``GenerationRecord()`` when the key is absent).
        seen: the generation the failed worker ran under.
        policy: the job-wide budget (``max_restarts`` in ``window``) and back-off.
        now: wall-clock epoch seconds.
        u: uniform in ``[0, 1)``, for the back-off jitter.
        node, rank, reason: what failed, recorded for operators.
    """
    if current.gave_up is not None or current.generation > seen:
        return None
    horizon = now - policy.window
    counted = tuple(t for t in current.restarts if math.isinf(policy.window) or t > horizon)
    who = f"node {node}" + ("" if rank is None else f" rank {rank}")
    if len(counted) >= policy.max_restarts:
        window = "" if math.isinf(policy.window) else f" in {policy.window:g}s"
        return msgspec.structs.replace(
            current,
            restarts=counted,
            at=now,
            node=node,
            rank=rank,
            reason=reason,
            delay=0.0,
            gave_up=(
                f"job restart budget exhausted ({policy.max_restarts} restarts{window}); "
                f"{who}: {reason}"
            ),
        )
    return GenerationRecord(
        generation=current.generation + 1,
        restarts=(*counted, now),
        at=now,
        node=node,
        rank=rank,
        reason=reason,
        delay=policy.backoff.delay(len(counted), u),
    )
