"""How long a rank's death keeps training away, for `cargo xtask bench-python --restart`:
`python restart.py ray|trainyard STORAGE`.

Two workers all-reduce; in the first attempt rank 1 SIGKILLs itself, and the run restarts
once (`FailureConfig(max_failures=1)`). The same code on Ray Train and on trainyard (only
the import differs; trainyard's loop functions start from a warm Python by default). Prints
one JSON line: the seconds from the kill to the last rank's first `all_reduce` after it, and
whether rank 0 trained again in its own process (`in_place`)."""

import json
import os
import sys
import tempfile
import time

if sys.argv[1] == "ray":
    from ray import train
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
else:
    from trainyard import train
    from trainyard.train import FailureConfig, RunConfig, ScalingConfig
    from trainyard.train.torch import TorchTrainer


def loop(config):
    import signal

    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    with open(os.path.join(config["out"], "firsts"), "a") as f:
        f.write(f"{rank} {time.time():.6f} {os.getpid()}\n")
    for _ in range(20):
        dist.all_reduce(tensor)
        time.sleep(0.01)
    if rank == 1:
        try:
            fd = os.open(os.path.join(config["out"], "killed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            fd = None
        if fd is not None:
            os.write(fd, f"{time.time():.6f}".encode())
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
    for _ in range(5):
        dist.all_reduce(tensor)
        time.sleep(0.01)


if __name__ == "__main__":
    storage = sys.argv[2]
    out = tempfile.mkdtemp(prefix="restart_out_")
    TorchTrainer(
        loop,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="restart", storage_path=storage, failure_config=FailureConfig(max_failures=1)
        ),
    ).fit()
    with open(os.path.join(out, "killed")) as f:
        killed = float(f.read())
    again, pids = {}, {}
    with open(os.path.join(out, "firsts")) as f:
        for line in f:
            rank, at, pid = line.split()
            pids.setdefault(rank, []).append(pid)
            if float(at) > killed:
                again.setdefault(rank, float(at))
    assert len(again) == 2, f"not both ranks trained again: {again}"
    # Whether rank 0 trained again in the process it trained in before (in place).
    kept = len(pids["0"]) == 2 and pids["0"][0] == pids["0"][1]
    print(json.dumps({"restart": max(again.values()) - killed, "in_place": kept}))
