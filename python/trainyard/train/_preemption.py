"""Pre-emption warnings, as Ray Train v2's ``get_preemption_info``/``PreemptionInfo``.

trainyard can tell a pre-emption is coming where the scheduler warns the workers with a
signal: Slurm's ``--signal=USR1@SECONDS`` (``trainyard run --signal``, ``#SBATCH --signal``,
``scancel --signal=USR1``) reaches every worker's agent, which hands ``SIGUSR1`` on to its
task. A ``TorchTrainer`` worker notes it (instead of dying, SIGUSR1's default); a worker
whose program set a handler of its own keeps that one. Nothing else warns, so elsewhere
``get_preemption_info()`` returns ``None``, as Ray's does while nothing is pre-empted.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

__all__ = ["PreemptionInfo", "get_preemption_info"]


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent pre-emption.

    Attributes:
        deadline_ms: The earliest deadline (Unix time in milliseconds), or ``None`` when the
            warning named none (Slurm's signal does not).
        preempted_node_to_ranks: Each warned node and the world ranks on it.
    """

    deadline_ms: Optional[int]
    preempted_node_to_ranks: Dict[str, List[int]]

    @property
    def preempted_node_ids(self) -> List[str]:
        """The warned nodes, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> List[int]:
        """Every rank on a warned node, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


_lock = threading.Lock()
_warned: List[PreemptionInfo] = []


def _node_id() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _on_warning(signum: int, frame: Any) -> None:
    from trainyard.train._context import get_context

    info = PreemptionInfo(None, {_node_id(): [get_context().get_world_rank()]})
    with _lock:
        _warned[:] = [info]


def listen() -> bool:
    """Notes a ``SIGUSR1`` as a pre-emption warning from now on, unless this process has a
    handler of its own for it; whether it does. Call from the main thread."""
    if signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGUSR1, _on_warning)
    return True


def _merged(infos: List[Optional[PreemptionInfo]]) -> Optional[PreemptionInfo]:
    nodes: Dict[str, List[int]] = {}
    deadlines = []
    for info in infos:
        if info is None:
            continue
        for node, ranks in info.preempted_node_to_ranks.items():
            nodes[node] = sorted(set(nodes.get(node, [])) | set(ranks))
        if info.deadline_ms is not None:
            deadlines.append(info.deadline_ms)
    if not nodes:
        return None
    return PreemptionInfo(min(deadlines) if deadlines else None, nodes)


def get_preemption_info() -> Optional[PreemptionInfo]:
    """The imminent pre-emption of the run's nodes, or ``None`` when none is known.

    As Ray's, every worker must call it the same number of times: the workers agree on one
    answer (every warned node, with its ranks) over the run's process group. The answer is
    ``None`` unless a worker got the scheduler's warning (see the module); in local mode it
    is ``None``, as Ray's.
    """
    from trainyard.train import _local
    from trainyard.train._context import get_context

    if _local.session() is not None:
        return None
    with _lock:
        mine = _warned[0] if _warned else None
    if get_context().get_world_size() <= 1:
        return mine
    try:
        import torch.distributed as dist
    except ImportError:
        return mine
    if not dist.is_available() or not dist.is_initialized():
        return mine
    from trainyard.train.collective import _group

    gathered: List[Optional[PreemptionInfo]] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine, group=_group())
    return _merged(gathered)
