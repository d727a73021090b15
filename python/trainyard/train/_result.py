"""What ``fit()`` returns and raises, named and shaped as Ray Train v2's."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from trainyard.train._checkpoint import Checkpoint
    from trainyard.train._preemption import PreemptionInfo

__all__ = [
    "ControllerError",
    "PreemptionError",
    "Result",
    "TrainingFailedError",
    "WorkerGroupError",
]


class TrainingFailedError(RuntimeError):
    """The run failed beyond its ``FailureConfig.max_failures``."""


class WorkerGroupError(TrainingFailedError):
    """Ranks of the final attempt failed.

    ``worker_failures`` maps each failed rank to its exception: the rank's own exception
    (its type, message and ``__cause__``) when it could be sent back and unpickled here,
    else a ``RuntimeError`` with its text; ``traceback_str`` on each holds the rank's
    traceback text.
    """

    def __init__(self, error_message: str, worker_failures: Dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors:\n" + error_message)
        self._message = error_message
        self.worker_failures = worker_failures

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (self.__class__, (self._message, self.worker_failures))


class ControllerError(TrainingFailedError):
    """The run failed for a reason of its own rather than a rank's: its placement could
    not be had, its storage failed, a checkpoint could not be committed.

    ``controller_failure`` holds the cause.
    """

    def __init__(self, controller_failure: BaseException) -> None:
        super().__init__("Training failed due to controller error:\n" + str(controller_failure))
        self.controller_failure = controller_failure

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (self.__class__, (self.controller_failure,))


class PreemptionError(TrainingFailedError):
    """Training was interrupted by a pre-emption of its nodes, as Ray Train v2's.

    trainyard restarts a pre-empted run without limit (``FailureConfig(
    max_preemption_failures=-1)``, the only value it takes) and without counting it against
    ``max_failures``, so ``fit()`` never raises this; it is here for code that catches it.

    Attributes:
        preemption_info: Which nodes and ranks were pre-empted.
        drain_timed_out: Whether the workers were stopped at the deadline.
    """

    def __init__(self, preemption_info: "PreemptionInfo", drain_timed_out: bool = False) -> None:
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        super().__init__(
            "Training was interrupted by node preemption "
            f"(preempted_ranks={preemption_info.preempted_ranks}, "
            f"drain_timed_out={drain_timed_out})."
        )

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (self.__class__, (self.preemption_info, self.drain_timed_out))


def _lookup(metrics: Dict[str, Any], key: str) -> Any:
    """``metrics[key]``, where ``key`` may name a nested value as ``"a/b"`` (Ray's
    ``unflattened_lookup``); ``None`` when it is not there."""
    if key in metrics:
        return metrics[key]
    value: Any = metrics
    for part in key.split("/"):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def sorted_by_score(
    entries: List[Any],
    metrics_of: Callable[[Any], Dict[str, Any]],
    attribute: Optional[str],
    order: str,
) -> List[Any]:
    """``entries`` (oldest first) in the order Ray keeps its checkpoints: by ``attribute``'s
    score, worst first, ties oldest first; as they are without an attribute. A missing or
    non-numeric value scores ``-inf`` before the order's sign, as Ray's; NaN below all."""
    if not attribute:
        return list(entries)
    import math

    sign = 1.0 if order == "max" else -1.0

    def score(entry: Any) -> Tuple[bool, float]:
        value = _lookup(metrics_of(entry), attribute)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            value = float("-inf")
        signed = sign * float(value)
        return (not math.isnan(signed), signed)

    ranked = sorted(enumerate(entries), key=lambda pair: (score(pair[1]), pair[0]))
    return [entry for _, entry in ranked]


@dataclass(repr=False)
class Result:
    """The outcome of a run, as Ray Train v2's ``Result``.

    Attributes:
        metrics: Rank 0's metrics of the latest report that carried a checkpoint (``None``
            when no report did). In local mode (``ScalingConfig(num_workers=0)``): the
            latest report's, with or without a checkpoint.
        checkpoint: The latest committed checkpoint, or ``None``.
        error: The error the run failed with, or ``None``.
        path: The run's folder (``None`` in local mode).
        best_checkpoints: The checkpoints ``CheckpointConfig`` keeps, as
            ``(Checkpoint, metrics)``, ordered worst to best as Ray's: by
            ``checkpoint_score_attribute`` when there is one, else oldest first; at most
            ``num_to_keep`` of them (the latest checkpoint is kept on disk besides, and may
            be left out here, as in Ray). ``None`` in local mode.
        return_value: What the loop function of rank 0 returned.
    """

    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional["Checkpoint"]
    error: Optional[BaseException]
    path: Optional[str]
    best_checkpoints: Optional[List[Tuple["Checkpoint", Dict[str, Any]]]] = field(
        default_factory=list
    )
    return_value: Any = None

    def __repr__(self) -> str:
        shown: Dict[str, Any] = {}
        if self.error:
            shown["error"] = type(self.error).__name__
        shown["metrics"] = self.metrics
        shown["path"] = self.path
        shown["filesystem"] = "s3" if (self.path or "").startswith("s3://") else "local"
        shown["checkpoint"] = self.checkpoint
        fields = ",\n".join(f"  {key}={value!r}" for key, value in shown.items())
        return f"Result(\n{fields}\n)"

    @property
    def metrics_dataframe(self) -> Optional["pandas.DataFrame"]:
        """The metrics of ``best_checkpoints``, one row per checkpoint in the same order, as
        a pandas ``DataFrame`` (Ray v2's: ``None`` when there is no checkpoint; pandas must
        be installed). ``metrics_history`` has every report."""
        if not self.best_checkpoints:
            return None
        import pandas

        return pandas.DataFrame([metrics for _, metrics in self.best_checkpoints])

    @property
    def metrics_history(self) -> "pandas.DataFrame":
        """Every report rank 0 made, with or without a checkpoint, in every attempt (resumed
        runs included), in order, as a pandas ``DataFrame``: the metrics, with ``time``
        (seconds since the epoch), ``attempt`` and ``world_size`` beside them (pandas must be
        installed). Read from the run folder's ``metrics.jsonl``, local or remote, through
        ``trainyard show``; ``metrics_dataframe`` keeps Ray's meaning (the metrics of the
        kept checkpoints only). Empty in local mode, which has no run folder."""
        import pandas

        rows = []
        for entry in _shown(self.path).get("metrics") or []:
            if entry.get("rank") == 0:
                row = {k: entry[k] for k in ("time", "attempt", "world_size")}
                row.update(entry.get("metrics") or {})
                rows.append(row)
        return pandas.DataFrame(rows)

    @property
    def filesystem(self) -> Any:
        """pyarrow's file system for ``path``: ``S3FileSystem`` for an ``s3://`` run folder,
        else ``LocalFileSystem`` (pyarrow must be installed)."""
        import pyarrow.fs

        if self.path and self.path.startswith("s3://"):
            return pyarrow.fs.S3FileSystem()
        return pyarrow.fs.LocalFileSystem()

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional["Checkpoint"]:
        """The checkpoint of ``best_checkpoints`` whose ``metric`` is highest (``mode="max"``)
        or lowest (``"min"``); checkpoints without it are left out.

        Raises ``RuntimeError`` when there is no checkpoint or none has ``metric`` (naming
        the metrics there are), ``ValueError`` for another ``mode``.
        """
        if not self.best_checkpoints:
            raise RuntimeError("No checkpoint exists in the trial directory!")
        if mode not in ("max", "min"):
            raise ValueError(f'Unsupported mode: {mode}. Please choose from ["min", "max"]!')
        valid = [c for c in self.best_checkpoints if _lookup(c[1], metric) is not None]
        if not valid:
            keys = list((self.metrics or {}).keys())
            raise RuntimeError(
                f"Invalid metric name {metric}! You may choose from the following metrics: {keys}."
            )
        choose = max if mode == "max" else min
        return choose(valid, key=lambda c: _lookup(c[1], metric))[0]

    @classmethod
    def from_path(
        cls, path: Union[str, "os.PathLike[str]"], storage_filesystem: Any = None
    ) -> "Result":
        """The ``Result`` of the run whose folder is ``path`` (a local path or an ``s3://``
        URI), read from its ``run.json``: ``checkpoint`` and ``metrics`` of its latest
        committed checkpoint, ``best_checkpoints`` every checkpoint it keeps, worst to best as
        the run ranked them (by its ``checkpoint_score_attribute``, else oldest first), as
        Ray reads them with a default ``CheckpointConfig``; ``error`` is not read back.

        Raises ``RuntimeError`` when the folder does not exist or holds no ``run.json``.
        """
        from trainyard.train._checkpoint import Checkpoint

        if storage_filesystem is not None and type(storage_filesystem).__name__ != (
            "LocalFileSystem"
        ):
            raise ValueError(
                f"Result.from_path(storage_filesystem={type(storage_filesystem).__name__}) is "
                "not supported: give the path as a local path or an s3://bucket/key URI"
            )
        text = os.fspath(path).rstrip("/")
        if "://" not in text:
            text = os.path.abspath(text)
            if not os.path.isdir(text):
                raise RuntimeError(f"Experiment folder {text} doesn't exist.")
            if not os.path.isfile(os.path.join(text, "run.json")):
                raise RuntimeError(
                    "Failed to restore the Result object: run.json doesn't exist in the "
                    "experiment folder. Make sure that this is an output directory created "
                    "by a trainyard run."
                )
        shown = _shown(text)
        record = shown.get("record") or {}
        # The driver ranks them best first.
        rank = {index: at for at, index in enumerate(shown.get("best") or [])}
        kept = sorted(
            record.get("checkpoints") or [],
            key=lambda c: (-rank.get(c.get("index"), -1), c.get("index", 0)),
        )
        best = [(Checkpoint(f"{text}/{c['dir']}"), dict(c.get("metrics") or {})) for c in kept]
        latest = next(
            (
                pair
                for pair, c in zip(best, kept)
                if c.get("index") == record.get("latest_checkpoint")
            ),
            None,
        )
        return cls(
            metrics=dict(latest[1]) if latest else None,
            checkpoint=latest[0] if latest else None,
            error=None,
            path=text,
            best_checkpoints=best,
        )


def _shown(path: Optional[str]) -> Dict[str, Any]:
    """What ``trainyard show --format json`` says of the run folder ``path`` (any storage it
    reads): its ``record`` and its metrics history (``metrics``, every report of every
    rank); empty without a path."""
    import json
    import subprocess

    from trainyard._find_trainyard import find_trainyard_bin

    if not path or "/" not in path.rstrip("/"):
        return {}
    storage, name = path.rstrip("/").rsplit("/", 1)
    shown = subprocess.run(
        [find_trainyard_bin(), "show", name, "--storage", storage or "/", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if shown.returncode != 0:
        raise RuntimeError(f"cannot read the run at {path}: {shown.stderr.strip()}")
    return dict(json.loads(shown.stdout))
