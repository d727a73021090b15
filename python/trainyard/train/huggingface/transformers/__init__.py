"""Ray Train's Hugging Face Transformers integration
(``ray.train.huggingface.transformers``) on trainyard: a ``transformers.Trainer`` inside a
``TorchTrainer``'s loop function, its checkpoints reported as Ray reports them::

    from transformers import Trainer, TrainingArguments
    from trainyard.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    def train_func():
        trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=...)
        trainer.add_callback(RayTrainReportCallback())
        trainer = prepare_trainer(trainer)
        trainer.train()

As Ray's, importing it does not need ``transformers``: without it, ``prepare_trainer`` raises
the ``ImportError`` that importing ``transformers`` raised.
"""

from trainyard.train.huggingface.transformers._transformers_utils import (
    RayTrainReportCallback,
    prepare_trainer,
)

__all__ = [
    "RayTrainReportCallback",
    "prepare_trainer",
]
