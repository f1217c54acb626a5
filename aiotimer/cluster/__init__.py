"""A job's state across nodes, and job-wide restarts, through etcd v3.

Each node (a supervisor or a server) publishes its record under
``/aiotimer/v1/<job>/nodes/<node>``, attached to its own lease, with a
:class:`NodePublisher`; :func:`read_view` builds the job view ``aiotimer status
--etcd`` prints; :class:`JobRestarts` keeps the job-wide restart generation that
``aiotimer run --restart-scope job`` restarts every node's workers by. Everything talks
to a :class:`Store` (the few etcd v3 operations needed): :func:`connect` opens the etcd
one, which needs the ``aiotimer[etcd]`` extra; :class:`aiotimer.testing.MemoryStore` is
the in-memory one for tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer.cluster._args import add_job_status_arguments, add_node_arguments, node_config
    from aiotimer.cluster._cli import publishing, run_job_status, server_status
    from aiotimer.cluster._connect import connect, read_view
    from aiotimer.cluster._generation import GenerationRecord
    from aiotimer.cluster._job import JobRestarts
    from aiotimer.cluster._memory import MemoryStore
    from aiotimer.cluster._node import ClusterSession, cluster_session
    from aiotimer.cluster._publisher import NodePublisher, NodeStatus
    from aiotimer.cluster._record import MemberRecord, NodeRecord, ReapRecord
    from aiotimer.cluster._store import Entry, Store
    from aiotimer.cluster._view import JobView, NodeRow, build_view, format_view

__all__ = [
    "ClusterSession",
    "Entry",
    "GenerationRecord",
    "JobRestarts",
    "JobView",
    "MemberRecord",
    "MemoryStore",
    "NodePublisher",
    "NodeRecord",
    "NodeRow",
    "NodeStatus",
    "ReapRecord",
    "Store",
    "add_job_status_arguments",
    "add_node_arguments",
    "build_view",
    "cluster_session",
    "connect",
    "format_view",
    "node_config",
    "publishing",
    "read_view",
    "run_job_status",
    "server_status",
]

#: Every name loads on first use: adding the command-line options
#: (:mod:`aiotimer.cluster._args`) imports no store, record or publisher.
_LAZY: Final[dict[str, str]] = {
    "ClusterSession": "aiotimer.cluster._node",
    "Entry": "aiotimer.cluster._store",
    "GenerationRecord": "aiotimer.cluster._generation",
    "JobRestarts": "aiotimer.cluster._job",
    "JobView": "aiotimer.cluster._view",
    "MemberRecord": "aiotimer.cluster._record",
    "MemoryStore": "aiotimer.cluster._memory",
    "NodePublisher": "aiotimer.cluster._publisher",
    "NodeRecord": "aiotimer.cluster._record",
    "NodeRow": "aiotimer.cluster._view",
    "NodeStatus": "aiotimer.cluster._publisher",
    "ReapRecord": "aiotimer.cluster._record",
    "Store": "aiotimer.cluster._store",
    "add_job_status_arguments": "aiotimer.cluster._args",
    "add_node_arguments": "aiotimer.cluster._args",
    "build_view": "aiotimer.cluster._view",
    "cluster_session": "aiotimer.cluster._node",
    "connect": "aiotimer.cluster._connect",
    "format_view": "aiotimer.cluster._view",
    "node_config": "aiotimer.cluster._args",
    "publishing": "aiotimer.cluster._cli",
    "read_view": "aiotimer.cluster._connect",
    "run_job_status": "aiotimer.cluster._cli",
    "server_status": "aiotimer.cluster._cli",
}

__getattr__, __dir__ = face_getattr("aiotimer.cluster", globals(), lazy=_LAZY)
