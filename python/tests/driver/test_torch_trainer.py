"""``TorchTrainer.fit()`` with real torch DDP (gloo) on 2 workers, checked against what Ray
Train 2.60 does with the same code (``python-door.md`` in the project's reference notes)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

import pytest

from trainyard import _fit, train
from trainyard.train import (
    Checkpoint,
    CheckpointConfig,
    ControllerError,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
    WorkerGroupError,
)
from trainyard.train.torch import TorchConfig, TorchTrainer

TWO = ScalingConfig(num_workers=2)


def _run(fn, storage, name="run", config=None, **kwargs):  # type: ignore[no-untyped-def]
    scaling = kwargs.pop("scaling_config", TWO)
    run_kwargs = kwargs.pop("run_kwargs", {})
    return TorchTrainer(
        fn,
        train_loop_config=config,
        scaling_config=scaling,
        run_config=RunConfig(name=name, storage_path=storage, **run_kwargs),
        **kwargs,
    ).fit()


# --- the context, the config, the return value, collectives ------------------------------


def context_loop(config):  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    from trainyard.train import collective

    ctx = train.get_context()
    rank = ctx.get_world_rank()
    shared = collective.broadcast_from_rank_zero({"token": f"from rank {rank}"})
    collective.barrier()
    try:
        train.get_dataset_shard("train")
        shard_error = None
    except RuntimeError as error:
        shard_error = str(error)
    seen = {
        "rank": rank,
        "world_size": ctx.get_world_size(),
        "local_rank": ctx.get_local_rank(),
        "local_world_size": ctx.get_local_world_size(),
        "node_rank": ctx.get_node_rank(),
        "experiment": ctx.get_experiment_name(),
        "config": config,
        "shared": shared,
        "group": dist.is_initialized() and dist.get_world_size(),
        "shard_error": shard_error,
        "checkpoint": train.get_checkpoint() is not None,
    }
    train.report({"rank": rank})
    return seen


def test_the_loop_sees_its_context_config_and_peers_and_rank_0_returns(storage) -> None:
    result = _run(context_loop, storage, name="ctx", config={"lr": 0.1})
    seen = result.return_value
    assert seen["rank"] == 0
    assert (seen["world_size"], seen["local_world_size"]) == (2, 2)
    assert (seen["local_rank"], seen["node_rank"]) == (0, 0)
    assert seen["experiment"] == "ctx"
    assert seen["config"] == {"lr": 0.1}
    assert seen["shared"] == {"token": "from rank 0"}
    assert seen["group"] == 2
    assert "prepare_data_loader" in seen["shard_error"]
    assert seen["checkpoint"] is False
    # Ray v2 keeps only metrics that come with a checkpoint.
    assert result.metrics is None and result.checkpoint is None
    assert result.error is None
    assert result.path == os.path.join(storage, "ctx")


def no_argument_loop():  # type: ignore[no-untyped-def]
    return "no config"


def test_a_loop_without_a_parameter_is_called_without_config(storage) -> None:
    assert _run(no_argument_loop, storage).return_value == "no config"


def test_a_closure_travels_by_value(storage) -> None:
    secret = {"value": 41}

    def closure():  # type: ignore[no-untyped-def]
        return secret["value"] + 1

    assert _run(closure, storage).return_value == 42


def reporting_loop():  # type: ignore[no-untyped-def]
    for step in range(3):
        train.report({"step": step, "loss": 1.0 / (step + 1)})


def test_the_metrics_history_holds_every_report_without_a_checkpoint(storage) -> None:
    result = _run(reporting_loop, storage, name="history")
    frame = result.metrics_history
    assert list(frame["step"]) == [0, 1, 2]
    assert list(frame["attempt"]) == [0, 0, 0]
    assert list(frame["world_size"]) == [2, 2, 2]
    assert frame["time"].is_monotonic_increasing
    # Ray's metrics_dataframe holds the metrics of checkpoints only: none here (Ray 2.60:
    # None).
    assert result.metrics_dataframe is None


def atexit_loop(config):  # type: ignore[no-untyped-def]
    import atexit

    rank = train.get_context().get_world_rank()
    path = os.path.join(config["dir"], f"atexit_{rank}")
    atexit.register(lambda: open(path, "w").write("ran"))
    return rank


def test_the_loops_exit_handlers_run_when_its_worker_exits(storage, tmp_path) -> None:
    # A worker leaves without the interpreter's teardown (gloo aborts in it), but after
    # the exit handlers a loop registered (a tracker's finish, logging's flush).
    assert _run(atexit_loop, storage, config={"dir": str(tmp_path)}).return_value == 0
    for rank in (0, 1):
        assert (tmp_path / f"atexit_{rank}").read_text() == "ran"


# --- data, model, device -------------------------------------------------------------------


def data_loop(config):  # type: ignore[no-untyped-def]
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainyard.train import torch as ttorch

    ttorch.enable_reproducibility(seed=7)
    seeded = torch.rand(1).item()
    deterministic = torch.are_deterministic_algorithms_enabled()
    x = torch.arange(1000, dtype=torch.float32).reshape(-1, 1)
    y = 3 * x + 1
    loader = ttorch.prepare_data_loader(
        DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
    )
    model = ttorch.prepare_model(torch.nn.Linear(1, 1))
    optimizer = ttorch.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=1e-7))
    seen = 0
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        seen = 0
        for xb, yb in loader:
            seen += len(xb)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            ttorch.backward(loss)
            optimizer.step()
        rank = train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                torch.save(model.state_dict(), os.path.join(d, "model.pt"))
                checkpoint = Checkpoint.from_directory(d)
            train.report({"epoch": epoch, "loss": loss.item(), "rank": rank}, checkpoint=checkpoint)
    weights = [p.detach().clone() for p in model.parameters()]
    return {
        "seen": seen,
        "model": type(model).__name__,
        "device": str(ttorch.get_device()),
        "devices": [str(d) for d in ttorch.get_devices()],
        "weights": [w.tolist() for w in weights],
        "seeded": seeded,
        "deterministic": deterministic,
    }


def test_each_rank_sees_its_half_of_the_data_through_ddp_on_cpu(storage) -> None:
    result = _run(data_loop, storage, name="data")
    value = result.return_value
    assert value["seen"] == 500
    assert value["model"] == "DistributedDataParallel"
    assert (value["device"], value["devices"]) == ("cpu", ["cpu"])
    import torch

    torch.manual_seed(7)
    assert value["seeded"] == torch.rand(1).item() and value["deterministic"]
    # Rank 0's metrics of the latest report with a checkpoint.
    assert result.metrics is not None
    assert (result.metrics["epoch"], result.metrics["rank"]) == (1, 0)
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert os.listdir(d) == ["model.pt"]
    frame = result.metrics_dataframe
    assert list(frame["epoch"]) == [0, 1]


# --- failures -------------------------------------------------------------------------------


class BadBatch(Exception):
    """A user's own exception class, importable on both sides."""


