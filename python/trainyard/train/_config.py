"""The driver's configuration, named and shaped as Ray Train v2's (``ray.train``).

Where the rules live: the checks Ray 2.60 itself makes when a config is constructed are made
here, with Ray's exception types and words (they are Ray's API); Ray 2.60's deprecated
arguments raise ``DeprecationWarning`` with Ray's own message, as Ray does; what Ray offers
and trainyard does not raises ``ValueError`` naming what to use instead. Every rule of
trainyard's own about the values the binary takes (worker counts, resource names and amounts,
byte sizes, placement strategies, accelerator types, the elastic interval) lives in the
binary only: a ``ScalingConfig`` is checked by it when constructed (``trainyard plan -c FILE``,
a few milliseconds), so its errors still come at construction, naming the field; the values of
``RunConfig`` that become ``trainyard run`` flags (``max_failures``, ``num_to_keep``, ...) that
Ray does not check are checked by the binary when ``fit()`` starts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    from trainyard.train._callback import UserCallback

# Where the driver finds the values of the workers' variables its command line names (the
# binary's `crates/cli/src/secrets.rs`).
ENV_VALUES_VAR = "TRAINYARD_ENV_VALUES"

__all__ = ["CheckpointConfig", "FailureConfig", "LoggingConfig", "RunConfig", "ScalingConfig"]

# Ray's marker of an argument left out that is deprecated when given.
_DEPRECATED = "DEPRECATED"

# Ray 2.60's migration text (``ray.train.constants``), ending its deprecation messages.
V2_MIGRATION_GUIDE_LINK_MESSAGE = (
    "See this issue for more context and migration options: "
    "https://github.com/ray-project/ray/issues/49454."
)
V2_MIGRATION_GUIDE_MESSAGE = (
    f"{V2_MIGRATION_GUIDE_LINK_MESSAGE} "
    "Disable these warnings by setting the environment variable: "
    "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS=0"
)
_TRAINER_RESOURCES_DEPRECATION_MESSAGE = (
    "`ray.train.ScalingConfig(trainer_resources)` is deprecated. "
    "This parameter was an advanced configuration that specified "
    "resources for the Ray Train driver actor, which doesn't "
    "need to reserve logical resources because it doesn't perform "
    "any heavy computation. "
    "Only the `resources_per_worker` parameter should be used "
    "to specify resources for the training workers. "
    f"{V2_MIGRATION_GUIDE_MESSAGE}"
)
_FAIL_FAST_DEPRECATION_MESSAGE = (
    "`ray.train.FailureConfig(fail_fast)` is deprecated since it is "
    "only relevant in the context of multiple trials running in Ray Tune. "
    "This parameter is still available in `ray.tune.FailureConfig` "
    "for passing into a `ray.tune.Tuner`. "
    f"{V2_MIGRATION_GUIDE_MESSAGE}"
)
_RUN_CONFIG_DEPRECATION_MESSAGE = (
    "`RunConfig({})` is deprecated. This configuration was a "
    "Ray Tune API that did not support Ray Train usage well, "
    "so we are dropping support going forward. "
    "If you heavily rely on these configurations, "
    "you can run Ray Train as a single Ray Tune trial. "
    "See this issue for more context: "
    "https://github.com/ray-project/ray/issues/49454"
)
_CHECKPOINT_CONFIG_DEPRECATION_MESSAGE = (
    "`{}` is deprecated since it does not "
    "apply to user-defined training functions. "
    "Please remove this argument from your CheckpointConfig."
)


def _only_default(owner: str, name: str, value: Any, default: Any, instead: str) -> None:
    """Refuses ``value`` for an argument of Ray's that trainyard accepts at its default only."""
    if value != default:
        raise ValueError(
            f"{owner}({name}={value!r}) is not supported by trainyard (only {default!r} is): "
            f"{instead}"
        )


