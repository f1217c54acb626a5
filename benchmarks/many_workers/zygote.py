"""The process that forks the workers, so the measuring parent never blocks in fork().

Forking a process that has torch imported takes ~8 ms (up to ~26 ms) on the 2-core
test machine; done in the parent, that would delay its view of other workers' exits.
The zygote is spawned fresh for each run, imports only what its server's client needs,
freezes its heap (forked workers then share its pages), and forks on request: the
parent sends ``(slot, first_block, initial)`` and gets the pid back. Initial workers wait
for the ``"go"`` message, on which the zygote closes the pipe they block on. It ignores
``SIGCHLD``, so the kernel reaps its exited workers; the parent watches each by pidfd.
"""

from __future__ import annotations

import gc
import os
import signal
import traceback
from multiprocessing.connection import Connection
from typing import Any

from benchmarks.many_workers.plan import Block
from benchmarks.many_workers.servers import make_sender
from benchmarks.many_workers.worker import CRASHED, Slots, run_worker

__all__ = ["zygote_main"]


def zygote_main(
    conn: Connection,
    slots_path: str,
    plans: list[list[Block]],
    timeout: float,
    client: tuple[str, Any],
) -> None:
    """Serve fork requests on ``conn`` until it closes (runs in a spawned process)."""
    kind, target = client
    if kind != "aiotimer":
        import torch.distributed.elastic.timer  # noqa: F401, PLC0415  (preload for workers)
    slots = Slots(slots_path)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.collect()
    gc.freeze()
    go_r, go_w = os.pipe()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message == "go":
            os.close(go_w)
            conn.send("gone")
            continue
        slot, first, initial = message
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                conn.close()
                if initial:
                    os.close(go_w)
                else:
                    os.close(go_r)
                run_worker(
                    slots,
                    slot=slot,
                    blocks=plans[slot],
                    first=first,
                    timeout=timeout,
                    make_sender=lambda: make_sender(kind, target),
                    go_fd=go_r if initial else -1,
                )
            except BaseException:
                slots.set(slot, CRASHED, 1.0)
                traceback.print_exc()
                code = 70
            finally:
                os._exit(code)
        conn.send(pid)
