"""What ``fit()`` returns and raises, named and shaped as Ray Train v2's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from trainyard.train import Checkpoint

__all__ = ["ControllerError", "Result", "TrainingFailedError", "WorkerGroupError"]


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


@dataclass
class Result:
    """The outcome of a run.

    Attributes:
        metrics: Rank 0's metrics of the latest report that carried a checkpoint (``None``
            when no report did).
        checkpoint: The latest committed checkpoint, or ``None``.
        error: The error the run failed with, or ``None``.
        path: The run's folder.
        best_checkpoints: The kept checkpoints and rank 0's metrics of each, as
            ``(Checkpoint, metrics)``, oldest first.
        return_value: What the loop function of rank 0 returned.
    """

    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional["Checkpoint"]
    error: Optional[BaseException]
    path: Optional[str]
    best_checkpoints: List[Tuple["Checkpoint", Dict[str, Any]]] = field(default_factory=list)
    return_value: Any = None
    _metrics_history: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def metrics_dataframe(self) -> "pandas.DataFrame":
        """Rank 0's metrics of every committed checkpoint, in order, as a pandas
        ``DataFrame`` (pandas must be installed)."""
        import pandas

        return pandas.DataFrame(self._metrics_history)

    @property
    def metrics_history(self) -> "pandas.DataFrame":
        """Every report rank 0 made, with or without a checkpoint, in every attempt (resumed
        runs included), in order, as a pandas ``DataFrame``: the metrics, with ``time``
        (seconds since the epoch), ``attempt`` and ``world_size`` beside them (pandas must be
        installed). Read from the run folder's ``metrics.jsonl``, local or remote, through
        ``trainyard show``; ``metrics_dataframe`` keeps Ray's meaning (the metrics of
        checkpoints only)."""
        import pandas

        rows = []
        for entry in _metrics_history(self.path):
            if entry.get("rank") == 0:
                row = {k: entry[k] for k in ("time", "attempt", "world_size")}
                row.update(entry.get("metrics") or {})
                rows.append(row)
        return pandas.DataFrame(rows)


def _metrics_history(path: Optional[str]) -> List[Dict[str, Any]]:
    """Every report in the run folder ``path``'s metrics history, as ``trainyard show``
    reads it (any storage it reads)."""
    import json
    import subprocess

    from trainyard._find_trainyard import find_trainyard_bin

    if not path or "/" not in path.rstrip("/"):
        return []
    storage, name = path.rstrip("/").rsplit("/", 1)
    shown = subprocess.run(
        [find_trainyard_bin(), "show", name, "--storage", storage or "/", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if shown.returncode != 0:
        raise RuntimeError(f"cannot read the metrics history of {path}: {shown.stderr.strip()}")
    return list(json.loads(shown.stdout).get("metrics") or [])
