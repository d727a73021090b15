"""The classes of ``trainyard.train.lightning``, as Ray 2.60's ``ray.train.lightning``: the
same base classes, names, arguments and checkpoints, with the worker's place taken from
``trainyard.train.get_context()`` and its device from ``trainyard.train.torch.get_device()``."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from trainyard import train
from trainyard.train import Checkpoint, CheckpointUploadMode
from trainyard.train.torch import get_device


def import_lightning() -> Any:
    """``lightning.pytorch``, else ``pytorch_lightning``."""
    try:
        import lightning.pytorch as pl
    except ModuleNotFoundError:
        import pytorch_lightning as pl
    return pl


pl = import_lightning()

try:
    from lightning.pytorch.plugins.environments import LightningEnvironment
except ModuleNotFoundError:
    from pytorch_lightning.plugins.environments import LightningEnvironment

logger = logging.getLogger(__name__)


class _RayStrategy:
    """What Ray's strategies change in Lightning's: the worker's device, and a sampler
    over the run's ranks."""

    world_size: int
    global_rank: int

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return dict(num_replicas=self.world_size, rank=self.global_rank)


class RayDDPStrategy(_RayStrategy, pl.strategies.DDPStrategy):  # type: ignore[misc]
    """Subclass of DDPStrategy to ensure compatibility with trainyard's orchestration.

    For a full list of initialization arguments, please refer to:
    https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.strategies.DDPStrategy.html

    Note that ``process_group_backend``, ``timeout``, and ``start_method`` have no effect
    here: the process group is the run's, set up by :class:`~trainyard.train.torch.TorchConfig`.
    """


class RayFSDPStrategy(_RayStrategy, pl.strategies.FSDPStrategy):  # type: ignore[misc]
    """Subclass of FSDPStrategy to ensure compatibility with trainyard's orchestration.

    For a full list of initialization arguments, please refer to:
    https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.strategies.FSDPStrategy.html

    FSDP needs an accelerator: on CPU workers torch refuses it, as under Ray.
    """


class RayDeepSpeedStrategy(_RayStrategy, pl.strategies.DeepSpeedStrategy):  # type: ignore[misc]
    """Subclass of DeepSpeedStrategy to ensure compatibility with trainyard's orchestration.

    For a full list of initialization arguments, please refer to:
    https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.strategies.DeepSpeedStrategy.html

    DeepSpeed must be installed (``pip install deepspeed``): without it Lightning's
    constructor raises ``MisconfigurationException`` saying so.
    """


class RayLightningEnvironment(LightningEnvironment):  # type: ignore[misc]
    """Setup Lightning DDP training environment for a trainyard run: the world size and
    ranks are the run's (``trainyard.train.get_context()``)."""

    def world_size(self) -> int:
        return train.get_context().get_world_size()

    def global_rank(self) -> int:
        return train.get_context().get_world_rank()

    def local_rank(self) -> int:
        return train.get_context().get_local_rank()

    def node_rank(self) -> int:
        return train.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        # Disabled: `world_size()` returns the run's.
        pass

    def set_global_rank(self, rank: int) -> None:
        # Disabled: `global_rank()` returns the run's.
        pass

    def teardown(self) -> None:
        pass


def prepare_trainer(trainer: "pl.Trainer") -> "pl.Trainer":
    """Prepare the PyTorch Lightning Trainer for distributed execution.

    Raises ``RuntimeError`` unless its strategy is one of ``RayDDPStrategy``,
    ``RayFSDPStrategy`` or ``RayDeepSpeedStrategy`` (or a subclass) and its cluster
    environment, if any, a ``RayLightningEnvironment``.
    """
    valid_strategy_class = [RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy]
    if not any(isinstance(trainer.strategy, cls) for cls in valid_strategy_class):
        raise RuntimeError(
            f"Invalid strategy class: {type(trainer.strategy)}. To use "
            "PyTorch Lightning with trainyard, the strategy object should be one of "
            f"{[cls.__name__ for cls in valid_strategy_class]} class "
            "or its subclass."
        )
    cluster_environment = getattr(trainer.strategy, "cluster_environment", None)
    if cluster_environment and not isinstance(cluster_environment, RayLightningEnvironment):
        raise RuntimeError(
            "Invalid cluster environment plugin. The expected class is"
            "`trainyard.train.lightning.RayLightningEnvironment` "
            f"but got {type(cluster_environment)}!"
        )
    return trainer


class RayTrainReportCallback(pl.callbacks.Callback):  # type: ignore[misc]
    """A simple callback that reports checkpoints to trainyard on train epoch end.

    It fetches the latest ``trainer.callback_metrics``, adds ``epoch`` and ``step``, and
    reports them with a checkpoint on each training epoch end. Checkpoints are saved in
    the following structure::

        checkpoint_00000*/      trainyard checkpoint
        └─ checkpoint.ckpt      PyTorch Lightning checkpoint

    Args:
        checkpoint_upload_mode: How ``report`` hands the checkpoint in (``SYNC`` when
            ``None``); see :class:`~trainyard.train.CheckpointUploadMode`.
        validation: Not supported (``report`` raises ``NotImplementedError``).
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(
        self,
        checkpoint_upload_mode: Optional[CheckpointUploadMode] = None,
        validation: bool = False,
    ) -> None:
        super().__init__()
        self.checkpoint_upload_mode = (
            CheckpointUploadMode.SYNC if checkpoint_upload_mode is None else checkpoint_upload_mode
        )
        self.validation = validation
        context = train.get_context()
        self.tmpdir_prefix = Path(
            tempfile.gettempdir(),
            f"lightning_checkpoints-pid={os.getpid()}-name={context.get_experiment_name()}"
            f"-world_rank={context.get_world_rank()}",
        ).as_posix()
        if os.path.isdir(self.tmpdir_prefix):
            shutil.rmtree(self.tmpdir_prefix)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # A checkpoint folder of a fixed name per epoch.
        tmpdir = Path(self.tmpdir_prefix, str(trainer.current_epoch)).as_posix()
        os.makedirs(tmpdir, exist_ok=True)

        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step

        ckpt_path = Path(tmpdir, self.CHECKPOINT_NAME).as_posix()
        trainer.save_checkpoint(ckpt_path, weights_only=False)

        train.report(
            metrics=metrics,
            checkpoint=Checkpoint.from_directory(tmpdir),
            checkpoint_upload_mode=self.checkpoint_upload_mode,
            validation=self.validation,
        )
        # Every worker has reported before any goes on.
        trainer.strategy.barrier()
        # An ASYNC report takes the folder away itself.
        if self.checkpoint_upload_mode.default_delete_local_checkpoint_after_upload():
            return
        shutil.rmtree(tmpdir, ignore_errors=True)
