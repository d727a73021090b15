"""The worker side of a trainyard run: report metrics and checkpoints, resume
from the last checkpoint, and learn where this worker stands in the run.

Modelled on Ray Train's worker API::

    import tempfile
    from trainyard import train

    ctx = train.get_context()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = load_state(d) + 1

    for epoch in range(start, epochs):
        loss = train_one_epoch()
        with tempfile.TemporaryDirectory() as d:
            save_state(d, f"shard_{ctx.get_world_rank()}")
            train.report({"epoch": epoch, "loss": loss},
                         checkpoint=train.Checkpoint.from_directory(d))

The N-th ``report`` of every rank belongs to checkpoint ``base + N`` (``base``
is the checkpoint the run resumed from, 0 on a fresh start), with or without a
checkpoint; a checkpoint is committed once every rank has reported its index
and every rank's files are persisted. Each rank should write files of its own
names (a shard each).

Outside trainyard (no ``TRAINYARD_REPORT_ADDR``, e.g. under plain torchrun)
``report`` prints ``trainyard_report: {...}`` to stderr instead, and a
checkpoint handed to it is ignored with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import warnings
from typing import Any, Iterator, Mapping, Optional, Union

from trainyard import _client
from trainyard._client import ReportError

__all__ = [
    "Checkpoint",
    "ReportError",
    "TrainContext",
    "get_checkpoint",
    "get_context",
    "report",
]

CHECKPOINT_ENV = "TRAINYARD_CHECKPOINT"
STDERR_PREFIX = "trainyard_report: "

_print_lock = threading.Lock()


class Checkpoint:
    """A directory of files: handed in with ``report``, or resumed from with
    ``get_checkpoint``.

    ``path`` is the directory's absolute path on this machine.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = os.path.abspath(os.fspath(path))

    @classmethod
    def from_directory(cls, path: Union[str, "os.PathLike[str]"]) -> "Checkpoint":
        """The checkpoint made of the files under ``path``.

        Nothing is read yet: ``report`` has the agent copy the files, and fails
        if ``path`` is not a directory then.
        """
        return cls(path)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A context manager yielding a local directory holding the files.

        The checkpoint is local already: this is its own directory; do not
        change what is in it.
        """
        yield self.path

    def to_directory(self, path: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
        """Copies the files into ``path`` (a new temporary directory when
        ``None``) and returns that directory."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r})"


def report(metrics: Mapping[str, Any], checkpoint: Optional[Checkpoint] = None) -> None:
    """Reports ``metrics`` (a JSON-serialisable mapping) to the driver, with
    the files of ``checkpoint`` if one is given.

    Returns once the agent has persisted the checkpoint's files into the run
    folder and passed the report on, so the directory may be deleted then.
    Safe to call from several threads (reports are sent one at a time).

    Raises ``ReportError`` with the agent's reason when the files cannot be
    persisted (the driver is told, and that checkpoint is never committed),
    ``TypeError`` when ``metrics`` is not a mapping or ``checkpoint`` not a
    ``Checkpoint``, ``ValueError`` when ``metrics`` is not JSON (NaN and
    infinities are not), ``OSError`` when the agent cannot be reached.
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping, got {type(metrics).__name__}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(
            "checkpoint must be a trainyard.train.Checkpoint "
            f"(Checkpoint.from_directory(path)), got {type(checkpoint).__name__}"
        )
    metrics = dict(metrics)
    if _client.address() is None:
        line = json.dumps(metrics, separators=(",", ":"))
        if checkpoint is not None:
            warnings.warn(
                f"not running under trainyard ({_client.ADDR_ENV} is not set): "
                f"the checkpoint at {checkpoint.path} is not persisted",
                RuntimeWarning,
                stacklevel=2,
            )
        with _print_lock:
            # one write() per line, even when stderr is unbuffered
            print(STDERR_PREFIX + line + "\n", end="", file=sys.stderr, flush=True)
        return
    _client.send(metrics, None if checkpoint is None else checkpoint.path)


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this run resumes from (its latest committed one), or
    ``None`` on a fresh start.

    Read from ``TRAINYARD_CHECKPOINT``, a local directory that the agent has
    downloaded already when the run's storage is remote.
    """
    path = os.environ.get(CHECKPOINT_ENV)
    return Checkpoint(path) if path else None


def _env_int(names: "tuple[str, ...]", default: int) -> int:
    """The first of ``names`` set (and not empty) in the environment, as an int."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip() != "":
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer, got {value!r}") from None
    return default


class TrainContext:
    """Where this worker stands in the run, read from its environment: the
    variables trainyard sets, else torchrun's."""

    def get_world_rank(self) -> int:
        """This worker's rank in the run: ``TRAINYARD_WORLD_RANK``, else ``RANK``, else 0."""
        return _env_int(("TRAINYARD_WORLD_RANK", "RANK"), 0)

    def get_local_rank(self) -> int:
        """Its rank on its node: ``TRAINYARD_LOCAL_RANK``, else ``LOCAL_RANK``, else 0."""
        return _env_int(("TRAINYARD_LOCAL_RANK", "LOCAL_RANK"), 0)

    def get_world_size(self) -> int:
        """How many workers the run has: ``TRAINYARD_WORLD_SIZE``, else ``WORLD_SIZE``, else 1."""
        return _env_int(("TRAINYARD_WORLD_SIZE", "WORLD_SIZE"), 1)

    def get_local_world_size(self) -> int:
        """How many workers its node has: ``TRAINYARD_LOCAL_WORLD_SIZE``, else
        ``LOCAL_WORLD_SIZE``, else 1."""
        return _env_int(("TRAINYARD_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"), 1)

    def get_node_rank(self) -> int:
        """Its node's rank: ``TRAINYARD_NODE_RANK``, else ``GROUP_RANK``, else 0."""
        return _env_int(("TRAINYARD_NODE_RANK", "GROUP_RANK"), 0)

    def get_experiment_name(self) -> Optional[str]:
        """The run's name (``TRAINYARD_RUN_NAME``), or ``None`` outside a named run."""
        return os.environ.get("TRAINYARD_RUN_NAME") or None

    def __repr__(self) -> str:
        return (
            f"TrainContext(world_rank={self.get_world_rank()}, "
            f"world_size={self.get_world_size()}, local_rank={self.get_local_rank()}, "
            f"node_rank={self.get_node_rank()})"
        )


def get_context() -> TrainContext:
    """This worker's ``TrainContext``."""
    return TrainContext()
