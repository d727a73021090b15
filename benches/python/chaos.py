"""Goodput under chaos, for `cargo xtask bench-chaos`: `python chaos.py ray|trainyard|script OUT`.

Two gloo ranks train a small MLP; a step is its forward and backward pass, the gradients'
`all_reduce`, and a sleep that brings the step to `STEP` seconds. Every step hands in a
checkpoint (the model and the step; `ASYNC` on Ray Train and trainyard, written by rank 0
under a new name and renamed into place with `script`, as a torchrun program does), and a
restarted run goes on from the last committed one. The same loop runs as a `TorchTrainer`
loop function (`ray`: `from ray import train`; `trainyard`: `from trainyard import train`,
on the runtime `$TRAINYARD_RUNTIME` names) and as a script for `torchrun` (`script`).

Whoever runs it kills ranks from outside: each rank writes its pid to `OUT/pid_<rank>` when it
starts (after `import torch` and the process group), and appends one line per step to
`OUT/steps_<rank>`: `<step> <start> <end> <pid>` (Unix seconds). The run stops at the first
step that begins after `OUT/stop` exists (every rank stops at the same step: the ranks agree
on it in the step's `all_reduce`)."""

import os
import sys
import tempfile
import time

STEP = 0.05
WIDTH = 256

MODE = sys.argv[1] if __name__ == "__main__" else os.environ.get("CHAOS_MODE", "trainyard")

if MODE == "ray":
    from ray import train
    from ray.train import Checkpoint, CheckpointUploadMode, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
elif MODE == "trainyard":
    from trainyard import train
    from trainyard.train import (
        Checkpoint,
        CheckpointUploadMode,
        FailureConfig,
        RunConfig,
        ScalingConfig,
    )
    from trainyard.train.torch import TorchTrainer


def _write_atomically(path, text):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def loop(config):
    import torch
    import torch.distributed as dist

    out = config["out"]
    script = config.get("script", False)
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    if script:
        latest = os.path.join(out, "checkpoint.pt")
        if os.path.exists(latest):
            state = torch.load(latest)
            model.load_state_dict(state["model"])
            step = state["step"] + 1
    else:
        checkpoint = train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as d:
                state = torch.load(os.path.join(d, "state.pt"))
            model.load_state_dict(state["model"])
            step = state["step"] + 1
    # The folders handed to report() are made in the bench's own folder: what a contender
    # leaves of them (Ray Train 2.60 leaves many) goes with it.
    staging = os.path.join(out, "staging")
    os.makedirs(staging, exist_ok=True)
    _write_atomically(os.path.join(out, f"pid_{rank}"), str(os.getpid()))
    log = open(os.path.join(out, f"steps_{rank}"), "a", buffering=1)
    stop_file = os.path.join(out, "stop")
    x = torch.randn(64, WIDTH)
    y = torch.randn(64, 1)
    while True:
        start = time.time()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        stop = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flat)
        dist.all_reduce(stop)
        if stop.item() > 0:
            break
        offset = 0
        for p in model.parameters():
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].reshape(p.grad.shape) / dist.get_world_size())
            offset += n
        optimizer.step()
        time.sleep(max(0.0, STEP - (time.time() - start)))
        state = {"model": model.state_dict(), "step": step}
        if script:
            if rank == 0:
                tmp = os.path.join(out, f"checkpoint.pt.{os.getpid()}.tmp")
                torch.save(state, tmp)
                os.replace(tmp, os.path.join(out, "checkpoint.pt"))
        else:
            d = tempfile.mkdtemp(prefix="chaos_", dir=staging)
            torch.save(state, os.path.join(d, "state.pt"))
            train.report(
                {"step": step, "loss": float(loss.item())},
                checkpoint=Checkpoint.from_directory(d),
                checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            )
        log.write(f"{step} {start:.6f} {time.time():.6f} {os.getpid()}\n")
        step += 1


if __name__ == "__main__":
    out = sys.argv[2]
    if MODE == "script":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        loop({"out": out, "script": True})
        dist.destroy_process_group()
    else:
        TorchTrainer(
            loop,
            train_loop_config={"out": out},
            # Memory asked for on every engine alike: a Slurm step gets only the partition's
            # DefMemPerCPU without it, too little for torch.
            scaling_config=ScalingConfig(
                num_workers=2, resources_per_worker={"CPU": 1, "memory": 1024**3}
            ),
            run_config=RunConfig(
                name="chaos",
                storage_path=os.path.join(out, "runs"),
                failure_config=FailureConfig(max_failures=-1),
            ),
        ).fit()
