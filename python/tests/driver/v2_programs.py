"""Ray Train v2 programs that the tests run on trainyard and that were run, unchanged but for
the imports (``trainyard`` → ``ray``), on Ray Train 2.60 to measure what Ray does: each
returns what it saw, as JSON-able values, so the tests compare them with Ray's.

They record what happens in files under the run's storage folder, because Ray calls callbacks
and validation functions in processes of their own. To measure on Ray 2.60 (2 workers, this
machine, ``ray.init(num_cpus=4)``)::

    sed 's/trainyard/ray/g' v2_programs.py > /tmp/ray_programs.py
    cd /tmp && PYTHONPATH=/tmp python -c 'import ray; ray.init(num_cpus=4); \
        import ray_programs as p, json; print(json.dumps(p.callbacks_program("/tmp/s")))'
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from typing import Any, Dict, List, Optional

from trainyard import train
from trainyard.train import (
    Checkpoint,
    CheckpointConfig,
    CheckpointConsistencyMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    UserCallback,
    ValidationConfig,
    ValidationTaskConfig,
)
from trainyard.train.torch import TorchTrainer

TWO = ScalingConfig(num_workers=2)


def _checkpoint(scratch: str, rank: int, tag: str) -> Checkpoint:
    """A checkpoint of one file, ``rank<rank>``, holding ``tag``."""
    folder = tempfile.mkdtemp(dir=scratch)
    with open(os.path.join(folder, f"rank{rank}"), "w") as f:
        f.write(tag)
    return Checkpoint.from_directory(folder)


def _files(checkpoint: Optional[Checkpoint]) -> Optional[Dict[str, str]]:
    """What a checkpoint holds: each file's name and text."""
    if checkpoint is None:
        return None
    found = {}
    for name in sorted(os.listdir(checkpoint.path)):
        if name.startswith("rank"):
            with open(os.path.join(checkpoint.path, name)) as f:
                found[name] = f.read()
    return found


def _append(path: str, value: Any) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(value) + "\n")


def _lines(path: str) -> List[Any]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def _reported(found: List[Any]) -> List[Any]:
    return [[_files(c.checkpoint), c.metrics, c.status.name] for c in found]


def _scratch(storage: str) -> str:
    scratch = os.path.join(storage, "scratch")
    os.makedirs(scratch, exist_ok=True)
    return scratch


# --- UserCallback ----------------------------------------------------------------------------


