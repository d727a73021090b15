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

import contextlib
import enum
import os
import sys
import threading
import warnings
from typing import Any, Dict, Iterator, Mapping, Optional, Union

from trainyard.train._config import (
    V2_MIGRATION_GUIDE_MESSAGE,
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    RunConfig,
    ScalingConfig,
)
from trainyard.train._result import (
    ControllerError,
    Result,
    TrainingFailedError,
    WorkerGroupError,
)

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointUploadMode",
    "ControllerError",
    "FailureConfig",
    "LoggingConfig",
    "ReportError",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "StorageContext",
    "TrainContext",
    "TrainingFailedError",
    "WorkerGroupError",
    "collective",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "report",
]

CHECKPOINT_ENV = "TRAINYARD_CHECKPOINT"
# The run folder: a path, or a URI (``s3://bucket/prefix/name``) on remote storage.
RUN_DIR_ENV = "TRAINYARD_RUN_DIR"
# The checkpoint a TorchTrainer's ``resume_from_checkpoint`` names: what ``get_checkpoint``
# returns while the run has none of its own.
RESUME_FROM_ENV = "TRAINYARD_RESUME_FROM_CHECKPOINT"
STDERR_PREFIX = "trainyard_report: "

_print_lock = threading.Lock()

# The checkpoint this process reported last and had persisted (SYNC) or registered (NO_UPLOAD):
# what ``get_checkpoint`` returns during the run, as Ray's does (one entry at most).
_reported: "list[Checkpoint]" = []


