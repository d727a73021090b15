"""Ray Train v2's API (``ray.train``) on trainyard: a Ray Train program runs with
``ray.train`` replaced by ``trainyard.train``.

The driver side: ``ScalingConfig``, ``RunConfig``, ``CheckpointConfig``,
``FailureConfig``, ``Result`` and the errors ``fit()`` raises
(``TrainingFailedError``, ``WorkerGroupError``, ``ControllerError``); the trainer
itself is ``trainyard.train.torch.TorchTrainer``. This module imports no torch.

The worker side: report metrics and checkpoints, resume from the last
checkpoint, and learn where this worker stands in the run::

    import tempfile
    from trainyard import train

    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = load_state(d) + 1

    for epoch in range(start, epochs):
        loss = train_one_epoch()
        with tempfile.TemporaryDirectory() as d:
            save_state(d, f"shard_{ctx.get_world_rank()}")
            train.report({"epoch": epoch, "loss": loss},
                         checkpoint=train.Checkpoint.from_directory(d))

The N-th ``report`` of every rank belongs to checkpoint ``base + N`` (``base``
is the checkpoint the run resumed from, 0 on a fresh start), with or without a
checkpoint; a checkpoint is committed once every rank has reported its index
and every rank's files are persisted. Each rank should write files of its own
names (a shard each).

A program that ``trainyard run`` starts can use this worker side on its own, as
can the loop function of a ``TorchTrainer``.

Outside trainyard (no ``TRAINYARD_REPORT_ADDR``, e.g. under plain torchrun)
``report`` prints ``trainyard_report: {...}`` to stderr instead, and a
checkpoint handed to it is ignored with a warning.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Mapping, Optional, Union

from trainyard.train._callback import UserCallback
from trainyard.train._checkpoint import Checkpoint
from trainyard.train._config import (
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
)
from trainyard.train._context import (
    RUN_DIR_ENV,
    LocalTrainContext,
    StorageContext,
    TrainContext,
    get_context,
)
from trainyard.train._preemption import PreemptionInfo, get_preemption_info
from trainyard.train._report_config import CheckpointConsistencyMode, CheckpointUploadMode
from trainyard.train._reported import (
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    get_all_reported_checkpoints,
)
from trainyard.train._result import (
    ControllerError,
    PreemptionError,
    Result,
    TrainingFailedError,
    WorkerGroupError,
)
from trainyard.train._validation import ValidationConfig, ValidationFn, ValidationTaskConfig

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ControllerError",
    "FailureConfig",
    "LocalTrainContext",
    "LoggingConfig",
    "PreemptionError",
    "PreemptionInfo",
    "ReportError",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageContext",
    "TrainContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "collective",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]

CHECKPOINT_ENV = "TRAINYARD_CHECKPOINT"
# The checkpoint a TorchTrainer's ``resume_from_checkpoint`` names: what ``get_checkpoint``
# returns while the run has none of its own.
RESUME_FROM_ENV = "TRAINYARD_RESUME_FROM_CHECKPOINT"
STDERR_PREFIX = "trainyard_report: "

_print_lock = threading.Lock()

# The checkpoint this process reported last and had persisted (SYNC) or registered (NO_UPLOAD):
# what ``get_checkpoint`` returns during the run, as Ray's does (one entry at most).
_last_reported: "list[Checkpoint]" = []
# Whether that checkpoint was persisted by a SYNC report: its folder is there once the driver
# has committed it.
_awaits_commit: "list[bool]" = []


def _forget_attempt() -> None:
    """Forgets what this process kept of a stopped attempt (its reported checkpoint, its
    process group's helpers, a pre-emption warning): a rank restarted in place starts the
    next attempt as a new process would."""
    from trainyard.train import _preemption, collective

    _last_reported.clear()
    _awaits_commit.clear()
    collective._cpu_group = None
    with _preemption._lock:
        _preemption._warned.clear()


# How long ``get_checkpoint`` waits for the driver to commit the checkpoint a SYNC report
# persisted: a rank's files are staged in its attempt's own folder until every rank has
# reported that checkpoint and the driver moves them into its folder (the fence that keeps
# a replaced attempt's ranks out of the checkpoint folders).
COMMIT_WAIT_S = 60.0


def report(
    metrics: Mapping[str, Any],
    checkpoint: Optional[Checkpoint] = None,
    checkpoint_dir_name: Optional[str] = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: Optional[bool] = None,
    checkpoint_upload_fn: Optional[Callable[[Checkpoint, str], Checkpoint]] = None,
    validation: Union[bool, ValidationTaskConfig] = False,
) -> None:
    """Reports ``metrics`` (a JSON-serialisable mapping) to the driver, with
    the files of ``checkpoint`` if one is given.

    With ``checkpoint_upload_mode=SYNC`` (the default) it returns once the agent
    has persisted the checkpoint's files into the run folder and passed the
    report on, so the directory may be deleted then; with ``ASYNC`` once the
    report is on its way to the agent, which takes the directory when it reads
    it (what the hand-in fails with is raised by the next ``report``, by
    ``get_all_reported_checkpoints``, or at the loop function's end); with
    ``NO_UPLOAD`` once the folder the rank wrote into the run folder is registered
    (see ``CheckpointUploadMode``). Safe to call from several threads (reports are
    sent one at a time, in order).
    ``checkpoint_dir_name`` names the folder of the run folder a ``SYNC`` or
    ``ASYNC`` checkpoint is copied to, as Ray's (one folder name, not one of
    trainyard's own such as ``logs`` or ``checkpoint_000007``); without it the
    folder is named by index (``checkpoint_000003``). Every rank that hands in
    files for the same report must name the same folder (or, ``NO_UPLOAD``,
    write to it). A ``NO_UPLOAD`` checkpoint keeps the folder it was written to.

    ``checkpoint_upload_fn(checkpoint, checkpoint_dir_name)``, as Ray's, persists the
    checkpoint itself, into the run folder (``get_context().get_storage()
    .build_checkpoint_path_from_name(checkpoint_dir_name)``), and returns it as a
    ``Checkpoint`` there; the folder is then registered where it is, as with ``NO_UPLOAD``
    (every rank that calls it must return the same folder). Its ``checkpoint_dir_name`` is
    the one given, else ``checkpoint_upload_<index>`` (the same on every rank).

    ``validation=True`` (or a ``ValidationTaskConfig``) has the trainer's
    ``ValidationConfig.fn`` validate the checkpoint once it is committed, off the training
    path (see ``ValidationConfig``).

    Raises ``ReportError`` with the agent's reason when the files cannot be
    persisted (the driver is told, and that checkpoint is never committed), or
    when an earlier ``ASYNC`` report's could not (this report is then not made),
    ``TypeError`` when ``metrics`` is not a mapping or ``checkpoint`` not a
    ``Checkpoint``, ``ValueError`` when ``metrics`` is not JSON (NaN and
    infinities are not), when ``validation`` comes without a checkpoint or without
    the trainer's ``validation_config``, or when ``checkpoint_upload_fn`` returns no
    ``Checkpoint`` in the run folder; ``OSError`` when the agent cannot be reached.
    """
    if validation and not checkpoint:
        raise ValueError("Validation requires a checkpoint to be provided.")
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping, got {type(metrics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            "checkpoint must be a trainyard.train.Checkpoint "
            f"(Checkpoint.from_directory(path)), got {type(checkpoint).__name__}"
        )
    if checkpoint_upload_fn is not None and not callable(checkpoint_upload_fn):
        raise TypeError(
            "checkpoint_upload_fn must be a function (checkpoint, checkpoint_dir_name) -> "
            f"Checkpoint, got {type(checkpoint_upload_fn).__name__}"
        )
    import json

    from trainyard import _client, _fit
    from trainyard.train import _local
    from trainyard.train._reported import reports
    from trainyard.train._validation import request_of

    request = request_of(validation)
    mode = CheckpointUploadMode(checkpoint_upload_mode)
    metrics = dict(metrics)
    local = _local.session()
    if local is not None:
        # Ray's local mode keeps the report and asks for no upload or validation.
        local.report(metrics, checkpoint)
        return
    if _client.address() is None:
        line = json.dumps(metrics, separators=(",", ":"))
        if checkpoint is not None:
            warnings.warn(
                f"not running under trainyard ({_client.ADDR_ENV} is not set): "
                f"the checkpoint at {checkpoint.path} is not persisted",
                RuntimeWarning,
                stacklevel=2,
            )
        with _print_lock:
            # one write() per line, even when stderr is unbuffered
            print(STDERR_PREFIX + line + "\n", end="", file=sys.stderr, flush=True)
        return
    fit_dir = _fit.fit_dir()
    if request and not (fit_dir is not None and _fit.read_spec(fit_dir).get("validation")):
        raise ValueError(
            "`validation_config` was not set on the trainer, but a validation was requested."
        )
    # Checked here, so that the caller sees the ValueError before anything is sent.
    json.dumps(metrics, allow_nan=False)
    index = reports.next_index()
    if checkpoint is not None and checkpoint_upload_fn is not None:
        checkpoint = _uploaded(
            checkpoint,
            checkpoint_dir_name or f"checkpoint_upload_{index:06d}",
            checkpoint_upload_fn,
            delete_local_checkpoint_after_upload,
        )
        mode = CheckpointUploadMode.NO_UPLOAD
    if request and checkpoint is not None and fit_dir is not None:
        # What to validate, for the driver (the report event says a checkpoint came).
        rank = get_context().get_world_rank()
        _fit.write_atomically(
            _fit.note_file(fit_dir, index, rank), json.dumps({"validation": request}).encode()
        )
    path = None if checkpoint is None else checkpoint.path
    if mode is CheckpointUploadMode.ASYNC:
        _client.send_later(
            metrics,
            path,
            delete_local_checkpoint_after_upload,
            checkpoint_dir_name,
            reports.took,
        )
        # The agent counts a task's reports in the order they are sent: this one is `index`
        # (its answer says so again).
        reports.took(index)
        return
    if mode is CheckpointUploadMode.NO_UPLOAD:
        # Already in storage: never deleted here.
        reports.took(_client.send(metrics, path, "NO_UPLOAD"))
        if checkpoint is not None:
            _last_reported[:] = [checkpoint]
            _awaits_commit[:] = [False]
        return
    index = _client.send(metrics, path, dir_name=checkpoint_dir_name)
    reports.took(index)
    run_dir = os.environ.get(RUN_DIR_ENV)
    if path is not None and run_dir and "://" not in run_dir:
        folder = checkpoint_dir_name or f"checkpoint_{index:06d}"
        _last_reported[:] = [Checkpoint(os.path.join(run_dir, folder))]
        _awaits_commit[:] = [True]
    if path is not None and delete_local_checkpoint_after_upload:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def _uploaded(
    checkpoint: Checkpoint,
    name: str,
    upload: Callable[[Checkpoint, str], Checkpoint],
    delete_local: Optional[bool],
) -> Checkpoint:
    """What ``upload`` made of ``checkpoint``: a ``Checkpoint`` in the run folder."""
    persisted = upload(checkpoint, name)
    if not isinstance(persisted, Checkpoint):
        raise ValueError(
            "checkpoint_upload_fn must return a `trainyard.train.Checkpoint`. Actual type is "
            f"{type(persisted)}"
        )
    run_dir = get_context().get_storage().experiment_fs_path.rstrip("/")
    inside = persisted.path.rstrip("/")
    if "://" not in run_dir:
        inside = os.path.realpath(inside)
        run_dir = os.path.realpath(run_dir)
    if not inside.startswith(run_dir + "/"):
        raise ValueError(
            "Your `checkpoint_upload_fn` returned a checkpoint outside the run folder. Update "
            "it to write to a path inside it: "
            "`trainyard.train.get_context().get_storage().build_checkpoint_path_from_name(name)`"
            f" (run folder: {run_dir}, checkpoint: {persisted.path})"
        )
    if delete_local and checkpoint.path != persisted.path and "://" not in checkpoint.path:
        import shutil

        shutil.rmtree(checkpoint.path, ignore_errors=True)
    return persisted


def get_dataset_shard(dataset_name: Optional[str] = None) -> Any:
    """Not available: there is no Ray Data here.

    Raises ``RuntimeError`` saying what to use instead: a ``torch.utils.data.DataLoader``
    passed through ``trainyard.train.torch.prepare_data_loader``, which gives each rank
    its shard.
    """
    raise RuntimeError(
        f"get_dataset_shard({dataset_name!r}) needs Ray Data, which trainyard does not have: "
        "build a torch.utils.data.DataLoader in the loop function and pass it through "
        "trainyard.train.torch.prepare_data_loader(loader), which gives each rank its shard"
    )


def _committed(checkpoint: Checkpoint) -> bool:
    """Whether the folder of ``checkpoint``, which a ``SYNC`` report persisted, is there:
    its files reach it when the driver commits it, once every rank has reported it (as
    Ray's report waits for every rank). Waits at most ``COMMIT_WAIT_S`` for it (a
    checkpoint never committed has no folder)."""
    deadline = time.monotonic() + COMMIT_WAIT_S
    while not os.path.isdir(checkpoint.path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def get_checkpoint() -> Optional[Checkpoint]:
    """The latest checkpoint: the one this worker reported last, once persisted (a ``SYNC``
    report returned; ``NO_UPLOAD``: the folder it registered), as Ray's; before that, the
    one the run resumes from (its latest committed one), or ``None`` on a fresh start.
    A ``SYNC`` checkpoint's folder holds its files once the driver has committed it, when
    every rank has reported it: this waits for that (at most ``COMMIT_WAIT_S`` seconds).

    The checkpoint resumed from is read from ``TRAINYARD_CHECKPOINT``, a local directory
    that the agent has downloaded already when the run's storage is remote; before the run
    has a checkpoint of its own, a ``TorchTrainer``'s ``resume_from_checkpoint``. A
    checkpoint reported to remote storage (``s3://``) is not returned until the run
    resumes from it.
    """
    from trainyard.train import _local

    local = _local.session()
    if local is not None:
        return local.checkpoint  # type: ignore[no-any-return]
    if _last_reported:
        if _awaits_commit and _awaits_commit[-1]:
            _awaits_commit[:] = [not _committed(_last_reported[-1])]
        return _last_reported[-1]
    path = os.environ.get(CHECKPOINT_ENV) or os.environ.get(RESUME_FROM_ENV)
    return Checkpoint(path) if path else None



def __getattr__(name: str) -> Any:
    # The report connection (sockets) is loaded with the first report: importing this
    # module stays light for a driver.
    if name == "ReportError":
        from trainyard._client import ReportError

        return ReportError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Last: ``collective`` reads this module's names.
from trainyard.train import collective  # noqa: E402