def raising_loop(config):  # type: ignore[no-untyped-def]
    if train.get_context().get_world_rank() == 1:
        if config["kind"] == "own":
            raise BadBatch("bad batch 7")
        raise ValueError("bad batch 7")
    return "rank 0 done"


def test_a_rank_that_raises_fails_fit_with_its_own_exception(storage) -> None:
    with pytest.raises(TrainingFailedError) as caught:
        _run(raising_loop, storage, name="raise", config={"kind": "value"})
    error = caught.value
    assert isinstance(error, WorkerGroupError)
    assert list(error.worker_failures) == [1]
    failure = error.worker_failures[1]
    assert isinstance(failure, ValueError) and str(failure) == "bad batch 7"
    assert "raising_loop" in failure.traceback_str
    assert str(error).startswith("Training failed due to worker errors:\n")
    assert "[Rank 1]" in str(error) and "ValueError: bad batch 7" in str(error)


def exit_handlers_loop(config):  # type: ignore[no-untyped-def]
    import atexit

    rank = train.get_context().get_world_rank()
    marker = os.path.join(config["dir"], f"exited{rank}")
    atexit.register(lambda: open(marker, "w").close())
    if rank == 1:
        raise ValueError("bad batch 7")
    time.sleep(60)


def test_ranks_that_end_with_a_failed_run_run_their_exit_handlers(storage, tmp_path) -> None:
    # Rank 1 raises; rank 0 is stopped in its sleep. Neither ends at once where it restarts
    # in place (it parks, see trainyard._worker): each ends as the run does, as it would have.
    if not os.access("/sys/fs/cgroup", os.W_OK):
        pytest.skip("workers get no cgroup here (/sys/fs/cgroup is not writable): ranks start cold")
    with pytest.raises(WorkerGroupError):
        _run(exit_handlers_loop, storage, name="exits", config={"dir": str(tmp_path)})
    assert _fit.wait_for(lambda: (tmp_path / "exited1").exists(), 10)
    assert _fit.wait_for(lambda: (tmp_path / "exited0").exists(), 10)


