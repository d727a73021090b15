"""Resumable PyTorch DDP training with trainyard checkpoints (gloo, CPU).

Every epoch each rank trains a step of a tiny DistributedDataParallel model and calls
``train.report(metrics, checkpoint=...)``: rank 0 hands in ``model.pt`` (or, with
``SHARDS=1``, every rank hands in its own ``shard_<rank>.pt``, as
torch.distributed.checkpoint does; with ``SHARDS=all``, every rank hands in ``model.pt``,
as Ray Train's examples do, and the checkpoint keeps one copy). After a failure, and when the same ``trainyard run
--name N --storage S`` is started again, ``train.get_checkpoint()`` is the latest committed
checkpoint and training goes on from the epoch after it::

    trainyard run -n 2 --name demo --max-failures 1 -- python examples/torch_checkpoint.py

Knobs (environment): ``EPOCHS`` (6), ``EPOCH_SECONDS`` (0: pause per epoch),
``SHARDS`` (0, 1 or all), ``KILL_RANK1_AFTER`` (rank 1 SIGKILLs itself right after that epoch's
checkpoint, in the first attempt only), ``CHECKPOINT_MB`` (extra MiB of weights per file).
"""

import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainyard import train

_last_work = None  # see examples/torch_ddp.py: keeps gloo's last work alive until exit


def say(msg: str) -> None:
    print(msg + "\n", end="", flush=True)


def main() -> int:
    global _last_work
    epochs = int(os.environ.get("EPOCHS", "6"))
    pause = float(os.environ.get("EPOCH_SECONDS", "0"))
    shards = os.environ.get("SHARDS", "0") == "1"
    every_rank = os.environ.get("SHARDS", "0") == "all"
    kill_after = int(os.environ.get("KILL_RANK1_AFTER", "0"))
    extra = int(os.environ.get("CHECKPOINT_MB", "0")) * 1024 * 1024 // 4

    dist.init_process_group("gloo")
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 1

    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            files = sorted(os.listdir(d))
            name = f"shard_{rank}.pt" if shards else "model.pt"
            state = torch.load(os.path.join(d, name))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
        say(f"rank {rank}: resumed from {checkpoint.path} at epoch {start}; files {files}")

    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(32, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    for epoch in range(start, epochs + 1):
        say(f"rank {rank}: epoch {epoch} start")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # gradients all-reduced across ranks by DDP
        opt.step()
        if pause:
            time.sleep(pause)
        metrics = {"epoch": epoch, "loss": loss.item(), "val": (epoch * 7) % 5}
        with tempfile.TemporaryDirectory() as d:
            handed_in = None
            if shards or every_rank or rank == 0:
                state = {
                    "epoch": epoch,
                    "model": model.module.state_dict(),
                    "optimizer": opt.state_dict(),
                    "padding": torch.zeros(extra),
                }
                name = f"shard_{rank}.pt" if shards else "model.pt"
                torch.save(state, os.path.join(d, name))
                handed_in = train.Checkpoint.from_directory(d)
            # Returns once this rank's files are persisted.
            train.report(metrics, checkpoint=handed_in)
        if epoch == kill_after and rank == 1 and os.environ.get("TRAINYARD_RESTART_COUNT") == "0":
            # Both ranks have handed in this epoch before either goes on.
            dist.barrier()
            say(f"rank {rank}: killing myself after epoch {epoch}")
            os.kill(os.getpid(), signal.SIGKILL)
        if epoch == kill_after and rank != 1 and os.environ.get("TRAINYARD_RESTART_COUNT") == "0":
            dist.barrier()

    say(f"rank {rank}: done at epoch {epochs}")
    _last_work = dist.barrier(async_op=True)
    _last_work.wait()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
