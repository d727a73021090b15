"""The loop of linear.py as a script for `trainyard run -n 2` (and torchrun): the same work
without TorchTrainer, for `cargo xtask bench-python`'s fit()-against-the-CLI figure."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(1000, 1)
dataset = TensorDataset(x, 2 * x + 1)
data = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset, shuffle=True))
model = DistributedDataParallel(torch.nn.Linear(1, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    data.sampler.set_epoch(epoch)
    for inputs, targets in data:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
