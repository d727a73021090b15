"""Collective operations among the workers of a run, as ``ray.train.collective``.

Every rank must call them, in the same order. They go through the run's
``torch.distributed`` process group (which ``TorchTrainer`` sets up before the loop
function starts), on a CPU (gloo) group of their own when that one is NCCL's; torch is
imported only when they are called.
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar

__all__ = ["barrier", "broadcast_from_rank_zero"]

T = TypeVar("T")

_cpu_group: Optional[Any] = None


def _group() -> Any:
    """The process group for objects: the default one, or a gloo one beside NCCL's."""
    global _cpu_group
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "trainyard.train.collective needs the run's process group: call it inside a "
            "TorchTrainer's loop function (or after torch.distributed.init_process_group)"
        )
    if dist.get_backend() == "gloo":
        return None
    if _cpu_group is None:
        _cpu_group = dist.new_group(backend="gloo")
    return _cpu_group


def _world_size() -> int:
    from trainyard.train._context import get_context

    return get_context().get_world_size()


def barrier() -> None:
    """Waits until every rank has called ``barrier``."""
    if _world_size() == 1:
        return
    import torch.distributed as dist

    dist.barrier(group=_group())


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank (any picklable object; the others' ``data`` is
    ignored)."""
    if _world_size() == 1:
        return data
    import torch.distributed as dist

    objects = [data]
    dist.broadcast_object_list(objects, src=0, group=_group())
    return objects[0]
