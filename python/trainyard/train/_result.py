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
