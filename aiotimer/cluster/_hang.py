"""Job-level hang reports: each node's part in the store, one report from any node.

With ``--restart-scope job`` every node takes its own ranks' hang report before it
restarts (the node whose worker expired at its reap, the others when the new generation
reaches them: :mod:`aiotimer.hang`). Each node writes its part under the job's
key, one key per hung generation and node::

    /aiotimer/v1/<job>/hang/<generation, 8 digits>/<node>

holding its ranks' stacks (:meth:`~aiotimer.hang.RankStacks.to_dict`, each with its
node's name). :func:`read_job_report` assembles the newest generation's parts into one
report over every rank of the job (:func:`~aiotimer.hang.build_report`), so any
node, or ``aiotimer status --etcd --job J --hang-report``, reads the same report. A part
is capped at :data:`MAX_PART_BYTES` (the ranks' raw dumps are dropped first).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import anyio

from aiotimer.cluster._record import job_prefix
from aiotimer.cluster._store import Store
from aiotimer.errors import StoreUnavailableError
from aiotimer.hang import HangReport, RankStacks, build_report

__all__ = ["MAX_PART_BYTES", "hang_key", "publish_part", "read_job_report"]

logger = logging.getLogger("aiotimer.cluster")

#: The most bytes one node's part may take (etcd's default request limit is 1.5 MiB).
MAX_PART_BYTES: Final[int] = 512 * 1024
#: The most seconds writing a part may take.
WRITE_TIMEOUT: Final[float] = 5.0


def hang_key(job: str, generation: int, node: str) -> str:
    """Where node ``node`` writes its part of generation ``generation``'s report."""
    return f"{job_prefix(job)}hang/{generation:08d}/{node}"


def encode_part(report: HangReport, *, node: str, generation: int) -> bytes:
    """``report`` (this node's) as its part of the job's report, within the cap."""
    ranks = [{**r.to_dict(), "node": node} for g in report.groups for r in g.ranks]
    part = {"node": node, "generation": generation, "cause": report.cause, "ranks": ranks}
    data = json.dumps(part).encode()
    if len(data) > MAX_PART_BYTES:
        for rank in ranks:
            rank["text"] = ""
        data = json.dumps(part).encode()[:MAX_PART_BYTES]
    return data


async def publish_part(
    store: Store, *, job: str, node: str, generation: int, report: HangReport
) -> bool:
    """Write this node's part (bounded by :data:`WRITE_TIMEOUT`); ``False`` (logged)
    when it could not be written."""
    key = hang_key(job, generation, node)
    with anyio.move_on_after(WRITE_TIMEOUT):
        try:
            await store.put(key, encode_part(report, node=node, generation=generation))
            return True
        except StoreUnavailableError as exc:
            logger.error("job %s: the hang report of node %s is not in etcd: %s", job, node, exc)
            return False
    logger.error("job %s: writing the hang report of node %s timed out", job, node)
    return False


async def read_job_report(store: Store, job: str) -> HangReport | None:
    """The newest generation's report over every node's part (``None``: none written).

    Raises:
        StoreUnavailableError: the store cannot be reached.
    """
    entries = await store.get_prefix(f"{job_prefix(job)}hang/")
    parts: dict[int, list[dict[str, Any]]] = {}
    for entry in entries:
        try:
            part = json.loads(entry.value)
            parts.setdefault(int(part["generation"]), []).append(part)
        except (ValueError, KeyError, TypeError):
            logger.warning("job %s: %s is not a hang report part; ignored", job, entry.key)
    if not parts:
        return None
    generation = max(parts)
    ranks: list[RankStacks] = []
    causes = []
    for part in sorted(parts[generation], key=lambda p: str(p.get("node"))):
        causes.append(f"node {part.get('node')}: {part.get('cause')}")
        for data in part.get("ranks") or ():
            try:
                ranks.append(RankStacks.from_dict(data))
            except ValueError as exc:
                logger.warning("job %s: a rank of node %s: %s", job, part.get("node"), exc)
    return build_report(ranks, cause="; ".join(causes), generation=generation)