class RecordingCallback(UserCallback):
    """Writes what each hook gets to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context, metrics, checkpoint):  # type: ignore[no-untyped-def]
        _append(
            self.path,
            {
                "hook": "after_report",
                "metrics": metrics,
                "checkpoint": _files(checkpoint),
                "context": [
                    type(run_context).__name__,
                    run_context.get_run_config().name,
                    sorted(run_context.train_loop_config),
                    run_context.scaling_config.num_workers,
                ],
            },
        )

    def after_exception(self, run_context, worker_exceptions):  # type: ignore[no-untyped-def]
        _append(
            self.path,
            {
                "hook": "after_exception",
                "exceptions": {
                    str(rank): [type(e).__name__, str(e)] for rank, e in worker_exceptions.items()
                },
            },
        )


def callbacks_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    scratch = config["scratch"]
    failed_before = os.path.exists(os.path.join(scratch, "failed_once"))
    train.report({"step": 1, "rank": rank})
    checkpoint = _checkpoint(scratch, rank, "2") if rank == 0 else None
    train.report({"step": 2, "rank": rank}, checkpoint=checkpoint)
    if rank == 1 and not failed_before:
        open(os.path.join(scratch, "failed_once"), "w").close()
        raise ValueError("bad batch 7")
    train.report({"step": 3, "rank": rank}, checkpoint=_checkpoint(scratch, rank, "3"))
    _append(
        os.path.join(scratch, f"reported_{rank}.jsonl"),
        _reported(train.get_all_reported_checkpoints()),
    )
    train.report({"step": 4, "rank": rank})


def callbacks_program(storage: str) -> Dict[str, Any]:
    """Two workers report four rounds (a checkpoint of rank 0 in round 2, of both in round
    3); in the first attempt rank 1 raises after round 2; one restart is allowed."""
    scratch = _scratch(storage)
    calls = os.path.join(scratch, "calls.jsonl")
    result = TorchTrainer(
        callbacks_loop,
        train_loop_config={"scratch": scratch},
        scaling_config=TWO,
        run_config=RunConfig(
            name="callbacks",
            storage_path=storage,
            callbacks=[RecordingCallback(calls)],
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    return {
        "calls": _lines(calls),
        "reported": [_lines(os.path.join(scratch, f"reported_{r}.jsonl")) for r in (0, 1)],
        "metrics": result.metrics,
        "checkpoint": _files(result.checkpoint),
    }


class BrokenCallback(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):  # type: ignore[no-untyped-def]
        raise KeyError("callback broke")


def two_reports_loop():  # type: ignore[no-untyped-def]
    train.report({"a": 1})
    time.sleep(1)
    train.report({"a": 2})


def broken_callback_program(storage: str) -> Dict[str, Any]:
    """A callback raises at the first round."""
    try:
        TorchTrainer(
            two_reports_loop,
            scaling_config=TWO,
            run_config=RunConfig(name="broken", storage_path=storage, callbacks=[BrokenCallback()]),
        ).fit()
    except Exception as error:  # noqa: BLE001 - what it is, is the observation
        return {
            "raised": type(error).__name__,
            "bases": [c.__name__ for c in type(error).__mro__[1:3]],
            "message": str(error),
        }
    return {"raised": None}


def not_a_callback_program() -> Dict[str, Any]:
    try:
        RunConfig(callbacks=[object()])  # type: ignore[list-item]
    except Exception as error:  # noqa: BLE001
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None}


# --- get_all_reported_checkpoints ------------------------------------------------------------


def reported_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    scratch = config["scratch"]
    seen: Dict[str, Any] = {}
    if rank == 0:
        seen["before"] = _reported(train.get_all_reported_checkpoints())
        train.report({"i": 1})
        train.report({"i": 2}, checkpoint=_checkpoint(scratch, rank, "2"))
        started = time.monotonic()
        seen["round_2"] = _reported(train.get_all_reported_checkpoints())
        # Rank 1 makes round 2 1.5 s after round 1.
        seen["round_2_waited"] = time.monotonic() - started > 1.0
        train.report({"i": 3}, checkpoint=_checkpoint(scratch, rank, "3"))
        started = time.monotonic()
        seen["now"] = _reported(train.get_all_reported_checkpoints(timeout_s=0))
        seen["now_waited"] = time.monotonic() - started > 0.3
        started = time.monotonic()
        seen["half_a_second"] = _reported(train.get_all_reported_checkpoints(timeout_s=0.5))
        waited = time.monotonic() - started
        seen["half_a_second_waited"] = 0.4 < waited < 1.5
        seen["round_3"] = _reported(
            train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED)
        )
        try:
            train.get_all_reported_checkpoints(consistency_mode="COMMITTED")  # type: ignore[arg-type]
            seen["text_mode"] = None
        except ValueError as error:
            seen["text_mode"] = str(error).splitlines()[-1]
    else:
        train.report({"i": 1, "r": 1})
        time.sleep(1.5)
        train.report({"i": 2, "r": 1})
        # Round 3 comes 3 s after round 2: rank 0 asks in between.
        time.sleep(3)
        train.report({"i": 3, "r": 1})
        seen["round_3"] = _reported(
            train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED, timeout_s=30)
        )
    _append(os.path.join(scratch, f"seen_{rank}.jsonl"), seen)


def reported_program(storage: str) -> Dict[str, Any]:
    """Rank 0 asks for the reported checkpoints before it reports, after round 2 (which
    rank 1 makes late), and three times during round 3; rank 1 after round 3. One checkpoint
    is kept (``num_to_keep=1``)."""
    scratch = _scratch(storage)
    TorchTrainer(
        reported_loop,
        train_loop_config={"scratch": scratch},
        scaling_config=TWO,
        run_config=RunConfig(
            name="reported",
            storage_path=storage,
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    return {f"rank_{r}": _lines(os.path.join(scratch, f"seen_{r}.jsonl"))[0] for r in (0, 1)}


# --- validation ------------------------------------------------------------------------------


def validate(checkpoint, **kwargs):  # type: ignore[no-untyped-def]
    """Records its call; sleeps ``sleep`` seconds; fails, returns no dict, or returns
    ``{"val_loss": v, "shared": "val"}`` as its arguments say."""
    _append(
        kwargs.pop("calls"),
        {
            "files": _files(checkpoint),
            "kwargs": kwargs,
            "pid": os.getpid(),
            "type": type(checkpoint).__name__,
        },
    )
    if kwargs.get("fail"):
        raise RuntimeError("validation broke")
    time.sleep(kwargs.get("sleep", 0.5))
    if kwargs.get("notdict"):
        return 5
    return {"val_loss": kwargs.get("v", 0.5), "shared": "val"}


def validation_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    scratch = config["scratch"]
    seen: Dict[str, Any] = {}
    asks = [
        True,
        ValidationTaskConfig(fn_kwargs={"v": 0.1}),
        ValidationTaskConfig(fn_kwargs={"fail": True}),
        ValidationTaskConfig(fn_kwargs={"sleep": 4}, timeout_s=1.0),
        ValidationTaskConfig(fn_kwargs={"notdict": True}),
        False,
    ]
    for i, ask in enumerate(asks):
        checkpoint = _checkpoint(scratch, rank, str(i))
        started = time.monotonic()
        train.report({"i": i, "shared": "train"}, checkpoint=checkpoint, validation=ask)
        seen.setdefault("report_s", []).append(time.monotonic() - started)
        if rank == 0 and i == 1:
            seen["committed_after_1"] = _reported(
                train.get_all_reported_checkpoints(CheckpointConsistencyMode.COMMITTED)
            )
    if rank == 0:
        seen["validated"] = _reported(train.get_all_reported_checkpoints())
    try:
        train.report({"x": 1}, validation=True)
    except ValueError as error:
        seen["without_checkpoint"] = str(error)
    seen["report_s"] = max(seen["report_s"]) < 0.9
    _append(os.path.join(scratch, f"seen_{rank}.jsonl"), seen)


def validation_program(storage: str) -> Dict[str, Any]:
    """Six checkpoints: validated with the config's kwargs, with a report's own, failing,
    past its timeout, returning no dict, and not validated."""
    scratch = _scratch(storage)
    calls = os.path.join(scratch, "calls.jsonl")
    result = TorchTrainer(
        validation_loop,
        train_loop_config={"scratch": scratch},
        scaling_config=TWO,
        validation_config=ValidationConfig(
            validate, task_config=ValidationTaskConfig(fn_kwargs={"v": 0.7, "calls": calls})
        ),
        run_config=RunConfig(name="validation", storage_path=storage),
    ).fit()
    made = _lines(calls)
    return {
        "calls": [{k: v for k, v in call.items() if k != "pid"} for call in made],
        "one_process_until_the_timeout": len({call["pid"] for call in made[:4]}) == 1
        and made[4]["pid"] != made[0]["pid"]
        and os.getpid() not in {call["pid"] for call in made},
        "seen": [_lines(os.path.join(scratch, f"seen_{r}.jsonl"))[0] for r in (0, 1)],
        "metrics": result.metrics,
        "best": [[_files(c), m] for c, m in result.best_checkpoints],
        "dataframe": [
            {k: (None if v != v else v) for k, v in row.items()}
            for row in result.metrics_dataframe.to_dict("records")
        ],
    }


def scored_validation_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    for i, loss in enumerate([0.5, 0.1, 0.9, 0.3]):
        checkpoint = _checkpoint(config["scratch"], rank, str(i))
        asked = ValidationTaskConfig(fn_kwargs={"v": loss, "sleep": 0.1})
        train.report({"i": i}, checkpoint=checkpoint, validation=asked)


def scored_validation_program(storage: str) -> Dict[str, Any]:
    """Four checkpoints scored by a metric only their validation gives, two kept."""
    scratch = _scratch(storage)
    calls = os.path.join(scratch, "calls.jsonl")
    result = TorchTrainer(
        scored_validation_loop,
        train_loop_config={"scratch": scratch},
        scaling_config=TWO,
        validation_config=ValidationConfig(
            validate, task_config=ValidationTaskConfig(fn_kwargs={"calls": calls})
        ),
        run_config=RunConfig(
            name="scored",
            storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    assert result.path is not None
    return {
        "metrics": result.metrics,
        "best": [m for _, m in result.best_checkpoints],
        "kept": len(
            [
                d
                for d in os.listdir(result.path)
                if d.startswith("checkpoint_") and os.path.isdir(os.path.join(result.path, d))
            ]
        ),
    }


def unasked_validation_loop(config):  # type: ignore[no-untyped-def]
    checkpoint = _checkpoint(config["scratch"], train.get_context().get_world_rank(), "x")
    try:
        train.report({"x": 1}, checkpoint=checkpoint, validation=True)
    except ValueError as error:
        return str(error)
    return None


def unasked_validation_program(storage: str) -> Dict[str, Any]:
    """A report asks for a validation of a trainer without a validation config."""
    result = TorchTrainer(
        unasked_validation_loop,
        train_loop_config={"scratch": _scratch(storage)},
        scaling_config=TWO,
        run_config=RunConfig(name="unasked", storage_path=storage),
    ).fit()
    return {"returned": result.return_value}


# --- checkpoint_upload_fn, get_preemption_info ------------------------------------------------


def upload(checkpoint, checkpoint_dir_name):  # type: ignore[no-untyped-def]
    """Copies the checkpoint into the run folder itself, as Ray's example does."""
    storage = train.get_context().get_storage()
    full = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
    shutil.copytree(checkpoint.path, full, dirs_exist_ok=True)
    rank = train.get_context().get_world_rank()
    _append(
        os.path.join(os.path.dirname(checkpoint.path), f"uploads_{rank}.jsonl"),
        [os.path.relpath(full, storage.experiment_fs_path), sorted(os.listdir(full))],
    )
    return Checkpoint.from_directory(full)


