"""The callback and ``prepare_trainer`` of ``trainyard.train.huggingface.transformers``, as
Ray 2.60's."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Optional, Type

from trainyard import train
from trainyard.train import Checkpoint

logger = logging.getLogger(__name__)

TRANSFORMERS_IMPORT_ERROR: Optional[ImportError] = None

try:
    import transformers.trainer
    from transformers import Trainer
    from transformers.trainer_callback import TrainerCallback
except ImportError as e:
    TRANSFORMERS_IMPORT_ERROR = e
    TrainerCallback = object


class RayTrainReportCallback(TrainerCallback):  # type: ignore[misc,valid-type]
    """A simple callback to report checkpoints and metrics to trainyard.

    A ``transformers.TrainerCallback`` whose ``on_save`` takes, after each checkpoint the
    ``Trainer`` saves, the metrics of ``TrainerState.log_history`` (later entries over
    earlier ones) and reports them with a copy of the latest checkpoint. Checkpoints are
    saved in the following structure::

        checkpoint_00000*/   trainyard checkpoint
        └─ checkpoint/       Hugging Face Transformers checkpoint

    Configure logging, evaluation and saving so that the metric you monitor is up to date
    when the ``Trainer`` saves (``eval_strategy == save_strategy``, say).
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Event called after a checkpoint save."""
        with TemporaryDirectory() as tmpdir:
            metrics: dict = {}
            for log in state.log_history:
                metrics.update(log)

            source_ckpt_path = transformers.trainer.get_last_checkpoint(args.output_dir)
            if source_ckpt_path is not None:
                target_ckpt_path = Path(tmpdir, self.CHECKPOINT_NAME).as_posix()
                shutil.copytree(source_ckpt_path, target_ckpt_path)
                checkpoint: Optional[Checkpoint] = Checkpoint.from_directory(tmpdir)
            else:
                checkpoint = None

            train.report(metrics=metrics, checkpoint=checkpoint)


def prepare_trainer(trainer: "Trainer") -> "Trainer":
    """Prepare your Hugging Face Transformers ``Trainer`` for trainyard.

    Its class becomes ``RayTransformersTrainer``, a subclass of its own, as with Ray (whose
    subclass feeds it Ray Data iterables: trainyard has no Ray Data, so the data loaders are
    the ``Trainer``'s own, sharded over the run's ranks by ``transformers`` itself).

    Raises the ``ImportError`` of importing ``transformers`` when it is not installed.
    """
    if TRANSFORMERS_IMPORT_ERROR is not None:
        raise TRANSFORMERS_IMPORT_ERROR

    base_trainer_class: Type[transformers.trainer.Trainer] = trainer.__class__

    class RayTransformersTrainer(base_trainer_class):  # type: ignore[misc,valid-type]
        """The ``Trainer`` as ``prepare_trainer`` leaves it."""

    trainer.__class__ = RayTransformersTrainer
    return trainer
