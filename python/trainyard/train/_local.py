"""Ray Train v2's local mode (``ScalingConfig(num_workers=0)``): the training function runs in
the driver's own process, with no worker, no run folder and no ``trainyard`` binary.

Its context is world size 1 and rank 0, unless this process was started with torchrun's
variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``: by ``torchrun`` or ``trainyard run``): then it joins that process group and
takes its ranks, as Ray's local mode does. ``report`` keeps the latest metrics and checkpoint
in this process (nothing is persisted); ``get_checkpoint`` returns the latest reported one;
the ``Result`` holds the latest report's metrics and checkpoint, with ``path`` ``None``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Optional

from trainyard.train._config import RunConfig
from trainyard.train._result import Result

logger = logging.getLogger("trainyard.train")

_TORCHRUN_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class LocalSession:
    """The one training function running in this process: its place in the world and what
    it reported last."""

    def __init__(
        self,
        experiment_name: str,
        world_size: int = 1,
        world_rank: int = 0,
        local_rank: int = 0,
        local_world_size: int = 1,
        node_rank: int = 0,
    ) -> None:
        self.experiment_name = experiment_name
        self.world_size = world_size
        self.world_rank = world_rank
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.node_rank = node_rank
        self.metrics: Optional[Dict[str, Any]] = None
        self.checkpoint: Any = None
        self._lock = threading.Lock()

    def report(self, metrics: Dict[str, Any], checkpoint: Any) -> None:
        with self._lock:
            self.metrics = metrics
            self.checkpoint = checkpoint
        logger.info("Reported metrics: %s", metrics)


_session: Optional[LocalSession] = None


def session() -> Optional[LocalSession]:
    """The local-mode session of this process, or ``None`` outside local mode."""
    return _session


def has_torchrun_env() -> bool:
    """Whether this process was started with torchrun's variables."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def _start(name: str) -> LocalSession:
    if not has_torchrun_env():
        return LocalSession(name)
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "local mode (num_workers=0) joins this process's torchrun process group itself: "
            "torch.distributed is initialized already"
        )
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    return LocalSession(name, world_size, rank, local_rank, per_node, rank // per_node)


def fit(fn: Callable[..., Any], config: Optional[Dict[str, Any]], run_config: RunConfig) -> Result:
    """Runs ``fn`` in this process (see the module); its exception, if it raises, as it is."""
    global _session
    from trainyard._fit import call_loop

    if _session is not None:
        raise RuntimeError("a local-mode training function is running in this process already")
    name = run_config.name or f"trainyard_run-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    _session = _start(name)
    try:
        value = call_loop(fn, config)
        return Result(
            metrics=_session.metrics,
            checkpoint=_session.checkpoint,
            error=None,
            path=None,
            best_checkpoints=None,
            return_value=value,
        )
    finally:
        _session = None
        if has_torchrun_env():
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