def upload_loop(config):  # type: ignore[no-untyped-def]
    rank = train.get_context().get_world_rank()
    scratch = config["scratch"]
    seen: Dict[str, Any] = {"preemption": repr(train.get_preemption_info())}
    train.report({"a": 1}, checkpoint=_checkpoint(scratch, rank, "a"), checkpoint_upload_fn=upload)
    train.report(
        {"a": 2},
        checkpoint=_checkpoint(scratch, rank, "b"),
        checkpoint_dir_name="mine",
        checkpoint_upload_fn=upload,
    )
    latest = train.get_checkpoint()
    seen["get_checkpoint"] = os.path.relpath(
        latest.path, train.get_context().get_storage().experiment_fs_path
    )
    try:
        train.report(
            {"a": 3},
            checkpoint=_checkpoint(scratch, rank, "c"),
            checkpoint_upload_fn=lambda checkpoint, name: "nope",
        )
    except ValueError as error:
        seen["not_a_checkpoint"] = str(error)
    seen["uploads"] = _lines(os.path.join(scratch, f"uploads_{rank}.jsonl"))
    _append(os.path.join(scratch, f"seen_{rank}.jsonl"), seen)


def upload_program(storage: str) -> Dict[str, Any]:
    """Both ranks persist two checkpoints with their own upload function (the second into a
    folder they name), then hand one that returns no ``Checkpoint``."""
    scratch = _scratch(storage)
    result = TorchTrainer(
        upload_loop,
        train_loop_config={"scratch": scratch},
        scaling_config=TWO,
        run_config=RunConfig(name="upload", storage_path=storage),
    ).fit()
    assert result.checkpoint is not None and result.path is not None
    return {
        "checkpoint": os.path.relpath(result.checkpoint.path, result.path),
        "files": _files(result.checkpoint),
        "metrics": result.metrics,
        "seen": [_lines(os.path.join(scratch, f"seen_{r}.jsonl"))[0] for r in (0, 1)],
    }


def preempted_loop():  # type: ignore[no-untyped-def]
    before = train.get_preemption_info()
    if train.get_context().get_world_rank() == 1:
        # What Slurm's --signal=USR1@SECONDS does to every task of the job, through its agent.
        os.kill(os.getpid(), signal.SIGUSR1)
    train.collective.barrier()
    after = train.get_preemption_info()
    return before, after