def test_a_users_own_exception_class_is_rebuilt_on_the_driver(storage) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        _run(raising_loop, storage, name="own", config={"kind": "own"})
    assert isinstance(caught.value.worker_failures[1], BadBatch)


def killed_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    checkpoint = train.get_checkpoint()
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "epoch.json")) as f:
                start = json.load(f)["epoch"] + 1
    for epoch in range(start, 5):
        if epoch == 3 and rank == 1 and checkpoint is None:
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as d:
            handed = None
            if rank == 0:
                with open(os.path.join(d, "epoch.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                handed = Checkpoint.from_directory(d)
            train.report({"epoch": epoch}, checkpoint=handed)
    return start


def test_a_sigkilled_rank_resumes_from_the_last_checkpoint_every_rank_reported(storage) -> None:
    result = _run(
        killed_loop,
        storage,
        name="killed",
        run_kwargs={"failure_config": FailureConfig(max_failures=1)},
    )
    # Epochs 0-2 were reported by both ranks: the run resumes at epoch 3 (Ray 2.60 at 2).
    assert result.return_value == 3
    assert result.metrics == {"epoch": 4}


def warm_loop(config):  # type: ignore[no-untyped-def]
    import sys

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().split(b"\0")
    forked = any(arg.endswith(b"/warm.py") for arg in parent)
    if config["die"] and train.get_context().get_world_rank() == 1:
        marker = os.path.join(config["dir"], "died")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    return {"forked": forked, "torch": "torch" in sys.modules}


def test_ranks_start_from_a_warm_python_that_imported_torch_unless_told_not_to(
    storage, tmp_path, monkeypatch
) -> None:
    if not os.access("/sys/fs/cgroup", os.W_OK):
        pytest.skip("workers get no cgroup here (/sys/fs/cgroup is not writable): ranks start cold")
    warm = _run(
        warm_loop,
        storage,
        name="warm",
        config={"die": True, "dir": str(tmp_path)},
        run_kwargs={"failure_config": FailureConfig(max_failures=1)},
    )
    # Rank 0 of the attempt after rank 1's death: forked from the same warm Python.
    assert (tmp_path / "died").exists()
    assert warm.return_value == {"forked": True, "torch": True}
    monkeypatch.setenv("TRAINYARD_WARM_PYTHON", "")
    cold = _run(warm_loop, storage, name="cold", config={"die": False, "dir": str(tmp_path)})
    assert cold.return_value == {"forked": False, "torch": True}


def _first_attempt_kills_rank_1(folder, noted):  # type: ignore[no-untyped-def]
    """Notes ``ATTEMPT PID NOTED`` in the rank's file in `folder`, joins an all_reduce, and in
    the first attempt has rank 1 SIGKILL itself; the attempt, for the other ranks."""
    import torch
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    attempt = int(os.environ["TRAINYARD_RESTART_COUNT"])
    with open(os.path.join(folder, f"rank{rank}"), "a") as f:
        f.write(f"{attempt} {os.getpid()} {noted}\n")
    dist.all_reduce(torch.ones(1))
    if attempt == 0 and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return attempt


def in_place_loop(config):  # type: ignore[no-untyped-def]
    import sys

    import torch
    import torch.distributed as dist

    sys.path.insert(0, config["dir"])
    import leftover  # type: ignore[import-not-found]

    leftover.seen.append(None)
    attempt = _first_attempt_kills_rank_1(config["dir"], len(leftover.seen))
    if attempt == 0:
        try:
            # Stopped for the restart while it waits here: the loop unwinds.
            time.sleep(60)
        finally:
            open(os.path.join(config["dir"], "unwound"), "w").close()
    dist.all_reduce(torch.ones(1))


def _attempts_of(folder, rank):  # type: ignore[no-untyped-def]
    with open(os.path.join(folder, f"rank{rank}")) as f:
        return [tuple(int(x) for x in line.split()) for line in f]


def test_a_surviving_rank_restarts_in_place_unless_told_not_to(
    storage, tmp_path, monkeypatch
) -> None:
    if not os.access("/sys/fs/cgroup", os.W_OK):
        pytest.skip("workers get no cgroup here (/sys/fs/cgroup is not writable): ranks start cold")
    runs = {}
    for mode in ("in place", "forked"):
        folder = tmp_path / mode.replace(" ", "_")
        folder.mkdir()
        (folder / "leftover.py").write_text("seen = []\n")
        if mode == "forked":
            monkeypatch.setenv("TRAINYARD_RESTART_IN_PLACE", "0")
        started = time.monotonic()
        _run(
            in_place_loop,
            storage,
            name=mode.replace(" ", "_"),
            config={"dir": str(folder)},
            run_kwargs={"failure_config": FailureConfig(max_failures=1)},
        )
        # Rank 0 was stopped in its 60 s sleep, not waited for.
        assert time.monotonic() - started < 40
        runs[mode] = [_attempts_of(folder, rank) for rank in (0, 1)]
        pids = {pid for ranks in runs[mode] for _, pid, _ in ranks}
        assert _fit.wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 10), (
            f"{mode}: a rank's process outlived the run"
        )
        runs[mode].append((folder / "unwound").exists())
    (first0, again0), (first1, again1), unwound = runs["in place"]
    # Rank 0: the same process, its modules as the first attempt left them, its loop unwound.
    assert (first0[0], again0[0]) == (0, 1)
    assert again0[1] == first0[1] and again0[2] == 2
    assert unwound
    # Rank 1, killed: a new process.
    assert again1[1] != first1[1] and again1[2] == 1
    (first0, again0), _, unwound = runs["forked"]
    assert again0[1] != first0[1] and again0[2] == 1
    assert not unwound


def blocked_loop(config):  # type: ignore[no-untyped-def]
    import ctypes

    import torch
    import torch.distributed as dist

    attempt = _first_attempt_kills_rank_1(config["dir"], time.time())
    if attempt == 0:
        # Blocked in C for good, as a collective waiting for a dead peer can be: the read
        # is restarted after the SIGTERM, whose handler never gets to run.
        signal.siginterrupt(signal.SIGTERM, False)
        never, _ = os.pipe()
        ctypes.CDLL(None, use_errno=True).read(never, ctypes.create_string_buffer(1), 1)
    dist.all_reduce(torch.ones(1))


def test_a_rank_blocked_in_c_is_forked_anew_without_waiting_out_the_stop_grace(
    storage, tmp_path
) -> None:
    if not os.access("/sys/fs/cgroup", os.W_OK):
        pytest.skip("workers get no cgroup here (/sys/fs/cgroup is not writable): ranks start cold")
    _run(
        blocked_loop,
        storage,
        name="blocked",
        config={"dir": str(tmp_path)},
        run_kwargs={"failure_config": FailureConfig(max_failures=1)},
    )
    (first0, again0), (first1, again1) = (
        [line.split() for line in (tmp_path / f"rank{rank}").read_text().splitlines()]
        for rank in (0, 1)
    )
    assert again0[1] != first0[1], "rank 0 could not unwind: it is a new process"
    # Rank 0 ended 2 s after its SIGTERM (trainyard._worker.UNWIND_PATIENCE_S), not after
    # the agent's 5 s stop grace: rank 1's death to rank 0 training again well within it.
    assert float(again0[2]) - float(first1[2]) < 4.5, (first1, again0)


def test_a_sigkilled_rank_without_restarts_fails_fit_naming_it(storage) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        _run(killed_loop, storage, name="killed0")
    assert list(caught.value.worker_failures) == [1]
    assert "rank 1" in str(caught.value)


def scored_loop(config):  # type: ignore[no-untyped-def]
    for step, acc in enumerate([0.1, 0.5, 0.3, 0.9, 0.2, 0.4]):
        with tempfile.TemporaryDirectory() as d:
            handed = None
            if train.get_context().get_world_rank() == 0:
                with open(os.path.join(d, "step"), "w") as f:
                    f.write(str(step))
                handed = Checkpoint.from_directory(d)
            train.report({"acc": acc, "step": step}, checkpoint=handed)


def test_checkpoint_config_keeps_the_best_and_the_latest(storage) -> None:
    result = _run(
        scored_loop,
        storage,
        name="scored",
        run_kwargs={
            "checkpoint_config": CheckpointConfig(
                num_to_keep=2,
                checkpoint_score_attribute="acc",
                checkpoint_score_order="max",
            )
        },
    )
    # Measured on Ray 2.60 with the same loop: worst to best, the latest left out.
    assert [m["acc"] for _, m in result.best_checkpoints] == [0.5, 0.9]
    assert list(result.metrics_dataframe["acc"]) == [0.5, 0.9]
    assert result.metrics is not None and result.metrics["acc"] == 0.4
    kept = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_"))
    assert len(kept) == 3, kept
    for checkpoint, metrics in result.best_checkpoints:
        with open(os.path.join(checkpoint.path, "step")) as f:
            assert int(f.read()) == metrics["step"]


def async_loop():  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    left = []
    for step in range(3):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, f"shard_{rank}"), "w") as f:
            f.write(str(step))
        train.report(
            {"step": step},
            checkpoint=Checkpoint.from_directory(d),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
        )
        left.append(d)
    return left


