"""Ray Train v2's ``ray.train.torch`` on trainyard: ``TorchTrainer`` and the helpers a loop
function uses to run under ``torch.distributed``. Importing it does not import torch: the
helpers import it when first called, in the workers, so that a driver that only calls
``fit()`` does not spend seconds importing a torch it never uses.

A Ray Train program runs with ``ray.train`` replaced by ``trainyard.train``::

    from trainyard.train import ScalingConfig
    from trainyard.train.torch import TorchTrainer

    def train_loop(config):
        ...  # prepare_model, prepare_data_loader, trainyard.train.report

    result = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

from trainyard.train._checkpoint import Checkpoint
from trainyard.train._config import V2_MIGRATION_GUIDE_LINK_MESSAGE, RunConfig, ScalingConfig
from trainyard.train._context import _GET_METADATA_DEPRECATION_MESSAGE, get_context
from trainyard.train._result import Result
from trainyard.train._validation import ValidationConfig

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = [
    "TorchConfig",
    "TorchTrainer",
    "backward",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "prepare_data_loader",
    "prepare_model",
    "prepare_optimizer",
]


@dataclass
class TorchConfig:
    """The workers' ``torch.distributed`` process group.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; ``None`` picks NCCL for GPU workers, else gloo.
        init_method: ``"env"`` (the only method here: ``MASTER_ADDR``/``MASTER_PORT``).
        timeout_s: The process group's timeout, in seconds.
    """

    backend: Optional[str] = None
    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend must be None, 'gloo' or 'nccl', got {self.backend!r}")
        if self.init_method != "env":
            raise ValueError(f"init_method must be 'env', got {self.init_method!r}")
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int)
            or (self.timeout_s < 1)
        ):
            raise ValueError(f"timeout_s must be a positive int, got {self.timeout_s!r}")


_TRAINER_RESTORE_DEPRECATION_WARNING = (
    "The `restore` and `can_restore` APIs are deprecated and "
    f"will be removed in a future release. {V2_MIGRATION_GUIDE_LINK_MESSAGE}"
)
_RESUME_FROM_CHECKPOINT_NOTE = (
    "TorchTrainer(resume_from_checkpoint=...) is deprecated in Ray Train v2 (Ray 2.60 raises "
    "DeprecationWarning); trainyard still honours it: get_checkpoint() returns it until the "
    "run has a checkpoint of its own. Portable code loads the checkpoint in the training "
    "function, from a path passed in train_loop_config"
)


class TorchTrainer:
    """Runs ``train_loop_per_worker`` on every worker of a ``torch.distributed`` group.

    Args:
        train_loop_per_worker: The loop function: takes ``config`` (the
            ``train_loop_config``, ``{}`` when ``None``) or nothing. Defined anywhere: in
            ``__main__``, a notebook, a closure or a module (it travels by cloudpickle).
        train_loop_config: What the loop function gets as ``config``.
        torch_config: The process group's backend and timeout.
        scaling_config: How many workers and what each gets; ``num_workers=0`` runs the
            loop function in this process (Ray's local mode).
        run_config: The run's name, storage, checkpoint and failure policies.
        datasets, dataset_config: Ray Data's; not available here (``ValueError`` naming
            ``prepare_data_loader``).
        validation_config: How reported checkpoints are validated (``report(...,
            validation=...)``): off the training path, in a process of its own on this
            machine; ``fit()`` returns once every validation has ended.
        metadata: Deprecated in Ray Train v2: raises ``DeprecationWarning`` with Ray's
            message, as Ray does.
        resume_from_checkpoint: The checkpoint ``get_checkpoint()`` returns until the run
            has one of its own (Ray 2.60 raises ``DeprecationWarning`` here; trainyard warns
            and honours it).
        runtime: Where the workers run: ``"local"`` (this machine), ``"ray"`` or
            ``"slurm"``, as ``trainyard run --runtime``; default ``$TRAINYARD_RUNTIME``,
            else local.
    """

    def __init__(
        self,
        train_loop_per_worker: Union[Callable[[], Any], Callable[[Dict[str, Any]], Any]],
        *,
        train_loop_config: Optional[Dict[str, Any]] = None,
        torch_config: Optional[TorchConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[Dict[str, Any]] = None,
        dataset_config: Any = None,
        validation_config: Optional[ValidationConfig] = None,
        metadata: Optional[Dict[str, Any]] = None,
        resume_from_checkpoint: Optional[Checkpoint] = None,
        runtime: Optional[str] = None,
    ) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(
                "train_loop_per_worker must be a function, got "
                f"{type(train_loop_per_worker).__name__}"
            )
        if metadata is not None:
            raise DeprecationWarning(_GET_METADATA_DEPRECATION_MESSAGE)
        if datasets or dataset_config is not None:
            raise ValueError(
                "datasets and dataset_config need Ray Data, which trainyard does not have: "
                "build a torch.utils.data.DataLoader in the loop function and pass it "
                "through trainyard.train.torch.prepare_data_loader"
            )
        if validation_config is not None and not isinstance(validation_config, ValidationConfig):
            raise TypeError(
                "validation_config must be a trainyard.train.ValidationConfig, got "
                f"{type(validation_config).__name__}"
            )
        if resume_from_checkpoint is not None:
            if not isinstance(resume_from_checkpoint, Checkpoint):
                raise TypeError(
                    "resume_from_checkpoint must be a trainyard.train.Checkpoint, got "
                    f"{type(resume_from_checkpoint).__name__}"
                )
            warnings.warn(_RESUME_FROM_CHECKPOINT_NOTE, UserWarning, stacklevel=2)
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.torch_config = torch_config or TorchConfig()
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.validation_config = validation_config
        self.runtime = runtime

    @classmethod
    def restore(cls, *args: Any, **kwargs: Any) -> "TorchTrainer":
        """[Deprecated] Raises ``DeprecationWarning``, as Ray 2.60's: run ``fit()`` again
        with the same ``RunConfig(name, storage_path)`` to resume a run."""
        raise DeprecationWarning(_TRAINER_RESTORE_DEPRECATION_WARNING)

    @classmethod
    def can_restore(cls, *args: Any, **kwargs: Any) -> bool:
        """[Deprecated] Raises ``DeprecationWarning``, as Ray 2.60's."""
        raise DeprecationWarning(_TRAINER_RESTORE_DEPRECATION_WARNING)

    def fit(self) -> Result:
        """Runs the loop function on every worker until it returns on all of them.

        Returns the ``Result``; raises ``TrainingFailedError`` (``WorkerGroupError`` with
        each failed rank's exception, or ``ControllerError``) when the run fails beyond
        ``FailureConfig.max_failures``, ``KeyboardInterrupt`` after a Ctrl-C has stopped
        it. Worker output is printed with its rank prefix as it comes. In local mode
        (``num_workers=0``) the loop function runs here and its exception is raised as
        it is, as in Ray.
        """
        if self.scaling_config.local_mode:
            from trainyard.train import _local

            return _local.fit(self.train_loop_per_worker, self.train_loop_config, self.run_config)
        from trainyard import _driver

        return _driver.fit(
            self.train_loop_per_worker,
            self.train_loop_config,
            scaling_config=self.scaling_config,
            run_config=self.run_config,
            backend=self.torch_config.backend,
            timeout_s=self.torch_config.timeout_s,
            resume_from_checkpoint=self.resume_from_checkpoint,
            runtime=self.runtime,
            validation_config=self.validation_config,
            backend_config=self.torch_config,
        )


