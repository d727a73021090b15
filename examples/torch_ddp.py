"""Minimal torch.distributed (gloo, CPU) example for trainyard.

Runs unchanged under torchrun::

    torchrun --nproc-per-node 2 examples/torch_ddp.py

or with the PyTorch env set by hand (or by trainyard) for each process:
MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE.

Each rank all-reduces ``rank + 1`` and checks the sum (exits 1 if wrong),
then trains a tiny DistributedDataParallel linear model for a few steps,
reporting ``{"step": i, "loss": ...}`` through trainyard_report.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import trainyard_report  # noqa: E402

STEPS = 5

# Handle of the last collective, kept alive until interpreter exit. Why: gloo
# runs collectives on its own threads, and the thread that ran one may drop the
# last reference to its work object a moment after wait() returns; freeing it
# needs the GIL (it holds Python state), and if the main thread is already
# finalizing the interpreter, that thread is killed and the process aborts
# ("terminate called without an active exception", SIGABRT). It happened in
# ~1 of 3 runs with torch 2.15 when exiting right after DDP training, because
# DDP keeps the gloo process group (and its threads) alive past
# destroy_process_group(). Holding the handle makes the main thread free it.
_last_work = None


def say(msg: str) -> None:
    """Print one line with a single write(), so ranks sharing a terminal don't
    interleave mid-line (print() writes the text and the newline separately
    when stdout is unbuffered, e.g. PYTHONUNBUFFERED=1)."""
    print(msg + "\n", end="", flush=True)


def main() -> int:
    global _last_work
    dist.init_process_group("gloo")  # env:// rendezvous
    rank = dist.get_rank()
    n = dist.get_world_size()

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    total = int(t.item())
    expected = n * (n + 1) // 2
    say(f"rank {rank}: all_reduce sum = {total} (expected {expected})")
    if total != expected:
        dist.destroy_process_group()
        return 1

    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts anyway)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own data shard
    x = torch.randn(32, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    loss = torch.tensor(0.0)
    for step in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients all-reduced across ranks by DDP
        opt.step()
        trainyard_report.report({"step": step, "loss": loss.item()})

    say(f"rank {rank}: done {STEPS} DDP steps, final loss = {loss.item():.4f}")

    _last_work = dist.barrier(async_op=True)  # see _last_work above
    _last_work.wait()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
