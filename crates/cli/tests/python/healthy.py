"""Two healthy ranks (gloo) reporting a step every 0.1 s for a few seconds."""
import time

import torch
import torch.distributed as dist
from trainyard import train

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(40):
    time.sleep(0.1)
    t = torch.ones(1)
    dist.all_reduce(t)
    train.report({"step": step})
    print(f"rank {rank} step {step}", flush=True)
print(f"rank {rank} done", flush=True)
