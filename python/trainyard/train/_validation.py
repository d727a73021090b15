"""Validation of reported checkpoints, as Ray Train v2's ``ray.train.v2.api.validation_config``:
``TorchTrainer(validation_config=ValidationConfig(fn))`` and ``report(...,
validation=True|ValidationTaskConfig(...))``.

The validation function runs off the training path, as Ray's: once the checkpoint is
committed, in a Python process of its own on the driver's machine (one at a time, in the
order the checkpoints committed), while training goes on. Its metrics are merged into the
checkpoint's (``Result``, ``get_all_reported_checkpoints``), and ``fit()`` returns once
every validation has ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional

try:
    from typing import Protocol
except ImportError:  # pragma: no cover - Python < 3.8
    Protocol = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:  # pragma: no cover
    from trainyard.train._checkpoint import Checkpoint

__all__ = ["ValidationConfig", "ValidationFn", "ValidationTaskConfig"]


class ValidationFn(Protocol):
    """A function that validates a checkpoint: called as ``fn(checkpoint, **fn_kwargs)``,
    it returns a dictionary of metrics."""

    def __call__(self, checkpoint: "Checkpoint", **kwargs: Any) -> Dict[str, Any]: ...


@dataclass
class ValidationTaskConfig:
    """One validation's settings, given to ``report(..., validation=...)``.

    Args:
        fn_kwargs: JSON-serialisable keyword arguments of the validation function; they
            override ``ValidationConfig.task_config.fn_kwargs`` key by key. The checkpoint
            is always its first argument.
        timeout_s: How long the validation may take, in seconds; ``None`` is no limit. A
            validation past it is stopped (its process killed) and the checkpoint's status is
            ``VALIDATION_TIMEOUT``.
    """

    fn_kwargs: Optional[Dict[str, Any]] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        # Ray 2.60's check, in its words and with its exception type.
        assert self.timeout_s is None or self.timeout_s > 0, (
            f"The `timeout_s` should be None or greater than zero, actual value: {self.timeout_s}"
        )


class ValidationConfig:
    """How a trainer validates checkpoints: ``TorchTrainer(validation_config=...)``.

    Args:
        fn: The validation function: ``fn(checkpoint, **fn_kwargs) -> dict`` of metrics. It
            travels to its process pickled (cloudpickle), as the loop function does.
        task_config: The default ``ValidationTaskConfig`` (its ``fn_kwargs`` are the
            defaults that a report's own override).
        ray_remote_kwargs: Ray's options for its validation task; only ``None`` or ``{}`` is
            accepted (``ValueError`` otherwise): the validation runs in a process on the
            driver's machine, outside the run's placement.
    """

    def __init__(
        self,
        fn: ValidationFn,
        task_config: Optional[ValidationTaskConfig] = None,
        ray_remote_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.fn = fn
        self.task_config = ValidationTaskConfig() if task_config is None else task_config
        if ray_remote_kwargs:
            raise ValueError(
                f"ValidationConfig(ray_remote_kwargs={ray_remote_kwargs!r}) is not supported by "
                "trainyard: the validation function runs in a Python process of its own on the "
                "driver's machine, with no resources reserved for it; give "
                "ray_remote_kwargs=None"
            )
        self.ray_remote_kwargs: Dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"ValidationConfig(fn={self.fn!r}, task_config={self.task_config!r})"


def request_of(validation: Any) -> Any:
    """A report's ``validation`` as JSON: ``False``, ``True`` or ``{"fn_kwargs", "timeout_s"}``.

    Raises ``TypeError`` for another type, or ``fn_kwargs`` that are not JSON.
    """
    import json

    if isinstance(validation, bool):
        return validation
    if not isinstance(validation, ValidationTaskConfig):
        raise TypeError(
            "report(validation=...) takes True, False or a "
            f"trainyard.train.ValidationTaskConfig, got {type(validation).__name__}"
        )
    request = {"fn_kwargs": dict(validation.fn_kwargs or {}), "timeout_s": validation.timeout_s}
    try:
        json.dumps(request, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            "ValidationTaskConfig(fn_kwargs=...) must be JSON-serialisable, got "
            f"{validation.fn_kwargs!r}: {error}"
        ) from error
    return request
