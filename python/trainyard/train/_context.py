"""Where a worker stands in its run: ``TrainContext`` (``get_context``) and ``StorageContext``,
as Ray Train v2's, read from the variables trainyard sets (else torchrun's)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from trainyard.train._config import V2_MIGRATION_GUIDE_MESSAGE

__all__ = ["LocalTrainContext", "StorageContext", "TrainContext", "get_context"]

# The run folder: a path, or a URI (``s3://bucket/prefix/name``) on remote storage.
RUN_DIR_ENV = "TRAINYARD_RUN_DIR"


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
