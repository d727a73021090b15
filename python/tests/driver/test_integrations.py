"""``trainyard.train.lightning`` and ``trainyard.train.huggingface.transformers`` with the real
libraries (``scripts/integrations-env.sh``: lightning 2.6.6, transformers 5.25.0) and 2 gloo
workers.

Ray's own examples from its docs ("Get started with PyTorch Lightning", "Get started with
Hugging Face Transformers"), shrunk to tiny models built from configs and synthetic data (and
seeded), are kept here in Ray's form (``import ray.train...``) and run with only ``ray.train``
replaced by ``trainyard.train``. The expected values were measured by running the very same
text, unchanged, on Ray 2.60 (``ray[train]==2.60.0``, this machine): losses and weights agree
to float precision, because both run the same seeded gloo DDP. Nothing is downloaded
(``HF_HUB_OFFLINE=1``).

Without the libraries the tests skip, saying why; under ``CI=true`` they fail instead, unless
CI said why (``TRAINYARD_INTEGRATIONS_SKIP``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

LIGHTNING_EXAMPLE = textwrap.dedent(
    """
    import json
    import os
    import sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import lightning.pytorch as pl

    import ray.train.lightning
    from ray.train.torch import TorchTrainer


    # Model, Loss, Optimizer
    class ImageClassifier(pl.LightningModule):
        def __init__(self):
            super(ImageClassifier, self).__init__()
            self.model = torch.nn.Sequential(
                torch.nn.Flatten(),
                torch.nn.Linear(64, 16),
                torch.nn.ReLU(),
                torch.nn.Linear(16, 10),
            )
            self.criterion = torch.nn.CrossEntropyLoss()

        def forward(self, x):
            return self.model(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            outputs = self.forward(x)
            loss = self.criterion(outputs, y)
            self.log("loss", loss, on_step=True, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.model.parameters(), lr=0.001)


    def train_func():
        # Data
        torch.manual_seed(0)
        images = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(1))
        labels = torch.arange(64) % 10
        train_dataloader = DataLoader(TensorDataset(images, labels), batch_size=8, shuffle=True)

        # Training
        model = ImageClassifier()
        # [1] Configure PyTorch Lightning Trainer.
        trainer = pl.Trainer(
            max_epochs=2,
            devices="auto",
            accelerator="auto",
            strategy=ray.train.lightning.RayDDPStrategy(),
            plugins=[ray.train.lightning.RayLightningEnvironment()],
            callbacks=[ray.train.lightning.RayTrainReportCallback()],
            # [1a] Optionally, disable the default checkpointing behavior
            # in favor of the `RayTrainReportCallback` above.
            enable_checkpointing=False,
            enable_progress_bar=False,
            logger=False,
        )
        trainer = ray.train.lightning.prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=train_dataloader)
        env = trainer.strategy.cluster_environment
        return {
            "environment": [env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()],
            "sampler": type(trainer.train_dataloader.sampler).__name__,
            "root_device": str(trainer.strategy.root_device),
            "sampler_kwargs": trainer.strategy.distributed_sampler_kwargs,
        }


    # [2] Configure scaling and resource requirements.
    scaling_config = ray.train.ScalingConfig(num_workers=2, use_gpu=False)

    # [3] Launch distributed training job.
    trainer = TorchTrainer(
        train_func,
        scaling_config=scaling_config,
        run_config=ray.train.RunConfig(storage_path=sys.argv[1]),
    )
    result: ray.train.Result = trainer.fit()

    # [4] Load the trained model.
    with result.checkpoint.as_directory() as checkpoint_dir:
        model = ImageClassifier.load_from_checkpoint(
            os.path.join(
                checkpoint_dir,
                ray.train.lightning.RayTrainReportCallback.CHECKPOINT_NAME,
            ),
        )
        files = sorted(os.listdir(checkpoint_dir))
        saved = torch.load(os.path.join(checkpoint_dir, files[0]), weights_only=False)

    print("RESULT " + json.dumps({
        "metrics": result.metrics,
        "best": [m for _, m in result.best_checkpoints],
        "files": files,
        "saved": sorted(saved),
        "saved_at": [saved["epoch"], saved["global_step"]],
        "weights": model.model[3].bias.detach().tolist(),
        "return": result.return_value,
    }))
    """
)

TRANSFORMERS_EXAMPLE = textwrap.dedent(
    """
    import json
    import os
    import sys

    import numpy as np
    import torch
    from transformers import (
        BertConfig, AutoModelForSequenceClassification, TrainingArguments, Trainer
    )

    import ray.train.huggingface.transformers
    from ray.train import ScalingConfig, RunConfig
    from ray.train.torch import TorchTrainer


    # [1] Encapsulate data preprocessing, training, and evaluation
    # logic in a training function
    # ============================================================
    def train_func():
        # Datasets
        ids = torch.randint(0, 32, (32, 8), generator=torch.Generator().manual_seed(1))
        dataset = [
            {"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": int(ids[i][0] % 5)}
            for i in range(32)
        ]
        small_train_dataset = dataset
        small_eval_dataset = dataset[:8]

        # Model
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(
            BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32, max_position_embeddings=16, num_labels=5)
        )

        # Evaluation Metrics
        def compute_metrics(eval_pred):
            logits, labels = eval_pred
            predictions = np.argmax(logits, axis=-1)
            return {"accuracy": float((predictions == labels).mean())}

        # Hugging Face Trainer
        training_args = TrainingArguments(
            output_dir="test_trainer",
            eval_strategy="epoch",
            save_strategy="epoch",
            logging_strategy="epoch",
            report_to="none",
            num_train_epochs=2,
            per_device_train_batch_size=4,
            per_device_eval_batch_size=4,
            learning_rate=1e-3,
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )

        trainer = Trainer(
            model=model,
            args=training_args,
            train_dataset=small_train_dataset,
            eval_dataset=small_eval_dataset,
            compute_metrics=compute_metrics,
        )

        # [2] Report Metrics and Checkpoints to Ray Train
        # ===============================================
        callback = ray.train.huggingface.transformers.RayTrainReportCallback()
        trainer.add_callback(callback)

        # [3] Prepare Transformers Trainer
        # ================================
        trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)

        # Start Training
        trainer.train()
        return {
            "class": [c.__name__ for c in type(trainer).__mro__[:2]],
            "world": [trainer.args.world_size, trainer.args.process_index],
            "parallel": str(trainer.args.parallel_mode),
        }


    # [4] Define a Ray TorchTrainer to launch `train_func` on all workers
    # ===================================================================
    ray_trainer = TorchTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=sys.argv[1]),
    )
    result: ray.train.Result = ray_trainer.fit()

    # [5] Load the trained model.
    with result.checkpoint.as_directory() as checkpoint_dir:
        checkpoint_path = os.path.join(
            checkpoint_dir,
            ray.train.huggingface.transformers.RayTrainReportCallback.CHECKPOINT_NAME,
        )
        model = AutoModelForSequenceClassification.from_pretrained(checkpoint_path)
        files = {name: sorted(os.listdir(os.path.join(checkpoint_dir, name)))
                 for name in os.listdir(checkpoint_dir)}

    timings = ("runtime", "per_second")
    print("RESULT " + json.dumps({
        "metrics": {k: v for k, v in result.metrics.items() if not any(t in k for t in timings)},
        "keys": sorted(result.metrics),
        "best": [[m["epoch"], m["step"], m["eval_loss"]] for _, m in result.best_checkpoints],
        "files": files,
        "bias": model.classifier.bias.detach().tolist(),
        "return": result.return_value,
    }))
    """
)


def _needs_integrations() -> None:
    missing = [
        m
        for m in ("lightning", "transformers", "accelerate")
        if importlib.util.find_spec(m) is None
    ]
    if not missing:
        return
    reason = os.environ.get("TRAINYARD_INTEGRATIONS_SKIP")
    if os.environ.get("CI") == "true" and not reason:
        pytest.fail(
            f"{', '.join(missing)} not installed, and CI did not say why "
            "(TRAINYARD_INTEGRATIONS_SKIP)"
        )
    pytest.skip(reason or f"{', '.join(missing)} not installed: bash scripts/integrations-env.sh")


def _run_example(example: str, tmp_path, storage: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """``example`` with ``ray.train`` replaced by ``trainyard.train`` (and nothing else), run
    as a script from ``tmp_path``; what it printed after ``RESULT``."""
    _needs_integrations()
    ported = example.replace("ray.train", "trainyard.train")
    assert not re.search(r"\b(import|from) ray\b|\bray\.", ported), "Ray is still used"
    script = tmp_path / "example.py"
    script.write_text(ported, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, os.fspath(script), storage],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    line = next(out for out in done.stdout.splitlines() if out.startswith("RESULT "))
    return dict(json.loads(line[len("RESULT ") :]))


def _close(got, want, tolerance: float = 1e-5) -> bool:  # type: ignore[no-untyped-def]
    if isinstance(want, float):
        return abs(got - want) <= tolerance * max(1.0, abs(want))
    if isinstance(want, list):
        return len(got) == len(want) and all(_close(g, w, tolerance) for g, w in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(
            _close(got[k], w, tolerance) for k, w in want.items()
        )
    return bool(got == want)


def test_rays_lightning_example_runs_with_the_import_changed_and_gives_rays_values(
    tmp_path, storage
) -> None:
    got = _run_example(LIGHTNING_EXAMPLE, tmp_path, storage)
    # Measured on Ray 2.60 with the same text (ray.train): one report per epoch with
    # callback_metrics + epoch + step; checkpoint.ckpt holds Lightning's whole checkpoint.
    assert _close(got["metrics"], {"loss": 2.483180046081543, "epoch": 1, "step": 8}), got
    assert _close(
        got["best"],
        [
            {"loss": 2.3123106956481934, "epoch": 0, "step": 4},
            {"loss": 2.483180046081543, "epoch": 1, "step": 8},
        ],
    ), got
    assert got["files"] == ["checkpoint.ckpt"]
    assert got["saved"] == [
        "callbacks",
        "epoch",
        "global_step",
        "loops",
        "lr_schedulers",
        "optimizer_states",
        "pytorch-lightning_version",
        "state_dict",
    ]
    assert got["saved_at"] == [1, 8]
    assert _close(got["weights"], RAY_LIGHTNING_BIAS), got["weights"]
    assert got["return"] == {
        "environment": [2, 0, 0, 0],
        "sampler": "DistributedSampler",
        "root_device": "cpu",
        "sampler_kwargs": {"num_replicas": 2, "rank": 0},
    }


def test_rays_transformers_example_runs_with_the_import_changed_and_gives_rays_values(
    tmp_path, storage
) -> None:
    got = _run_example(TRANSFORMERS_EXAMPLE, tmp_path, storage)
    # Measured on Ray 2.60 with the same text: the metrics are every log_history entry
    # merged, reported at each save (each epoch); the checkpoint is the Trainer's latest,
    # under checkpoint/, with each rank's RNG state.
    assert _close(got["metrics"], RAY_TRANSFORMERS_METRICS), got["metrics"]
    assert got["keys"] == sorted(
        list(RAY_TRANSFORMERS_METRICS)
        + ["eval_runtime", "eval_samples_per_second", "eval_steps_per_second"]
    )
    assert _close(got["best"], RAY_TRANSFORMERS_BEST), got["best"]
    assert got["files"] == {
        "checkpoint": [
            "config.json",
            "model.safetensors",
            "optimizer.pt",
            "rng_state_0.pth",
            "rng_state_1.pth",
            "scheduler.pt",
            "trainer_state.json",
            "training_args.bin",
        ]
    }
    assert _close(got["bias"], RAY_TRANSFORMERS_BIAS), got["bias"]
    assert got["return"] == {
        "class": ["RayTransformersTrainer", "Trainer"],
        "world": [2, 0],
        "parallel": "ParallelMode.DISTRIBUTED",
    }


def lightning_refusals():  # type: ignore[no-untyped-def]
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from trainyard.train import lightning as tl

    said = {}
    for name, make in (
        (
            "strategy",
            lambda: pl.Trainer(strategy="ddp", accelerator="cpu", devices=1, logger=False),
        ),
        (
            "environment",
            lambda: pl.Trainer(
                strategy=tl.RayDDPStrategy(),
                plugins=[LightningEnvironment()],
                accelerator="cpu",
                devices=1,
                logger=False,
            ),
        ),
    ):
        try:
            tl.prepare_trainer(make())
        except RuntimeError as error:
            said[name] = str(error)
    try:
        tl.RayDeepSpeedStrategy()
    except Exception as error:  # noqa: BLE001 - its type is what is checked
        said["deepspeed"] = [f"{type(error).__module__}.{type(error).__name__}", str(error)]
    return said


def test_lightning_refusals_are_rays(storage) -> None:
    _needs_integrations()
    from trainyard.train import RunConfig, ScalingConfig
    from trainyard.train.torch import TorchTrainer

    said = (
        TorchTrainer(
            lightning_refusals,
            scaling_config=ScalingConfig(num_workers=1),
            run_config=RunConfig(storage_path=storage),
        )
        .fit()
        .return_value
    )
    # Measured on Ray 2.60 (its texts name ray.train where these name trainyard.train).
    assert said["strategy"] == (
        "Invalid strategy class: <class 'lightning.pytorch.strategies.ddp.DDPStrategy'>. To "
        "use PyTorch Lightning with trainyard, the strategy object should be one of "
        "['RayDDPStrategy', 'RayFSDPStrategy', 'RayDeepSpeedStrategy'] class or its subclass."
    )
    assert said["environment"] == (
        "Invalid cluster environment plugin. The expected class is"
        "`trainyard.train.lightning.RayLightningEnvironment` but got "
        "<class 'lightning.fabric.plugins.environments.lightning.LightningEnvironment'>!"
    )
    # DeepSpeed is not installed here: Lightning's own error says how to get it.
    assert said["deepspeed"] == [
        "lightning.fabric.utilities.exceptions.MisconfigurationException",
        "To use the `DeepSpeedStrategy`, you must have DeepSpeed installed. Install it by "
        "running `pip install -U deepspeed`.",
    ]


def fsdp_loop():  # type: ignore[no-untyped-def]
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainyard.train import lightning as tl

    class Tiny(pl.LightningModule):
        def __init__(self):  # type: ignore[no-untyped-def]
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):  # type: ignore[no-untyped-def]
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    strategy = tl.RayFSDPStrategy()
    assert isinstance(strategy, pl.strategies.FSDPStrategy)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        strategy=strategy,
        plugins=[tl.RayLightningEnvironment()],
        enable_checkpointing=False,
        logger=False,
    )
    tl.prepare_trainer(trainer).fit(
        Tiny(), DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    )


def test_fsdp_on_cpu_workers_fails_as_on_ray(storage) -> None:
    _needs_integrations()
    from trainyard.train import RunConfig, ScalingConfig, WorkerGroupError
    from trainyard.train.torch import TorchTrainer

    with pytest.raises(WorkerGroupError) as caught:
        TorchTrainer(
            fsdp_loop,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=storage),
        ).fit()
    # Measured on Ray 2.60: torch's FSDP refuses CPU-only workers in the same words.
    assert "FSDP needs a non-CPU accelerator device, but no accelerator device is detected." in str(
        caught.value
    )


def test_without_the_libraries_the_imports_fail_as_rays() -> None:
    """``import ...lightning`` names the pip package; ``...huggingface.transformers`` imports
    and ``prepare_trainer`` raises ``transformers``' ImportError (Ray 2.60's behaviour, read
    from its source)."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["lightning"] = None
        sys.modules["pytorch_lightning"] = None
        sys.modules["transformers"] = None
        try:
            import trainyard.train.lightning
        except ModuleNotFoundError as error:
            print("LIGHTNING", error)
        from trainyard.train.huggingface.transformers import prepare_trainer
        try:
            prepare_trainer(object())
        except ImportError as error:
            print("TRANSFORMERS", type(error).__name__)
        import trainyard.train
        print("LIGHT", "torch" not in sys.modules)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "LIGHTNING PyTorch Lightning isn't installed. To install PyTorch Lightning, please run "
        "'pip install lightning'",
        "TRANSFORMERS ModuleNotFoundError",
        "LIGHT True",
    ]


# Values measured on Ray 2.60 with the examples above (see the module's docstring).
RAY_LIGHTNING_BIAS = [
    0.10465048998594284,
    0.22027772665023804,
    0.23028241097927094,
    -0.224306121468544,
    -0.16098055243492126,
    -0.10171756893396378,
    -0.1546812355518341,
    0.23595306277275085,
    -0.021529726684093475,
    -0.16805343329906464,
]
RAY_TRANSFORMERS_METRICS = {
    "loss": 3.2166500091552734,
    "grad_norm": 0.7073134183883667,
    "learning_rate": 0.000125,
    "epoch": 2.0,
    "step": 8,
    "eval_loss": 3.210684299468994,
    "eval_accuracy": 0.5,
}
RAY_TRANSFORMERS_BEST = [[1.0, 4, 3.2142539024353027], [2.0, 8, 3.210684299468994]]
RAY_TRANSFORMERS_BIAS = [
    0.002072416478767991,
    -0.001195174059830606,
    0.0009661611984483898,
    -0.0007887550164014101,
    -0.0007213089847937226,
]
