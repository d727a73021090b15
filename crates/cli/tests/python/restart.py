"""Two ranks (gloo) that all_reduce for a moment; in the first attempt rank 1 then SIGKILLs
itself. Each rank says when its first all_reduce of an attempt finished, and rank 1 when it
killed itself (seconds since the epoch), for `cargo xtask bench-e2e`: the time from the kill
to both ranks' first all_reduce of the next attempt is how long the restart kept training
away. The attempt is `TORCHELASTIC_RESTART_COUNT`, which torchrun and trainyard both set."""
import os
import signal
import sys
import time


def say(text):
    # One write, so that the ranks' lines do not interleave where they share a pipe
    # (torchrun's workers write to torchrun's own stdout).
    os.write(1, f"{text}\n".encode())


# Whether what torch defers to a program's first optimizer was imported before this file
# ran (a rank forked from a warm Python that imported torch).
say(f"torch._dynamo preloaded {'torch._dynamo' in sys.modules}")

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
tensor = torch.ones(1)
dist.all_reduce(tensor)
say(f"first all_reduce {attempt} {rank} {time.time():.4f}")
for _ in range(20):
    dist.all_reduce(tensor)
    time.sleep(0.01)
if attempt == 0 and rank == 1:
    say(f"killed {time.time():.4f}")
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(5):
    dist.all_reduce(tensor)
    time.sleep(0.01)
dist.destroy_process_group()
