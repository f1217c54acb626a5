"""Torch worker code, unchanged, under ``aiotimer run``: torch's own timer client finds
the FIFO through ``TORCHELASTIC_TIMER_FILE``, ranks and the restart count come from
torch's variables, and ``init_process_group("gloo")`` rendezvouses through
``MASTER_ADDR``/``MASTER_PORT`` (rank 0 hosts the store: no agent store).

Rank 1 hangs on the first attempt, and rank 0 with it in its collective: both are
reaped. In group scope (torchrun's behaviour, one flag away) that is one group restart,
charged once: a budget of one restart suffices, and both ranks finish. Two rounds of
torch start-up take about 20 s here; the bound is 150 s for a busy machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.torch, pytest.mark.process, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import os, signal, time
import torch
import torch.distributed as dist
from torch.distributed.elastic import timer

timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"], signal.SIGKILL))
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
for step in range(2):
    with timer.expires(after=5, scope=f"step{step}"):
        if rank == 1 and attempt == 0 and step == 1:
            time.sleep(3600)
        t = torch.ones(1)
        dist.all_reduce(t)
# One write(2) per line: the two ranks share stdout, and print() writes the text and
# its newline apart when Python runs unbuffered (PYTHONUNBUFFERED=1), so lines interleave.
os.write(1, f"rank {rank} attempt {attempt} done: {t.item():g}\\n".encode())
dist.destroy_process_group()
"""


def test_torch_workers_run_unchanged_and_restart_as_a_group(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("MASTER_PORT", None)
    result = subprocess.run(
        [sys.executable, "-m", "aiotimer", "run", "--nproc", "2", "--restart-scope", "group",
         "--max-restarts", "1", "--backoff", "0.2", "--stop-timeout", "2", "--",
         sys.executable, str(script)],
        env=env, capture_output=True, text=True, timeout=170, check=False,
    )  # fmt: skip
    out, err = result.stdout, result.stderr
    assert result.returncode == 0, out + err[-4000:]
    assert sorted(out.splitlines()) == ["rank 0 attempt 1 done: 2", "rank 1 attempt 1 done: 2"]
    assert "reaped (SIGKILL): block 'step1' outlived its timer" in err
    restarts = [line for line in err.splitlines() if "restarting worker(s)" in line]
    assert len(restarts) == 1 and "(restart 1 of 1 allowed)" in restarts[0], restarts
