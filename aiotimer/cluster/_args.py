"""The cluster layer's command-line options: ``--etcd``/``--job``/``--node`` of a node
that publishes and ``aiotimer status --etcd``'s. Light: adding them imports no store."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass

from aiotimer.errors import ClusterError

__all__ = [
    "NodeConfig",
    "add_job_status_arguments",
    "add_node_arguments",
    "default_job",
    "node_config",
]


def default_job() -> str | None:
    """The job id from the environment: ``AIOTIMER_RUN_ID``, else ``TORCHELASTIC_RUN_ID``."""
    return os.environ.get("AIOTIMER_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or None


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Where and as what a node publishes."""

    endpoints: str
    job: str
    node: str
    ttl: int


def add_node_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--etcd``, ``--job``, ``--node`` and ``--etcd-ttl`` (a node that publishes)."""
    group = parser.add_argument_group(
        "cluster",
        "Publish this node's state to etcd v3 (needs aiotimer[etcd]); `aiotimer status "
        "--etcd ENDPOINTS --job ID` shows the whole job.",
    )
    group.add_argument(
        "--etcd",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="etcd v3 client endpoints to publish this node's record to",
    )
    group.add_argument(
        "--job",
        default=default_job(),
        help="the job id (default: $AIOTIMER_RUN_ID, else $TORCHELASTIC_RUN_ID)",
    )
    group.add_argument(
        "--node",
        default=socket.gethostname(),
        help="this node's name, unique among the job's live nodes (default: the host name)",
    )
    group.add_argument(
        "--etcd-ttl",
        type=int,
        default=10,
        metavar="SECONDS",
        help="lease time to live: a dead node's record disappears this long after it dies "
        "(default: 10)",
    )


def node_config(args: argparse.Namespace) -> NodeConfig | None:
    """The node's cluster settings, or None without ``--etcd``.

    Raises:
        ClusterError: ``--etcd`` without a job id, or a TTL below 1 second.
    """
    if not args.etcd:
        return None
    if not args.job:
        raise ClusterError("--etcd needs a job id: pass --job ID or set AIOTIMER_RUN_ID")
    if args.etcd_ttl < 1:
        raise ClusterError(f"--etcd-ttl must be at least 1 second, got {args.etcd_ttl}")
    return NodeConfig(args.etcd, args.job, args.node, args.etcd_ttl)


def add_job_status_arguments(
    parser: argparse.ArgumentParser, where: argparse._MutuallyExclusiveGroup
) -> None:
    """Add ``--etcd`` (to the ``where`` group of ``--fifo``/``--control``) and ``--job``."""
    where.add_argument(
        "--etcd",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="show a whole job from etcd v3 (with --job; needs aiotimer[etcd])",
    )
    parser.add_argument(
        "--job",
        default=default_job(),
        help="with --etcd: the job id (default: $AIOTIMER_RUN_ID, else $TORCHELASTIC_RUN_ID)",
    )
