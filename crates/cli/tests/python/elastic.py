"""Steps of 0.2 s from the checkpoint it is given, rank 0 handing in a checkpoint with every
step's report; prints its world size and the step it restored. No torch needed. Ends after
$ELASTIC_STEPS steps, or once the file $ELASTIC_STOP_FILE exists."""
import os
import tempfile
import time

from trainyard import train

context = train.get_context()
rank, size = context.get_world_rank(), context.get_world_size()
start = 0
checkpoint = train.get_checkpoint()
if checkpoint is not None:
    with checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "step")) as f:
            start = int(f.read()) + 1
print(f"rank {rank} world_size {size} restored {start}", flush=True)
steps = int(os.environ.get("ELASTIC_STEPS", "30"))
stop = os.environ.get("ELASTIC_STOP_FILE")
for step in range(start, steps):
    if stop and os.path.exists(stop):
        break
    time.sleep(0.2)
    metrics = {"step": step, "world_size": size}
    if rank == 0:
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "step"), "w") as f:
            f.write(str(step))
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(folder))
    else:
        train.report(metrics)
print(f"rank {rank} done at world_size {size}", flush=True)
