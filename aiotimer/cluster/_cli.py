"""Command-line glue for the cluster layer: ``--etcd``/``--job``/``--node`` and the job view.

``aiotimer serve`` and ``aiotimer run`` add :func:`add_node_arguments` and publish
through :func:`publishing`; ``aiotimer status --etcd`` runs :func:`run_job_status`. The
options themselves are defined in :mod:`aiotimer.cluster._args`, which imports no store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from aiotimer.cluster._args import (
    NodeConfig,
)
from aiotimer.cluster._connect import connect, read_view
from aiotimer.cluster._hang import read_job_report
from aiotimer.cluster._publisher import NodePublisher, NodeStatus
from aiotimer.cluster._view import format_view
from aiotimer.errors import AiotimerError, StoreUnavailableError

if TYPE_CHECKING:
    from aiotimer.server import TimerServer

__all__ = [
    "publishing",
    "run_job_status",
    "server_status",
]

#: The most workers a node record lists (the totals count them all).
MAX_RECORD_WORKERS = 256
#: ``aiotimer status --etcd``: etcd unreachable, or no node of the job runs.
EXIT_NOT_RUNNING = 3
#: ``aiotimer status --etcd``: bad arguments.
EXIT_USAGE = 4


@asynccontextmanager
async def publishing(
    config: NodeConfig | None, describe: Callable[[], NodeStatus]
) -> AsyncIterator[NodePublisher | None]:
    """Publish the node while the block runs (nothing without a config).

    Raises:
        MissingExtraError: ``aiotimer[etcd]`` is not installed.
        NodeNameTakenError: a live node of the job already has this name.
        StoreUnavailableError: etcd cannot be reached at start.
    """
    if config is None:
        yield None
        return
    store = connect(config.endpoints)
    try:
        publisher = NodePublisher(
            store, job=config.job, node=config.node, describe=describe, ttl=config.ttl
        )
        async with publisher:
            yield publisher
    finally:
        await store.aclose()


def server_status(server: TimerServer) -> NodeStatus:
    """A standalone server's :class:`NodeStatus`: its workers (by pid) and timer counts.

    Built from :meth:`TimerServer.snapshot`, whose cost is bounded (it lists at most
    :data:`MAX_RECORD_WORKERS` workers; the totals stay exact), so publishing never
    copies the timer table.
    """
    doc = server.snapshot(MAX_RECORD_WORKERS, sites=0).document
    return NodeStatus(
        role="server",
        workers=doc.workers,
        workers_total=doc.workers_total,
        live_timers=doc.timers_total,
        counters=doc.counters,
    )


# -- aiotimer status --etcd ---------------------------------------------------------------


def run_job_status(args: argparse.Namespace) -> int:
    """``aiotimer status --etcd``: print the job view (or refresh it every ``--watch``).

    Exit status: 0 when at least one node of the job runs, 3 when none does or etcd
    cannot be reached, 4 for a usage error, 1 for any other error.
    """
    if not args.job:
        print("aiotimer status: --etcd needs --job ID (or AIOTIMER_RUN_ID)", file=sys.stderr)
        return EXIT_USAGE
    watch = getattr(args, "watch", None)
    if watch is not None and not watch > 0:
        print("aiotimer status: --watch needs a positive number of seconds", file=sys.stderr)
        return EXIT_USAGE
    try:
        if getattr(args, "hang_report", False):
            return asyncio.run(_job_hang_report(args.etcd, args.job, args.json, args.timeout))
        return asyncio.run(_job_status(args.etcd, args.job, args.json, watch, args.timeout))
    except StoreUnavailableError as exc:
        print(f"aiotimer status: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except (AiotimerError, ValueError) as exc:
        print(f"aiotimer status: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


async def _job_hang_report(endpoints: str, job: str, as_json: bool, timeout: float) -> int:
    """Print the job's last hang report, assembled from every node's part (1: none)."""
    store = connect(endpoints, timeout=timeout)
    try:
        report = await read_job_report(store, job)
    finally:
        await store.aclose()
    if report is None:
        print(f"aiotimer status: job {job} has no hang report", file=sys.stderr)
        return 1
    text = report.to_text()
    data = {"text": text, **report.to_dict()}
    sys.stdout.write(json.dumps(data, indent=1) + "\n" if as_json else text)
    return 0


async def _job_status(
    endpoints: str, job: str, as_json: bool, watch: float | None, timeout: float
) -> int:
    store = connect(endpoints, timeout=timeout)
    try:
        while True:
            view = await read_view(store, job, now=time.time())
            text = json.dumps(view.to_json(), indent=2) + "\n" if as_json else format_view(view)
            if watch is not None and sys.stdout.isatty():
                text = "\x1b[H\x1b[2J" + text
            sys.stdout.write(text)
            sys.stdout.flush()
            if watch is None:
                running = view.totals["running"] + view.totals["stale"]
                return 0 if running else EXIT_NOT_RUNNING
            await asyncio.sleep(watch)
    finally:
        await store.aclose()
