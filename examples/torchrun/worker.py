"""One rank of the example job: three steps of a timed compute and a timed all-reduce.

Run by torchrun (see launch.py). The timer server is found through
``TORCHELASTIC_TIMER_FILE``, which the launcher exports and torchrun passes on; no
``configure()`` call is needed.

On the first attempt (``TORCHELASTIC_RESTART_COUNT == "0"``) rank 1 hangs in step 1,
inside ``with expires(after=STEP_TIMEOUT)``: the timer server kills it at the deadline,
torchrun sees the failed rank, stops the group and starts it again; the second attempt
runs to the end.

Each rank records its pid (``attempt{A}-rank{R}.pid``) and, once finished, its result
(``attempt{A}-rank{R}.done``) in ``AIOTIMER_EXAMPLE_STATUS``, for the launcher to check.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from aiotimer.client import expires

#: Seconds a compute step may take (the hung rank is killed this long after it starts).
STEP_TIMEOUT = float(os.environ.get("AIOTIMER_EXAMPLE_STEP_TIMEOUT", "3"))
#: Seconds an all-reduce may take. Longer than STEP_TIMEOUT: when one rank hangs, its
#: peers wait in the collective, and torchrun stops them when it restarts the group.
COLLECTIVE_TIMEOUT = 60.0
STEPS = 3


def hang() -> None:
    """Stand-in for a real hang (a deadlocked C call, a stuck data loader, ...)."""
    time.sleep(3600)


def init_process_group(rank: int, attempt: int) -> None:
    """Join the gloo group through torchrun's store, under a per-attempt key prefix.

    torchrun keeps one store for the whole job, so after a restart the keys the first
    attempt's ranks published (their gloo addresses) are still there, and a fast rank
    may connect to a dead peer's address (pytorch/pytorch#167288). A prefix per attempt
    keeps each attempt's keys apart.
    """
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]),
        is_master=False,
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt{attempt}", store),
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
    )


def main() -> None:
    """Run this rank's steps."""
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    status = Path(os.environ["AIOTIMER_EXAMPLE_STATUS"])
    (status / f"attempt{attempt}-rank{rank}.pid").write_text(str(os.getpid()))

    with expires(after=COLLECTIVE_TIMEOUT):
        init_process_group(rank, attempt)
    total = torch.zeros(4)
    for step in range(STEPS):
        with expires(after=STEP_TIMEOUT):
            if rank == 1 and attempt == 0 and step == 1:
                print(f"rank {rank} (pid {os.getpid()}): hanging in step {step}", flush=True)
                hang()
            x = torch.full((4,), float(rank + step))
        with expires(after=COLLECTIVE_TIMEOUT):
            dist.all_reduce(x)
        total += x
    dist.destroy_process_group()

    print(f"rank {rank} (pid {os.getpid()}): attempt {attempt} done", flush=True)
    (status / f"attempt{attempt}-rank{rank}.done").write_text(f"{total.tolist()}\n")


if __name__ == "__main__":
    main()
