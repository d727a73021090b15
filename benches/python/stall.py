"""How long `train.report` holds up training when it hands in a checkpoint, for
`cargo xtask bench-python --stall`: `python stall.py ray|trainyard SYNC|ASYNC STORAGE`.

Two workers; each rank hands in a checkpoint of `MIB` MiB (one file of its own, written
just before) with every report, `REPORTS` reports in all, the same code on Ray Train and on trainyard (only the
import differs). Prints one JSON line: every report's stall on every rank (seconds from the
call to its return; each rank's `REPORTS` in a row, rank 0's first), and the time from the last report's call to `fit()` returning, by
which the last checkpoint is committed."""

import json
import sys
import time

if sys.argv[1] == "ray":
    from ray import train
    from ray.train import Checkpoint, CheckpointUploadMode, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
else:
    from trainyard import train
    from trainyard.train import Checkpoint, CheckpointUploadMode, RunConfig, ScalingConfig
    from trainyard.train.torch import TorchTrainer

MIB = 256
REPORTS = 20


def loop(config):
    import os
    import tempfile

    rank = train.get_context().get_world_rank()
    block = os.urandom(1 << 20)
    stalls = []
    last_call = 0.0
    for step in range(REPORTS):
        d = tempfile.mkdtemp(prefix="stall_")
        with open(os.path.join(d, f"shard_{rank}.bin"), "wb") as f:
            for _ in range(MIB):
                f.write(block)
        last_call = time.time()
        start = time.perf_counter()
        train.report(
            {"step": step},
            checkpoint=Checkpoint.from_directory(d),
            checkpoint_upload_mode=CheckpointUploadMode[config["mode"]],
        )
        stalls.append(time.perf_counter() - start)
        if config["mode"] == "SYNC":
            import shutil

            shutil.rmtree(d, ignore_errors=True)
    with open(os.path.join(config["out"], f"rank_{rank}.json"), "w") as f:
        json.dump({"stalls": stalls, "last_call": last_call}, f)


if __name__ == "__main__":
    import os
    import tempfile

    mode, storage = sys.argv[2], sys.argv[3]
    out = tempfile.mkdtemp(prefix="stall_out_")
    TorchTrainer(
        loop,
        train_loop_config={"mode": mode, "out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="stall", storage_path=storage),
    ).fit()
    ended = time.time()
    ranks = [json.load(open(os.path.join(out, f"rank_{r}.json"))) for r in range(2)]
    print(
        json.dumps(
            {
                "stalls": [s for r in ranks for s in r["stalls"]],
                "commit": ended - max(r["last_call"] for r in ranks),
            }
        )
    )
