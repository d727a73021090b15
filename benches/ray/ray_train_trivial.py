"""The same trivial 2-worker job with Ray Train's own TorchTrainer, on the cluster at
sys.argv[1]: Ray Train sets up the gloo process group; each worker all-reduces once."""

import sys

import ray
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def loop(config):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    assert t.item() == 3.0, t


ray.init(address=sys.argv[1], log_to_driver=False)
trainer = TorchTrainer(
    loop,
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
    run_config=RunConfig(storage_path=sys.argv[2]),
)
trainer.fit()