def test_async_checkpoints_commit_in_order_and_their_folders_are_deleted(storage) -> None:
    result = _run(async_loop, storage, name="async")
    assert result.metrics == {"step": 2}
    assert result.checkpoint is not None
    assert sorted(os.listdir(result.checkpoint.path)) == ["shard_0", "shard_1"]
    assert not any(os.path.exists(d) for d in result.return_value)


def async_then_die_loop():  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    rank = train.get_context().get_world_rank()
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            parts = {}
            for name in sorted(os.listdir(d)):
                with open(os.path.join(d, name), "rb") as f:
                    parts[name] = f.read()
        return {name: (len(data), data[:1]) for name, data in parts.items()}
    for step in (1, 2):
        dist.barrier()
        d = tempfile.mkdtemp()
        with open(os.path.join(d, f"shard_{rank}"), "wb") as f:
            f.write(bytes([step]) * (32 << 20))
        kept = step == 1
        train.report(
            {"step": step},
            checkpoint=Checkpoint.from_directory(d),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
            delete_local_checkpoint_after_upload=not kept,
        )
        # Taken once the agent reads the report, moments after it returned: gone, or kept
        # with its file (hard-linked) as it was.
        from trainyard._fit import wait_for

        assert wait_for(lambda: os.path.isdir(d) == kept, 30)
    # Both ranks' second hand-ins are taken; their agents may still be persisting them.
    dist.barrier()
    if rank == 1:
        os._exit(3)
    time.sleep(60)
    return None


