"""Two ranks (gloo): rank 1 sleeps forever while rank 0 waits for it in all_reduce. Each
says when it was ready (seconds since the epoch), for `cargo xtask bench-e2e`, and reports
once then, so that the hang timeout counts from there, however long importing torch took."""
import time

import torch
import torch.distributed as dist
from trainyard import train

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} ready {time.time():.3f}", flush=True)
train.report({"ready": rank})
if rank == 1:
    time.sleep(3600)
dist.all_reduce(torch.ones(1))
print(f"rank {rank} never gets here", flush=True)