def _resources_json(resources: Dict[str, Any]) -> str:
    """A resource dictionary as JSON, for the binary (which checks the names and amounts:
    numbers, or byte sizes as text such as ``"10GB"``)."""
    import json

    if not isinstance(resources, dict):
        raise TypeError(f"resources must be a dict, got {type(resources).__name__}")
    for name in resources:
        if not isinstance(name, str):
            raise TypeError(f"resource names must be strings, got {name!r}")
    try:
        return json.dumps(resources, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"resources must map names to numbers or sizes such as '10GB', got {resources!r}"
        ) from error


def _binary_refusal(text: str, path: str) -> str:
    """The binary's refusal of a config file, as one sentence about the config itself."""
    import re

    message = text.strip().splitlines()[-1] if text.strip() else text
    message = message.removeprefix("error: ")
    message = message.replace(f"invalid JSON config `{path}`: ", "")
    return re.sub(r" at line \d+ column \d+$", "", message)


def _checked_by_the_binary(config: "ScalingConfig") -> None:
    """Has the ``trainyard`` binary check ``config`` (``trainyard plan -c FILE``, the one
    place trainyard's rules on scaling values live); raises ``ValueError`` with its reason.

    Skipped where no run starts from the config: in local mode, inside a run's workers (a
    module a loop function comes from, imported there), and without a binary (``fit()``
    then says it is missing)."""
    import os
    import subprocess
    import tempfile

    from trainyard._find_trainyard import find_trainyard_bin

    if config.local_mode or os.environ.get("TRAINYARD_REPORT_ADDR"):
        return
    try:
        binary = find_trainyard_bin()
    except FileNotFoundError:
        return
    n = config.num_workers
    document: Dict[str, Any] = {
        "num_workers": list(n) if isinstance(n, tuple) else n,
        "use_gpu": bool(config.use_gpu),
        "placement_strategy": config.placement_strategy,
    }
    if config.resources_per_worker is not None:
        document["resources_per_worker"] = json.loads(
            _resources_json(config.resources_per_worker)
        )
    if config.accelerator_type is not None:
        document["accelerator_type"] = config.accelerator_type
    if isinstance(n, tuple) and config.elastic_resize_monitor_interval_s != 60.0:
        document["resize_interval"] = f"{max(float(config.elastic_resize_monitor_interval_s), 0.001)}s"
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="trainyard-scaling-") as f:
        json.dump(document, f)
        f.flush()
        checked = subprocess.run(
            [binary, "plan", "-c", f.name, "--format", "json"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    if checked.returncode == 2:
        raise ValueError(f"ScalingConfig: {_binary_refusal(checked.stderr, f.name)}")


@dataclass
class ScalingConfig:
    """How many workers, and what each one gets.

    Args:
        num_workers: The number of workers, or ``(min, max)`` for an elastic run that starts
            once ``min`` fit and grows up to ``max``. ``0`` is Ray's local mode: the training
            function runs in this process, with world size 1 and rank 0 (or the ranks of a
            torchrun-style environment this process was started in).
        use_gpu: Give each worker a GPU.
        resources_per_worker: Each worker's resources, e.g.
            ``{"CPU": 1, "memory": 10 * 2**30}``. ``"memory"`` (bytes, or text such as
            ``"10GB"``) is scheduled and enforced: a worker that exceeds it fails, naming its
            limit.
        placement_strategy: ``"PACK"``, ``"SPREAD"``, ``"STRICT_PACK"`` or ``"STRICT_SPREAD"``.
        accelerator_type: The accelerator type every worker's node must have, e.g. ``"A100"``.
        trainer_resources: Deprecated in Ray Train v2: raises ``DeprecationWarning``, as Ray's.
        label_selector: Not supported (``ValueError``): select nodes with
            ``accelerator_type`` or a custom resource in ``resources_per_worker``.
        use_tpu: Not supported (``ValueError`` when ``True``).
        topology: Not supported (``ValueError`` when given).
        elastic_resize_monitor_interval_s: How often an elastic run looks for room to grow.
    """

    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, Any]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    trainer_resources: Optional[Dict[str, Any]] = None
    label_selector: Optional[Union[Dict[str, str], List[Dict[str, str]]]] = None
    use_tpu: bool = False
    topology: Optional[str] = None
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        # Ray 2.60's checks, in its words.
        if self.trainer_resources is not None:
            raise DeprecationWarning(_TRAINER_RESOURCES_DEPRECATION_MESSAGE)
        workers = self.num_workers
        is_fixed = isinstance(workers, int) and not isinstance(workers, bool)
        is_elastic = (
            isinstance(workers, tuple)
            and len(workers) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in workers)
        )
        if not (is_fixed or is_elastic):
            raise ValueError("ScalingConfig(num_workers) must be an int or a tuple of two ints.")
        if self.elastic_resize_monitor_interval_s < 0:
            raise ValueError(
                "ScalingConfig(elastic_resize_monitor_interval_s) must be non-negative."
            )
        if self.min_workers < 0:
            raise ValueError(
                f"Invalid ScalingConfig(num_workers={self.num_workers}): "
                "Number of workers cannot be negative."
            )
        if self.min_workers > self.max_workers:
            raise ValueError(
                f"Invalid ScalingConfig(num_workers={self.num_workers}): "
                f"min_workers={self.min_workers} must be <= max_workers={self.max_workers}."
            )
        if self.use_gpu and self.use_tpu:
            raise ValueError("Cannot specify both `use_gpu=True` and `use_tpu=True`.")
        gpus = (self.resources_per_worker or {}).get("GPU")
        if not self.use_gpu and gpus:
            raise ValueError(
                "`use_gpu` is False but `GPU` was found in "
                "`resources_per_worker`. Either set `use_gpu` to True or "
                "remove `GPU` from `resources_per_worker."
            )
        if self.use_gpu and gpus == 0:
            raise ValueError(
                "`use_gpu` is True but `GPU` is set to 0 in "
                "`resources_per_worker`. Either set `use_gpu` to False or "
                "request a positive number of `GPU` in "
                "`resources_per_worker."
            )
        # What Ray offers and trainyard does not.
        _only_default(
            "ScalingConfig",
            "label_selector",
            self.label_selector,
            None,
            "workers are placed by resources; ask for a node's accelerator with "
            "accelerator_type, or for a custom resource in resources_per_worker",
        )
        _only_default(
            "ScalingConfig", "use_tpu", self.use_tpu, False, "workers get GPUs with use_gpu=True"
        )
        _only_default(
            "ScalingConfig",
            "topology",
            self.topology,
            None,
            "it describes TPU slices, and TPUs are not supported; use use_gpu=True",
        )
        # trainyard's own rules: the binary's.
        _checked_by_the_binary(self)

    @property
    def min_workers(self) -> int:
        """The fewest workers the run starts with."""
        n = self.num_workers
        return n[0] if isinstance(n, tuple) else n

    @property
    def max_workers(self) -> int:
        """The most workers the run may have."""
        return self.total_workers

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min, max)`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def _resources_per_worker_not_none(self) -> Dict[str, Any]:
        """Each worker's resources as Ray counts them: ``{"CPU": 1}`` (``{"GPU": 1}`` with
        ``use_gpu``) when none are given, zero amounts left out, and
        ``accelerator_type:<type>`` at 0.001 for an ``accelerator_type``."""
        if self.resources_per_worker is None:
            resources: Dict[str, Any] = {"GPU": 1} if self.use_gpu else {"CPU": 1}
        else:
            resources = {k: v for k, v in self.resources_per_worker.items() if v != 0}
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        if self.accelerator_type:
            resources.setdefault(f"accelerator_type:{self.accelerator_type}", 0.001)
        return resources

    @property
    def total_resources(self) -> Dict[str, float]:
        """The resources of all workers together (of ``max_workers`` for an elastic run),
        as Ray's; byte sizes given as text (``"10GB"``) have no total here."""
        total: Dict[str, float] = {}
        for name, amount in self._resources_per_worker_not_none.items():
            if isinstance(amount, str):
                raise ValueError(
                    f"total_resources needs numbers: resource {name!r} is {amount!r}; give "
                    "it in bytes"
                )
            total[name] = total.get(name, 0.0) + amount * self.max_workers
        return total

    @property
    def additional_resources_per_worker(self) -> Dict[str, Any]:
        """Each worker's resources besides CPUs and GPUs."""
        return {
            k: v for k, v in self._resources_per_worker_not_none.items() if k not in ("CPU", "GPU")
        }

    @property
    def num_cpus_per_worker(self) -> Any:
        """The CPUs of each worker."""
        return self._resources_per_worker_not_none.get("CPU", 0)

    @property
    def num_gpus_per_worker(self) -> Any:
        """The GPUs of each worker."""
        return self._resources_per_worker_not_none.get("GPU", 0)

    @property
    def local_mode(self) -> bool:
        """Whether the training function runs in this process (``num_workers=0``)."""
        return self.num_workers == 0

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
        if isinstance(n, tuple) and self.elastic_resize_monitor_interval_s != 60.0:
            # The CLI takes a positive interval: 0 ("look all the time") becomes 1 ms.
            interval = max(float(self.elastic_resize_monitor_interval_s), 0.001)
            args += ["--resize-interval", f"{interval}"]
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
        checkpoint_frequency: Deprecated in Ray Train v2: raises ``DeprecationWarning``.
        checkpoint_at_end: Deprecated in Ray Train v2: raises ``DeprecationWarning``.

    A ``checkpoint_score_attribute`` that a checkpoint's metrics lack ranks that checkpoint
    worst, and ``fit()`` logs an error naming the attribute and the keys there are (Ray's
    "Result dict has no key" error).
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: Any = _DEPRECATED
    checkpoint_at_end: Any = _DEPRECATED

    def __post_init__(self) -> None:
        for name in ("checkpoint_frequency", "checkpoint_at_end"):
            if getattr(self, name) != _DEPRECATED:
                raise DeprecationWarning(_CHECKPOINT_CONFIG_DEPRECATION_MESSAGE.format(name))
        # Ray 2.60's checks, in its words.
        if self.num_to_keep is not None and self.num_to_keep <= 0:
            raise ValueError(
                f"Received invalid num_to_keep: {self.num_to_keep}. "
                "Must be None or an integer >= 1."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                "Received invalid checkpoint_score_order: "
                f"{self.checkpoint_score_order}. Must be 'max' or 'min'."
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
        fail_fast: Deprecated in Ray Train v2: raises ``DeprecationWarning``, as Ray's.
        controller_failure_limit: Ray's controller restarts; only its default (``-1``) is
            accepted: trainyard's driver does not restart itself (``max_failures`` counts
            every failure of a run).
        max_preemption_failures, relax_collectives_on_preemption, preemption_grace_s: Ray's
            pre-emption handling; only their defaults are accepted.
    """

    max_failures: int = 0
    fail_fast: Any = _DEPRECATED
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0

    def __post_init__(self) -> None:
        if self.fail_fast != _DEPRECATED:
            raise DeprecationWarning(_FAIL_FAST_DEPRECATION_MESSAGE)
        instead = "a pre-empted or failed run restarts within max_failures"
        _only_default(
            "FailureConfig",
            "controller_failure_limit",
            self.controller_failure_limit,
            -1,
            "trainyard's driver does not restart itself; use max_failures for the run's restarts",
        )
        _only_default(
            "FailureConfig", "max_preemption_failures", self.max_preemption_failures, -1, instead
        )
        _only_default(
            "FailureConfig",
            "relax_collectives_on_preemption",
            self.relax_collectives_on_preemption,
            False,
            instead,
        )
        _only_default("FailureConfig", "preemption_grace_s", self.preemption_grace_s, 0.0, instead)


# The level names Ray accepts (``logging``'s and Ray's own ``TRACE``), as numbers.
_LEVELS = {
    "CRITICAL": 50,
    "FATAL": 50,
    "ERROR": 40,
    "WARN": 30,
    "WARNING": 30,
    "INFO": 20,
    "DEBUG": 10,
    "TRACE": 5,
    "NOTSET": 0,
}


@dataclass
class LoggingConfig:
    """How much of trainyard's own logging ``fit()`` shows.

    Args:
        log_level: The least level shown of the driver's logs (the ``trainyard`` binary's
            and the ``trainyard`` Python logger's), a standard logging level name; default
            ``"INFO"``. Worker output is shown whatever the level.
    """

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not isinstance(self.log_level, str) or self.log_level.upper() not in _LEVELS:
            raise ValueError(
                f"Invalid log_level: {self.log_level!r}. "
                f"Must be one of: {', '.join(repr(x) for x in sorted(_LEVELS))}."
            )
        self.log_level = self.log_level.upper()

    @property
    def level(self) -> int:
        """The level as a number of the ``logging`` module."""
        return _LEVELS[self.log_level]


def _worker_env_vars(runtime_env: Any) -> Dict[str, str]:
    """The ``env_vars`` of a ``worker_runtime_env``: the one key it may have."""
    if runtime_env is None:
        return {}
    if not isinstance(runtime_env, dict):
        raise TypeError(
            "RunConfig(worker_runtime_env=...) must be a dict such as "
            f"{{'env_vars': {{'NAME': 'value'}}}}, got {type(runtime_env).__name__}"
        )
    others = sorted(str(key) for key in runtime_env if key != "env_vars")
    if others:
        raise ValueError(
            f"RunConfig(worker_runtime_env) key {others[0]!r} is not supported: the workers "
            "run in the driver's Python environment and working directory; only 'env_vars' "
            "is accepted (install packages into the driver's environment instead)"
        )
    env_vars = runtime_env.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
    ):
        raise TypeError(
            "RunConfig(worker_runtime_env={'env_vars': ...}) must map names to strings, "
            f"got {env_vars!r}"
        )
    for name in env_vars:
        if not name or "=" in name:
            raise ValueError(
                f"RunConfig(worker_runtime_env) env_vars name {name!r} is not a variable name"
            )
    return dict(env_vars)


@dataclass
class RunConfig:
    """The run's name, where its folder lives, and its checkpoint and failure policies.

    Args:
        name: The run's name: its folder is ``storage_path/name``. A run of the same name and
            storage resumes from its latest checkpoint, a finished one included (as Ray
            Train v2's: it trains on, its checkpoints numbered on). A name is generated when
            ``None``.
        storage_path: Where run folders live: a path, ``file:///...`` or ``s3://...``
            (default ``$TRAINYARD_STORAGE``, else ``~/trainyard_results``).
        storage_filesystem: pyarrow's ``LocalFileSystem`` or ``S3FileSystem`` (then
            ``storage_path`` is ``bucket/prefix``, as Ray's; the endpoint and credentials come
            from the ``AWS_*`` environment variables, not from the object); another file
            system raises ``ValueError``: give ``storage_path`` as a path or URI instead.
        failure_config: How many restarts are allowed.
        checkpoint_config: Which checkpoints are kept.
        callbacks: ``UserCallback``s, called in this process as the run's events come
            (``after_report``, ``after_exception``); anything else raises ``ValueError``, as
            Ray's.
        worker_runtime_env: ``{"env_vars": {"NAME": "value"}}``: variables set in every
            worker; any other key raises ``ValueError`` naming it.
        logging_config: How much of the driver's logging ``fit()`` shows.
        sync_config, verbose, stop, progress_reporter, log_to_file: Deprecated in Ray
            Train v2: raise ``DeprecationWarning`` with Ray's message.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    callbacks: Optional[List["UserCallback"]] = None
    worker_runtime_env: Optional[Dict[str, Any]] = None
    logging_config: Optional[LoggingConfig] = None
    sync_config: Any = _DEPRECATED
    verbose: Any = _DEPRECATED
    stop: Any = _DEPRECATED
    progress_reporter: Any = _DEPRECATED
    log_to_file: Any = _DEPRECATED

    def __post_init__(self) -> None:
        for param in ("sync_config", "verbose", "stop", "progress_reporter", "log_to_file"):
            if getattr(self, param) != _DEPRECATED:
                raise DeprecationWarning(_RUN_CONFIG_DEPRECATION_MESSAGE.format(param))
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()
        if self.logging_config is None:
            self.logging_config = LoggingConfig()
        if self.storage_path is not None and not isinstance(self.storage_path, str):
            import os

            self.storage_path = os.fspath(self.storage_path)
        for name, value, kind in (
            ("checkpoint_config", self.checkpoint_config, CheckpointConfig),
            ("failure_config", self.failure_config, FailureConfig),
            ("logging_config", self.logging_config, LoggingConfig),
        ):
            if not isinstance(value, kind):
                raise ValueError(
                    f"Invalid `{kind.__name__}` type: {value.__class__}. "
                    f"Use `trainyard.train.{kind.__name__}` instead."
                )
        kind = None if self.storage_filesystem is None else type(self.storage_filesystem).__name__
        if kind == "S3FileSystem":
            # Ray's storage_path is then bucket/prefix: trainyard's is the URI.
            if self.storage_path is not None and "://" not in self.storage_path:
                self.storage_path = "s3://" + self.storage_path.lstrip("/")
        elif kind not in (None, "LocalFileSystem"):
            raise ValueError(
                f"RunConfig(storage_filesystem={kind}) is not supported: give storage_path as "
                "a local path or an s3://bucket/prefix URI (the endpoint and credentials come "
                "from the AWS_* environment variables)"
            )
        from trainyard.train._callback import UserCallback

        self.callbacks = list(self.callbacks or [])
        if not all(isinstance(cb, UserCallback) for cb in self.callbacks):
            # Ray 2.60's words; Ray Tune's callbacks are not offered either.
            raise ValueError(
                "All callbacks must be instances of `trainyard.train.UserCallback`. "
                "Passing in a Ray Tune callback is no longer supported. "
                "See this issue for more context: "
                "https://github.com/ray-project/ray/issues/49454"
            )
        _worker_env_vars(self.worker_runtime_env)
        self.worker_runtime_env = dict(self.worker_runtime_env or {})

    def _cli_args(self) -> List[str]:
        args: List[str] = []
        if self.name:
            args += ["--name", self.name]
        if self.storage_path:
            args += ["--storage", str(self.storage_path)]
        assert self.failure_config is not None and self.checkpoint_config is not None
        args += ["--max-failures", str(self.failure_config.max_failures)]
        # As Ray Train v2: a finished run of the same name and storage trains on from its
        # latest checkpoint.
        args += ["--resume", "always"]
        # By name only: the values travel in the driver's environment (``_cli_env``), never on
        # a command line every user of the machine can read.
        for name in _worker_env_vars(self.worker_runtime_env):
            args += ["--env", name]
        return args + self.checkpoint_config._cli_args()

    def _cli_env(self) -> Dict[str, str]:
        """What the driver's environment carries for ``_cli_args``: the workers' variables'
        values, in the one variable ``--env NAME`` reads first (and no variable of the
        driver's own changes)."""
        values = _worker_env_vars(self.worker_runtime_env)
        return {ENV_VALUES_VAR: json.dumps(values)} if values else {}
