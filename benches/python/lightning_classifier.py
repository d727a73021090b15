"""One 2-worker PyTorch Lightning program for `cargo xtask bench-python`, run unchanged on Ray
Train and on trainyard: `python lightning_classifier.py ray|trainyard STORAGE`. Only the import differs,
as for a user who moves a Ray Train program over. The program is Ray's "Get started with
PyTorch Lightning" in small: a tiny classifier on synthetic data, Lightning's Trainer with
RayDDPStrategy, RayLightningEnvironment and RayTrainReportCallback (a checkpoint per epoch),
prepared with prepare_trainer."""

import sys

if sys.argv[1] == "ray":
    from ray.train import RunConfig, ScalingConfig
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from ray.train.torch import TorchTrainer
else:
    from trainyard.train import RunConfig, ScalingConfig
    from trainyard.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from trainyard.train.torch import TorchTrainer


def loop(config):
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Classifier(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Sequential(
                torch.nn.Flatten(),
                torch.nn.Linear(64, 16),
                torch.nn.ReLU(),
                torch.nn.Linear(16, 10),
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            self.log("loss", loss, on_step=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.model.parameters(), lr=0.001)

    torch.manual_seed(0)
    images = torch.randn(config["samples"], 1, 8, 8)
    labels = torch.arange(config["samples"]) % 10
    data = DataLoader(TensorDataset(images, labels), batch_size=16, shuffle=True)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)
    trainer.fit(Classifier(), train_dataloaders=data)


if __name__ == "__main__":
    result = TorchTrainer(
        loop,
        train_loop_config={"samples": 256, "epochs": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="lightning", storage_path=sys.argv[2]),
    ).fit()
    assert result.error is None and result.checkpoint is not None, result