def test_a_rank_dying_right_after_an_async_hand_in_resumes_from_a_whole_checkpoint(
    storage,
) -> None:
    result = _run(
        async_then_die_loop,
        storage,
        name="async_dies",
        run_kwargs={"failure_config": FailureConfig(max_failures=1)},
    )
    parts = result.return_value
    # Every rank's part of the last step both ranks handed in, though rank 0 was still on
    # its way when rank 1 died: never one rank's part alone, or a part cut short.
    assert sorted(parts) == ["shard_0", "shard_1"], parts
    steps = {first for _, first in parts.values()}
    assert steps == {b"\x02"}, parts
    assert all(size == 32 << 20 for size, _ in parts.values()), parts
    committed = sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_"))
    for name in committed:
        assert sorted(os.listdir(os.path.join(result.path, name))) == ["shard_0", "shard_1"]


def dcp_loop():  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed
    import torch.distributed.checkpoint as dcp

    ctx = train.get_context()
    rank = ctx.get_world_rank()
    model = torch.nn.Linear(4, 2)
    start, loaded = 0, None
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        state = {"model": model.state_dict(), "step": torch.tensor(-1)}
        dcp.load(state, checkpoint_id=checkpoint.path)
        model.load_state_dict(state["model"])
        start, loaded = int(state["step"]) + 1, float(model.weight[0, 0])
    for step in range(start, 3):
        with torch.no_grad():
            model.weight.fill_(float(step))
        # Written by the ranks themselves, straight into the run folder.
        path = ctx.get_storage().build_checkpoint_path_from_name(f"dcp/step_{step}")
        dcp.save({"model": model.state_dict(), "step": torch.tensor(step)}, checkpoint_id=path)
        train.report(
            {"step": step},
            checkpoint=Checkpoint(path),
            checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
            delete_local_checkpoint_after_upload=True,
        )
        assert os.path.isdir(path), "NO_UPLOAD deletes nothing"
        if step == 1 and checkpoint is None:
            # Both ranks' reports of step 1 have gone on to the driver.
            torch.distributed.barrier()
            if rank == 1:
                os._exit(3)
    outside = tempfile.mkdtemp()
    with open(os.path.join(outside, "model.pt"), "w") as f:
        f.write("not in the run folder")
    try:
        train.report(
            {"step": 3},
            checkpoint=Checkpoint(outside),
            checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
        )
        refused = None
    except train.ReportError as error:
        refused = str(error)
    return {"start": start, "loaded": loaded, "refused": refused}