def _uses_gpu() -> bool:
    return os.environ.get("TRAINYARD_USE_GPU") == "1" or (
        os.environ.get("TRAINYARD_TORCH_BACKEND") == "nccl"
    )


def get_device() -> torch.device:
    """This worker's device: its GPU when the run gives workers GPUs, else the CPU."""
    import torch

    if _uses_gpu() and torch.cuda.is_available():
        count = torch.cuda.device_count()
        return torch.device("cuda", get_context().get_local_rank() % count)
    return torch.device("cpu")


def get_devices() -> List[torch.device]:
    """This worker's devices (one here)."""
    return [get_device()]


def prepare_model(
    model: torch.nn.Module,
    move_to_device: Union[bool, torch.device] = True,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[Dict[str, Any]] = None,
) -> torch.nn.Module:
    """Moves ``model`` to this worker's device and, with more than one worker, wraps it
    in ``DistributedDataParallel`` (``parallel_strategy="ddp"``) or
    ``FullyShardedDataParallel`` (``"fsdp"``); ``None`` wraps nothing."""
    import torch

    kwargs = dict(parallel_strategy_kwargs or {})
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if move_to_device is not False:
        model = model.to(device)
    if get_context().get_world_size() <= 1 or parallel_strategy is None:
        return model
    if parallel_strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device])
            kwargs.setdefault("output_device", device)
        return DistributedDataParallel(model, **kwargs)
    if parallel_strategy == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(model, **kwargs)
    raise ValueError(f"parallel_strategy must be 'ddp', 'fsdp' or None, got {parallel_strategy!r}")


