"""A torch job whose rank 2 hangs in its data loader on the first attempt.

    aiotimer run --nproc 4 --restart-scope group --dump -- python examples/hang/train.py

Ranks 0, 1 and 3 wait for rank 2 in ``all_reduce``; every rank's timer expires, and
before anything is killed the supervisor takes every rank's stacks: the hang report
names rank 2 and ``load_batch`` first. The group restarts and finishes.
"""

import os
import time

import torch
import torch.distributed as dist

from aiotimer import expires

rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def load_batch() -> torch.Tensor:
    if rank == 2 and attempt == 0:
        time.sleep(3600)  # the data loader hangs
    return torch.ones(1)


dist.init_process_group("gloo")
with expires(after=5, scope="step"):
    batch = load_batch()
    dist.all_reduce(batch)
print(f"rank {rank}: {batch.item():g}", flush=True)
dist.destroy_process_group()
