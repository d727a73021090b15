"""A script written for torchrun: it learns its place in the run from torchrun's variables
only, and prints them on one line with its own `--name` argument. With `--all-reduce` it
also joins the process group (gloo, `env://`) and all-reduces its rank + 1."""
import argparse
import os

NAMES = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_MAX_RESTARTS",
]

parser = argparse.ArgumentParser()
parser.add_argument("--name")
parser.add_argument("--all-reduce", action="store_true")
args = parser.parse_args()

fields = [f"{name}={os.environ[name]}" for name in NAMES]
print(" ".join(fields + [f"name={args.name}"]), flush=True)

if args.all_reduce:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    print(f"all_reduce sum={total.item()}", flush=True)
    dist.destroy_process_group()