def test_checkpoints_torch_writes_into_the_run_folder_are_registered_and_resumed_from(
    storage,
) -> None:
    result = _run(
        dcp_loop,
        storage,
        name="dcp",
        run_kwargs={"failure_config": FailureConfig(max_failures=1)},
    )
    back = result.return_value
    # Resumed from the step both ranks reported before rank 1 died, loaded with dcp.load.
    assert (back["start"], back["loaded"]) == (2, 1.0), back
    assert "inside the run folder" in back["refused"], back
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(result.path, "dcp", "step_2")
    assert ".metadata" in os.listdir(result.checkpoint.path)
    # Registered where they are: nothing was copied into checkpoint folders.
    assert not [d for d in os.listdir(result.path) if d.startswith("checkpoint_")]
    with open(os.path.join(result.path, "run.json")) as f:
        record = json.load(f)
    assert [c["dir"] for c in record["checkpoints"]] == ["dcp/step_0", "dcp/step_1", "dcp/step_2"]


def resumed_loop():  # type: ignore[no-untyped-def]
    checkpoint = train.get_checkpoint()
    assert checkpoint is not None
    with checkpoint.as_directory() as d:
        with open(os.path.join(d, "state")) as f:
            return f.read()


def test_resume_from_checkpoint_is_what_get_checkpoint_gives(storage, tmp_path) -> None:
    start = tmp_path / "start"
    start.mkdir()
    (start / "state").write_text("from before")
    with pytest.warns(UserWarning, match="Ray 2.60 raises DeprecationWarning"):
        result = _run(
            resumed_loop, storage, resume_from_checkpoint=Checkpoint.from_directory(start)
        )
    assert result.return_value == "from before"


# --- resources --------------------------------------------------------------------------------


def hungry_loop():  # type: ignore[no-untyped-def]
    if train.get_context().get_world_rank() == 1:
        hog = bytearray(1536 * 1024 * 1024)
        hog[::4096] = b"x" * len(hog[::4096])
    return "fed"


def test_memory_per_worker_is_enforced(storage) -> None:
    scaling = ScalingConfig(
        num_workers=2, resources_per_worker={"CPU": 1, "memory": 1024 * 1024 * 1024}
    )
    with pytest.raises(TrainingFailedError) as caught:
        _run(hungry_loop, storage, scaling_config=scaling)
    text = str(caught.value)
    assert "rank 1" in text.lower() and "memory" in text, text


def test_gpus_on_a_machine_without_them_fail_within_seconds_naming_gpus(storage) -> None:
    started = time.monotonic()
    with pytest.raises(TrainingFailedError) as caught:
        _run(no_argument_loop, storage, scaling_config=ScalingConfig(num_workers=2, use_gpu=True))
    assert time.monotonic() - started < 10
    assert isinstance(caught.value, ControllerError)
    assert "GPU" in str(caught.value)


