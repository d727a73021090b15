"""One 2-worker TorchTrainer program for `cargo xtask bench-python`, run unchanged on Ray Train
and on trainyard: `python linear.py ray|trainyard STORAGE`. Only the import differs, as for a
user who moves a Ray Train program over. The loop is Ray's torch_linear_example in small: a
linear model, DDP through prepare_model and prepare_data_loader, a report per epoch."""

import sys

if sys.argv[1] == "ray":
    from ray import train
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
else:
    from trainyard import train
    from trainyard.train import RunConfig, ScalingConfig
    from trainyard.train.torch import TorchTrainer, prepare_data_loader, prepare_model


def loop(config):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(config["samples"], 1)
    data = DataLoader(TensorDataset(x, 2 * x + 1), batch_size=32, shuffle=True)
    data = prepare_data_loader(data)
    model = prepare_model(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(config["epochs"]):
        for inputs, targets in data:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        train.report({"epoch": epoch, "loss": loss.item()})


if __name__ == "__main__":
    result = TorchTrainer(
        loop,
        train_loop_config={"samples": 1000, "epochs": 3},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="linear", storage_path=sys.argv[2]),
    ).fit()
    assert result.error is None, result.error
