"""Two ranks (gloo): rank 1 raises ValueError("bad batch") after its first step; rank 0 then
fails in the collective it waits in. With `--no-record`, main is not decorated with torch's
@record, so the root cause comes from rank 1's output instead of its error file. With
`--waiting`, rank 0 is already waiting in that collective when rank 1 raises, so it fails
as soon as rank 1's process ends (else it sleeps first and is stopped before it fails)."""
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def load(step):
    if dist.get_rank() == 1 and step == 1:
        raise ValueError("bad batch")
    return torch.ones(1)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        batch = load(step)
        if rank == 0 and step == 1 and "--waiting" not in sys.argv:
            # Fails later than rank 1, so the root cause is rank 1's.
            time.sleep(0.5)
        dist.all_reduce(batch)
        print(f"rank {rank} step {step}", flush=True)


if __name__ == "__main__":
    if "--no-record" in sys.argv:
        main()
    else:
        record(main)()
