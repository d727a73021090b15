"""The driver's configuration, named and shaped as Ray Train v2's (``ray.train``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "ScalingConfig"]

_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def _resources_json(resources: Dict[str, Any]) -> str:
    """A resource dictionary as the CLI's ``--resources-per-worker`` JSON (byte sizes may be
    numbers of bytes or text such as ``"10GB"``)."""
    import json

    if not isinstance(resources, dict):
        raise TypeError(f"resources must be a dict, got {type(resources).__name__}")
    for name, amount in resources.items():
        if not isinstance(name, str):
            raise TypeError(f"resource names must be strings, got {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, (int, float, str)):
            raise TypeError(f"resource {name!r} must be a number or a size, got {amount!r}")
    return json.dumps(resources, separators=(",", ":"))


@dataclass
class ScalingConfig:
    """How many workers, and what each one gets.

    Args:
        num_workers: The number of workers, or ``(min, max)`` for an elastic run that starts
            once ``min`` fit and grows up to ``max``.
        use_gpu: Give each worker a GPU.
        resources_per_worker: Each worker's resources, e.g.
            ``{"CPU": 1, "memory": 10 * 2**30}``. ``"memory"`` (bytes, or text such as
            ``"10GB"``) is scheduled and enforced: a worker that exceeds it fails, naming its
            limit.
        placement_strategy: ``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"``.
        accelerator_type: The accelerator type every worker's node must have, e.g. ``"A100"``.
        trainer_resources: Resources reserved next to rank 0.
    """

    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, Any]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    trainer_resources: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        workers = self.num_workers
        if isinstance(workers, (tuple, list)):
            if len(workers) != 2 or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in workers
            ):
                raise ValueError(f"num_workers must be an int or (min, max), got {workers!r}")
            if not 1 <= workers[0] <= workers[1]:
                raise ValueError(f"num_workers (min, max) needs 1 <= min <= max, got {workers!r}")
            self.num_workers = (workers[0], workers[1])
        elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {workers!r}")
        if self.placement_strategy not in _STRATEGIES:
            raise ValueError(
                f"placement_strategy must be one of {', '.join(_STRATEGIES)}, "
                f"got {self.placement_strategy!r}"
            )

    @property
    def total_workers(self) -> int:
        """The most workers the run may have."""
        n = self.num_workers
        return n[1] if isinstance(n, tuple) else n

    def _cli_args(self, runtime: str = "local") -> List[str]:
        n = self.num_workers
        args = ["--num-workers", f"{n[0]}:{n[1]}" if isinstance(n, tuple) else str(n)]
        if self.use_gpu:
            args.append("--use-gpu")
        if self.resources_per_worker:
            args += ["--resources-per-worker", _resources_json(self.resources_per_worker)]
            # Locally trainyard holds each worker to its memory; Slurm's steps are held by
            # Slurm itself, and Ray schedules by memory without holding anyone to it.
            if "memory" in self.resources_per_worker and runtime == "local":
                args.append("--enforce-memory")
        if self.trainer_resources:
            args += ["--trainer-resources", _resources_json(self.trainer_resources)]
        args += ["--placement-strategy", self.placement_strategy]
        if self.accelerator_type:
            args += ["--accelerator-type", self.accelerator_type]
        return args


@dataclass
class CheckpointConfig:
    """Which committed checkpoints a run keeps.

    Args:
        num_to_keep: How many to keep (the best by ``checkpoint_score_attribute``, else the
            newest; the latest is always kept too). ``None`` keeps all.
        checkpoint_score_attribute: The reported metric that ranks checkpoints.
        checkpoint_score_order: ``"max"`` or ``"min"``: which way is better.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (
            isinstance(self.num_to_keep, bool)
            or not isinstance(self.num_to_keep, int)
            or self.num_to_keep < 1
        ):
            raise ValueError(
                f"num_to_keep must be None or a positive int, got {self.num_to_keep!r}"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                "checkpoint_score_order must be 'max' or 'min', "
                f"got {self.checkpoint_score_order!r}"
            )

    def _cli_args(self) -> List[str]:
        args: List[str] = []
        if self.num_to_keep is not None:
            args += ["--checkpoints-to-keep", str(self.num_to_keep)]
        if self.checkpoint_score_attribute:
            args += [
                "--checkpoint-score",
                f"{self.checkpoint_score_attribute}:{self.checkpoint_score_order}",
            ]
        return args


@dataclass
class FailureConfig:
    """How many times a failed run restarts (from its latest committed checkpoint).

    Args:
        max_failures: Restarts allowed; ``-1`` is unlimited.
    """

    max_failures: int = 0

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_failures, bool)
            or not isinstance(self.max_failures, int)
            or self.max_failures < -1
        ):
            raise ValueError(f"max_failures must be an int >= -1, got {self.max_failures!r}")


@dataclass
class RunConfig:
    """The run's name, where its folder lives, and its checkpoint and failure policies.

    Args:
        name: The run's name: its folder is ``storage_path/name``. A run of the same name and
            storage that did not finish resumes from its latest checkpoint. A name is
            generated when ``None``.
        storage_path: Where run folders live: a path, ``file:///...`` or ``s3://...``
            (default ``$TRAINYARD_STORAGE``, else ``~/trainyard_results``).
        checkpoint_config: Which checkpoints are kept.
        failure_config: How many restarts are allowed.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)

    def __post_init__(self) -> None:
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()

    def _cli_args(self) -> List[str]:
        args: List[str] = []
        if self.name:
            args += ["--name", self.name]
        if self.storage_path:
            args += ["--storage", str(self.storage_path)]
        args += ["--max-failures", str(self.failure_config.max_failures)]
        return args + self.checkpoint_config._cli_args()