def world_size_loop():  # type: ignore[no-untyped-def]
    return train.get_context().get_world_size()


def test_trainyard_num_cpus_declares_the_local_runtimes_cpus_as_ray_init_num_cpus_does(
    storage, monkeypatch
) -> None:
    # Two workers that together ask for more CPUs than this machine has. Ray 2.60, measured
    # here (2 CPUs): after `ray.init(num_cpus=2 * per_worker)` the same trainer runs and
    # `return_value` is 2; without it Ray would wait for the CPUs, and trainyard fails at once.
    per_worker = (os.cpu_count() or 1) + 1
    scaling = ScalingConfig(num_workers=2, resources_per_worker={"CPU": per_worker})
    with pytest.raises(ControllerError, match="CPU"):
        _run(world_size_loop, storage, "refused", scaling_config=scaling)
    monkeypatch.setenv("TRAINYARD_NUM_CPUS", str(2 * per_worker))
    assert _run(world_size_loop, storage, "declared", scaling_config=scaling).return_value == 2


def test_the_placement_strategy_is_taken(storage) -> None:
    scaling = ScalingConfig(
        num_workers=2, resources_per_worker={"CPU": 0.5}, placement_strategy="SPREAD"
    )
    assert _run(world_size_loop, storage, scaling_config=scaling).return_value == 2
    with pytest.raises(ValueError):
        ScalingConfig(num_workers=2, placement_strategy="EVERYWHERE")


def test_an_elastic_range_runs_within_its_bounds(storage) -> None:
    result = _run(world_size_loop, storage, scaling_config=ScalingConfig(num_workers=(1, 2)))
    assert result.return_value in (1, 2)


def test_torch_config_sets_the_process_group(storage) -> None:
    def backend():  # type: ignore[no-untyped-def]
        import torch.distributed as dist

        return dist.get_backend()

    result = TorchTrainer(
        backend,
        torch_config=TorchConfig(backend="gloo", timeout_s=60),
        scaling_config=TWO,
        run_config=RunConfig(storage_path=storage),
    ).fit()
    assert result.return_value == "gloo"


# --- Ray's own example, with ``ray.train`` replaced by ``trainyard.train`` -------------------


def test_rays_torch_linear_example_runs_with_one_import_changed(storage, tmp_path) -> None:
    """``ray/train/examples/pytorch/torch_linear_example.py`` from the installed Ray: every
    rank saves ``model.pt`` into each checkpoint, as Ray accepts. Only its ``__main__`` block
    (``ray.init``, argument parsing) is replaced by a call of its ``train_linear``."""
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("Ray is not installed here: its example is not available")
    root = list(spec.submodule_search_locations)[0]
    example = os.path.join(root, "train", "examples", "pytorch", "torch_linear_example.py")
    with open(example, encoding="utf-8") as file:
        source = file.read()
    ported = source.replace("ray.train", "trainyard.train")
    assert ported.count("trainyard.train") == 3, "the example imports ray.train three times"
    body = ported.split('if __name__ == "__main__":')[0]
    script = tmp_path / "torch_linear_example.py"
    script.write_text(
        body
        + "if __name__ == '__main__':\n"
        + "    import json, sys\n"
        + "    metrics = train_linear(num_workers=2, epochs=2, storage_path=sys.argv[1])\n"
        + "    print('METRICS ' + json.dumps(metrics))\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, os.fspath(script), storage],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(out for out in done.stdout.splitlines() if out.startswith("METRICS "))
    metrics = json.loads(line[len("METRICS ") :])
    assert metrics["loss"] >= 0, metrics
    runs = os.listdir(storage)
    assert len(runs) == 1, runs
    folder = os.path.join(storage, runs[0])
    checkpoints = sorted(d for d in os.listdir(folder) if d.startswith("checkpoint_"))
    assert checkpoints, os.listdir(folder)
    for checkpoint in checkpoints:
        assert os.listdir(os.path.join(folder, checkpoint)) == ["model.pt"], checkpoint