class Checkpoint:
    """A directory of files: handed in with ``report``, or resumed from with
    ``get_checkpoint``.

    ``path`` is the directory's absolute path on this machine, or a URI
    (``s3://bucket/key``) kept as given: a folder in remote storage, for
    ``report(..., checkpoint_upload_mode=NO_UPLOAD)``. ``filesystem`` is
    accepted as Ray's is, when it is pyarrow's ``LocalFileSystem`` or
    ``S3FileSystem`` (a ``bucket/key`` path then becomes ``s3://bucket/key``).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], filesystem: Any = None) -> None:
        path = os.fspath(path)
        kind = None if filesystem is None else type(filesystem).__name__
        if kind == "S3FileSystem" and "://" not in path:
            path = "s3://" + path.lstrip("/")
        elif kind not in (None, "LocalFileSystem", "S3FileSystem"):
            raise TypeError(
                f"Checkpoint(filesystem=...) takes pyarrow's LocalFileSystem or S3FileSystem, "
                f"got {kind}: give the path as a local path or an s3:// URI instead"
            )
        self.path = path if "://" in path else os.path.abspath(path)
        self.filesystem = filesystem

    @classmethod
    def from_directory(cls, path: Union[str, "os.PathLike[str]"]) -> "Checkpoint":
        """The checkpoint made of the files under ``path``.

        Nothing is read yet: ``report`` has the agent copy the files, and fails
        if ``path`` is not a directory then.
        """
        return cls(path)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A context manager yielding a local directory holding the files.

        The checkpoint is local already: this is its own directory; do not
        change what is in it.
        """
        yield self.path

    def to_directory(self, path: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
        """Copies the files into ``path`` (a new temporary directory when
        ``None``) and returns that directory."""
        import shutil
        import tempfile

        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        where = "s3" if self.path.startswith("s3://") else "local"
        return f"Checkpoint(filesystem={where}, path={self.path})"


class CheckpointUploadMode(enum.Enum):
    """How ``report`` hands in a checkpoint.

    ``SYNC``: ``report`` returns once the files are persisted. ``ASYNC``: ``report``
    returns once the agent has taken the directory, and the agent persists it in the
    background (the report reaches the driver, in order with the others, when it is;
    the checkpoint commits when every rank's part is persisted). Taken means renamed
    away (the directory is gone then), or, with
    ``delete_local_checkpoint_after_upload=False``, its files hard-linked: replace a
    file (write a new one and rename it over) rather than write it again in place until
    it is persisted, which is known once two more ``ASYNC`` reports with a checkpoint
    have returned. At
    most two are on their way per rank; the next ``ASYNC`` report with a checkpoint
    waits for room. A rank that dies after ``report`` returned still has its files
    persisted. ``NO_UPLOAD``: the rank wrote the checkpoint into the run folder itself
    (to ``get_context().get_storage().build_checkpoint_path_from_name(name)``, with
    ``torch.distributed.checkpoint``, say): it is registered where it is, nothing is
    copied or deleted, and ``report`` returns once the report has gone on to the
    driver. Every rank that reports a checkpoint for the same step must name the same
    folder; a folder outside the run folder is refused (``ReportError``).
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Whether ``report`` takes the directory away by default: with ``ASYNC`` only."""
        return self == CheckpointUploadMode.ASYNC


def report(
    metrics: Mapping[str, Any],
    checkpoint: Optional[Checkpoint] = None,
    checkpoint_dir_name: Optional[str] = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: Optional[bool] = None,
    checkpoint_upload_fn: Any = None,
    validation: bool = False,
) -> None:
    """Reports ``metrics`` (a JSON-serialisable mapping) to the driver, with
    the files of ``checkpoint`` if one is given.

    With ``checkpoint_upload_mode=SYNC`` (the default) it returns once the agent
    has persisted the checkpoint's files into the run folder and passed the
    report on, so the directory may be deleted then; with ``ASYNC`` once the
    agent has taken the directory; with ``NO_UPLOAD`` once the folder the rank
    wrote into the run folder is registered (see ``CheckpointUploadMode``). Safe
    to call from several threads (reports are sent one at a time).
    ``checkpoint_dir_name`` names the folder of the run folder a ``SYNC`` or
    ``ASYNC`` checkpoint is copied to, as Ray's (one folder name, not one of
    trainyard's own such as ``logs`` or ``checkpoint_000007``); without it the
    folder is named by index (``checkpoint_000003``). Every rank that hands in
    files for the same report must name the same folder (or, ``NO_UPLOAD``,
    write to it). A ``NO_UPLOAD`` checkpoint keeps the folder it was written to.

    Raises ``ReportError`` with the agent's reason when the files cannot be
    persisted (the driver is told, and that checkpoint is never committed),
    ``TypeError`` when ``metrics`` is not a mapping or ``checkpoint`` not a
    ``Checkpoint``, ``ValueError`` when ``metrics`` is not JSON (NaN and
    infinities are not), ``OSError`` when the agent cannot be reached.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping, got {type(metrics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            "checkpoint must be a trainyard.train.Checkpoint "
            f"(Checkpoint.from_directory(path)), got {type(checkpoint).__name__}"
        )
    if checkpoint_upload_fn is not None:
        raise NotImplementedError(
            "checkpoint_upload_fn is not supported: the agent persists checkpoints into the "
            "run folder (RunConfig.storage_path)"
        )
    if validation:
        raise NotImplementedError("report(validation=True) is not supported")
    import json

    from trainyard import _client
    from trainyard.train import _local

    mode = CheckpointUploadMode(checkpoint_upload_mode)
    metrics = dict(metrics)
    local = _local.session()
    if local is not None:
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
    # Checked here, so that the caller sees the ValueError before anything is sent.
    json.dumps(metrics, allow_nan=False)
    path = None if checkpoint is None else checkpoint.path
    if mode is CheckpointUploadMode.ASYNC:
        _client.send(
            metrics, path, "ASYNC", delete_local_checkpoint_after_upload, checkpoint_dir_name
        )
        return
    if mode is CheckpointUploadMode.NO_UPLOAD:
        # Already in storage: never deleted here.
        _client.send(metrics, path, "NO_UPLOAD")
        if checkpoint is not None:
            _reported[:] = [checkpoint]
        return
    index = _client.send(metrics, path, dir_name=checkpoint_dir_name)
    run_dir = os.environ.get(RUN_DIR_ENV)
    if path is not None and run_dir and "://" not in run_dir:
        folder = checkpoint_dir_name or f"checkpoint_{index:06d}"
        _reported[:] = [Checkpoint(os.path.join(run_dir, folder))]
    if path is not None and delete_local_checkpoint_after_upload:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


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


def get_checkpoint() -> Optional[Checkpoint]:
    """The latest checkpoint: the one this worker reported last, once persisted (a ``SYNC``
    report returned; ``NO_UPLOAD``: the folder it registered), as Ray's; before that, the
    one the run resumes from (its latest committed one), or ``None`` on a fresh start.

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
    if _reported:
        return _reported[-1]
    path = os.environ.get(CHECKPOINT_ENV) or os.environ.get(RESUME_FROM_ENV)
    return Checkpoint(path) if path else None


def _env_int(names: "tuple[str, ...]", default: int) -> int:
    """The first of ``names`` set (and not empty) in the environment, as an int."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip() != "":
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None
    return default


# The names at the top of a run folder that are trainyard's own.
_OWN_NAMES = ("run.json", "metrics.jsonl", "lease.json", "logs", ".uploads")


class StorageContext:
    """Where this run keeps what it persists: its run folder
    (``TRAINYARD_RUN_DIR``, a path or an ``s3://`` URI)."""

    @property
    def experiment_fs_path(self) -> str:
        """The run folder.

        Raises ``RuntimeError`` outside a run that has one.
        """
        run_dir = os.environ.get(RUN_DIR_ENV)
        if not run_dir:
            raise RuntimeError(
                f"this process has no run folder ({RUN_DIR_ENV} is not set): it is not a "
                "trainyard worker"
            )
        return run_dir

    def build_checkpoint_path_from_name(self, name: str) -> str:
        """The folder ``name`` inside the run folder (``name`` may nest:
        ``"dcp/step_3"``): where to write a checkpoint that ``report`` then
        registers with ``checkpoint_upload_mode=NO_UPLOAD``.

        Raises ``ValueError`` for a name that leaves the run folder or is one
        of trainyard's own there (``logs``, ``run.json``, ``metrics.jsonl``,
        ``lease.json``, ``checkpoint_<digits>``), and ``RuntimeError`` outside a
        run that has one.
        """
        parts = [p for p in str(name).split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise ValueError(
                f"a checkpoint name must be a folder inside the run folder, got {name!r}"
            )
        top = parts[0]
        if top in _OWN_NAMES or (
            top.startswith("checkpoint_") and top[len("checkpoint_") :].isdigit()
        ):
            raise ValueError(
                f"a checkpoint name must not be {top!r}: trainyard keeps its own files "
                "there; name the folder otherwise (e.g. 'dcp/step_3')"
            )
        return "/".join([self.experiment_fs_path.rstrip("/")] + parts)

    def __repr__(self) -> str:
        return f"StorageContext(experiment_fs_path={os.environ.get(RUN_DIR_ENV)!r})"


# Ray 2.60's messages for the context's deprecated methods (``ray.train.context``).
_GET_METADATA_DEPRECATION_MESSAGE = (
    "`get_metadata` was an experimental API that accessed the metadata passed "
    "to `<Framework>Trainer(metadata=...)`. This API can be replaced by passing "
    "the metadata directly to the training function (e.g., via `train_loop_config`). "
    f"{V2_MIGRATION_GUIDE_MESSAGE}"
)
_TUNE_SPECIFIC_CONTEXT_DEPRECATION_MESSAGE = (
    "`{}` is deprecated because the concept of a `Trial` will "
    "soon be removed in Ray Train."
    "Ray Train will no longer assume that it's running within a Ray Tune `Trial` "
    "in the future. "
    f"{V2_MIGRATION_GUIDE_MESSAGE}"
)


class TrainContext:
    """Where this worker stands in the run, read from its environment: the
    variables trainyard sets, else torchrun's.

    ``get_metadata``, ``get_trial_name``, ``get_trial_id``, ``get_trial_resources`` and
    ``get_trial_dir`` raise ``DeprecationWarning`` with Ray 2.60's messages, as Ray's do.
    """

    def get_metadata(self) -> Dict[str, Any]:
        """[Deprecated] Raises ``DeprecationWarning``: pass metadata in ``train_loop_config``."""
        raise DeprecationWarning(_GET_METADATA_DEPRECATION_MESSAGE)

    def get_trial_name(self) -> str:
        """[Deprecated] Raises ``DeprecationWarning``."""
        raise DeprecationWarning(
            _TUNE_SPECIFIC_CONTEXT_DEPRECATION_MESSAGE.format("get_trial_name")
        )

    def get_trial_id(self) -> str:
        """[Deprecated] Raises ``DeprecationWarning``."""
        raise DeprecationWarning(_TUNE_SPECIFIC_CONTEXT_DEPRECATION_MESSAGE.format("get_trial_id"))

    def get_trial_resources(self) -> Any:
        """[Deprecated] Raises ``DeprecationWarning``."""
        raise DeprecationWarning(
            _TUNE_SPECIFIC_CONTEXT_DEPRECATION_MESSAGE.format("get_trial_resources")
        )

    def get_trial_dir(self) -> str:
        """[Deprecated] Raises ``DeprecationWarning``: pass the folder in ``train_loop_config``."""
        raise DeprecationWarning(_TUNE_SPECIFIC_CONTEXT_DEPRECATION_MESSAGE.format("get_trial_dir"))

    def get_storage(self) -> StorageContext:
        """Where the run keeps what it persists (its run folder)."""
        return StorageContext()

    def get_world_rank(self) -> int:
        """This worker's rank in the run: ``TRAINYARD_WORLD_RANK``, else ``RANK``, else 0."""
        return _env_int(("TRAINYARD_WORLD_RANK", "RANK"), 0)

    def get_local_rank(self) -> int:
        """Its rank on its node: ``TRAINYARD_LOCAL_RANK``, else ``LOCAL_RANK``, else 0."""
        return _env_int(("TRAINYARD_LOCAL_RANK", "LOCAL_RANK"), 0)

    def get_world_size(self) -> int:
        """How many workers the run has: ``TRAINYARD_WORLD_SIZE``, else ``WORLD_SIZE``, else 1."""
        return _env_int(("TRAINYARD_WORLD_SIZE", "WORLD_SIZE"), 1)

    def get_local_world_size(self) -> int:
        """How many workers its node has: ``TRAINYARD_LOCAL_WORLD_SIZE``, else
        ``LOCAL_WORLD_SIZE``, else 1."""
        return _env_int(("TRAINYARD_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"), 1)

    def get_node_rank(self) -> int:
        """Its node's rank: ``TRAINYARD_NODE_RANK``, else ``GROUP_RANK``, else 0."""
        return _env_int(("TRAINYARD_NODE_RANK", "GROUP_RANK"), 0)

    def get_experiment_name(self) -> Optional[str]:
        """The run's name (``TRAINYARD_RUN_NAME``), or ``None`` outside a named run."""
        return os.environ.get("TRAINYARD_RUN_NAME") or None

    def __repr__(self) -> str:
        return (
            f"TrainContext(world_rank={self.get_world_rank()}, "
            f"world_size={self.get_world_size()}, local_rank={self.get_local_rank()}, "
            f"node_rank={self.get_node_rank()})"
        )


class LocalTrainContext(TrainContext):
    """The context of a training function in local mode (``ScalingConfig(num_workers=0)``):
    rank 0 of 1, or the ranks of the torchrun environment the process was started in."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def get_world_rank(self) -> int:
        return int(self._session.world_rank)

    def get_local_rank(self) -> int:
        return int(self._session.local_rank)

    def get_world_size(self) -> int:
        return int(self._session.world_size)

    def get_local_world_size(self) -> int:
        return int(self._session.local_world_size)

    def get_node_rank(self) -> int:
        return int(self._session.node_rank)

    def get_experiment_name(self) -> Optional[str]:
        return str(self._session.experiment_name)


def get_context() -> TrainContext:
    """This worker's ``TrainContext`` (in local mode, a ``LocalTrainContext``)."""
    from trainyard.train import _local

    local = _local.session()
    return LocalTrainContext(local) if local is not None else TrainContext()


def __getattr__(name: str) -> Any:
    # The report connection (sockets) is loaded with the first report: importing this
    # module stays light for a driver.
    if name == "ReportError":
        from trainyard._client import ReportError

        return ReportError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Last: ``collective`` reads this module's names.
from trainyard.train import collective  # noqa: E402