def _move(batch: Any, device: torch.device) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        moved = [_move(item, device) for item in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    if isinstance(batch, dict):
        return {key: _move(value, device) for key, value in batch.items()}
    return batch


def _on_device(base: DataLoader, device: torch.device) -> DataLoader:
    """``base`` as a ``DataLoader`` whose batches come on ``device``."""
    from torch.utils.data import DataLoader

    class _DeviceDataLoader(DataLoader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.__dict__.update(base.__dict__)

        def __iter__(self):  # type: ignore[no-untyped-def]
            for batch in iter(base):
                yield _move(batch, device)

        def __len__(self) -> int:
            return len(base)

    return _DeviceDataLoader()


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = True,
) -> DataLoader:
    """Gives each worker its shard of ``data_loader``'s dataset (a ``DistributedSampler``,
    shuffling when the loader shuffled) and, with ``move_to_device``, its batches on this
    worker's device. Call ``loader.sampler.set_epoch(epoch)`` each epoch to reshuffle."""
    from torch.utils.data import (
        DataLoader,
        DistributedSampler,
        IterableDataset,
        SequentialSampler,
    )

    world_size = get_context().get_world_size()
    if (
        add_dist_sampler
        and world_size > 1
        and not isinstance(data_loader.dataset, IterableDataset)
        and not isinstance(data_loader.sampler, DistributedSampler)
    ):
        shuffle = not isinstance(data_loader.sampler, SequentialSampler)
        sampler = DistributedSampler(
            data_loader.dataset,
            num_replicas=world_size,
            rank=get_context().get_world_rank(),
            shuffle=shuffle,
        )
        data_loader = DataLoader(
            data_loader.dataset,
            batch_size=data_loader.batch_size,
            shuffle=False,
            sampler=sampler,
            num_workers=data_loader.num_workers,
            collate_fn=data_loader.collate_fn,
            pin_memory=data_loader.pin_memory,
            drop_last=data_loader.drop_last,
            timeout=data_loader.timeout,
            worker_init_fn=data_loader.worker_init_fn,
        )
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _on_device(data_loader, device)
    return data_loader


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """``optimizer`` as it is (no mixed precision here)."""
    return optimizer


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()``."""
    tensor.backward()


def enable_reproducibility(seed: int = 0) -> None:
    """Seeds Python, NumPy and torch with ``seed`` and makes torch's algorithms
    deterministic, as Ray's does."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    # Deterministic cuBLAS on CUDA >= 10.2.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
