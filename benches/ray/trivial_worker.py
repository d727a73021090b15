"""The trivial 2-worker job of `cargo xtask bench-ray`, as a trainyard worker: join the
gloo process group from the environment trainyard sets, all-reduce once, check the sum."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
assert t.item() == dist.get_world_size() * (dist.get_world_size() + 1) / 2, t
dist.destroy_process_group()
