"""Ray Train's PyTorch Lightning integration (``ray.train.lightning``) on trainyard: a
Lightning ``Trainer`` inside a ``TorchTrainer``'s loop function, with Ray's strategies,
cluster environment and report callback::

    import lightning.pytorch as pl
    from trainyard.train.lightning import (
        RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer,
    )

    def train_func():
        trainer = pl.Trainer(
            strategy=RayDDPStrategy(),
            plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()],
            enable_checkpointing=False,
        )
        trainer = prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=loader)

Importing this module imports Lightning (``lightning``, else ``pytorch_lightning``), and raises
``ModuleNotFoundError`` naming the package to install when neither is there, as Ray's does.
"""

# isort: off
try:
    import lightning  # noqa: F401
except ModuleNotFoundError:
    try:
        import pytorch_lightning  # noqa: F401
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "PyTorch Lightning isn't installed. To install PyTorch Lightning, "
            "please run 'pip install lightning'"
        ) from None
# isort: on

from trainyard.train.lightning._lightning_utils import (
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)

__all__ = [
    "prepare_trainer",
    "RayDDPStrategy",
    "RayFSDPStrategy",
    "RayDeepSpeedStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
]
