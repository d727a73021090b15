"""Callbacks of a run, as Ray Train v2's ``UserCallback``: ``RunConfig(callbacks=[...])``.

``fit()`` calls them in its own process (Ray calls copies of them in its controller actor),
as the run's events come: ``after_report`` once every worker has made a report round (with
the round's checkpoint once it is committed), ``after_exception`` when workers of an attempt
failed. A callback that raises stops the run, and ``fit()`` raises ``ControllerError`` with
the callback's exception, as Ray's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:  # pragma: no cover
    from trainyard.train._checkpoint import Checkpoint
    from trainyard.train._config import RunConfig, ScalingConfig

__all__ = ["TrainRunContext", "UserCallback"]


@dataclass(frozen=True)
class TrainRunContext:
    """The run a callback is called for, as Ray Train v2's ``TrainRunContext``.

    Attributes:
        run_id: A unique id of this ``fit()`` (hex).
        run_config: The ``RunConfig``.
        train_loop_config: What the loop function gets as ``config``.
        scaling_config: The ``ScalingConfig``.
        backend_config: The trainer's ``TorchConfig``.
        dataset_config: Ray Data's configuration: always ``None`` here.
    """

    run_config: "RunConfig"
    train_loop_config: Optional[Dict[str, Any]]
    scaling_config: "ScalingConfig"
    backend_config: Any = None
    dataset_config: Any = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def get_run_config(self) -> "RunConfig":
        """The run's ``RunConfig``."""
        return self.run_config


class UserCallback:
    """Callback interface for what happens during training; subclass it and give instances
    to ``RunConfig(callbacks=[...])``.

    The methods are called in the process that runs ``fit()``, one at a time, in the order
    the run's events come.
    """

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: List[Dict[str, Any]],
        checkpoint: Optional["Checkpoint"],
    ) -> None:
        """Called after all workers have reported metrics (and maybe a checkpoint) with
        ``trainyard.train.report``.

        Args:
            run_context: The ``TrainRunContext`` of the run.
            metrics: The metrics of the round, where ``metrics[i]`` is what worker (world
                rank) ``i`` reported.
            checkpoint: The round's checkpoint, committed to storage, or ``None`` when no
                worker reported one (or it could not be committed).
        """

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: Dict[int, BaseException]
    ) -> None:
        """Called after one or more workers have failed, once per failed attempt.

        Args:
            run_context: The ``TrainRunContext`` of the run.
            worker_exceptions: Each failed worker's world rank and its exception (its own
                exception, rebuilt here; a ``RuntimeError`` with the driver's account when it
                left none, as a worker killed by a signal does).
        """
