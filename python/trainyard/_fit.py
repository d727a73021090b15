"""What the driver and the workers of one ``TorchTrainer.fit()`` share: the fit's scratch
folder (``FIT_DIR``) and how a loop function is called.

The driver (``trainyard._driver``) writes into ``FIT_DIR``:

- ``loop.pkl``: the loop function and its config, cloudpickled;
- ``spec.json``: its Python version, working directory, ``sys.path``, the process-group
  settings, the checkpoint to start from, whether the trainer validates checkpoints and how
  checkpoints are scored;
- ``validation.pkl``: the ``ValidationConfig``, cloudpickled, when the trainer has one;
- ``progress.json``, replaced as the run goes: the attempt (its restart count), the last
  report round every rank of it has made, and each checkpoint's validation (its status and
  metrics).

The workers (``trainyard._worker``) leave in it: rank 0 its return value (``return.pkl``);
a rank that raises, its exception (``errors/attempt_<restart count>_rank_<rank>.pkl``);
and, before each report that hands in a checkpoint and asks for its validation, a note of
it (``notes/<index>_<rank>.json``: the validation it asks for), read when the checkpoint
commits. (That a round has a checkpoint, the driver learns from the report events.)

A worker finds the folder in ``TRAINYARD_FIT_DIR``; a program that ``trainyard run`` starts
has none.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from typing import Any, Callable, Dict, Optional

SPEC = "spec.json"
LOOP = "loop.pkl"
RETURN = "return.pkl"
ERRORS = "errors"
VALIDATION = "validation.pkl"
PROGRESS = "progress.json"
NOTES = "notes"

# Where a worker finds the fit's folder.
FIT_DIR_ENV = "TRAINYARD_FIT_DIR"
# The index a task's reports count from: its N-th report belongs to checkpoint BASE + N.
CHECKPOINT_BASE_ENV = "TRAINYARD_CHECKPOINT_BASE"
# Restarts before this worker's attempt.
RESTART_COUNT_ENV = "TRAINYARD_RESTART_COUNT"
# On the driver: `0` has every restarted rank start as a new process (see trainyard._worker).
IN_PLACE_VAR = "TRAINYARD_RESTART_IN_PLACE"


def fit_dir() -> Optional[str]:
    """This worker's fit folder, or ``None`` outside a ``TorchTrainer``'s workers."""
    return os.environ.get(FIT_DIR_ENV) or None


def error_file(fit_dir: str, restart_count: int, rank: int) -> str:
    """Where rank ``rank`` of the attempt after ``restart_count`` restarts leaves its error."""
    return os.path.join(fit_dir, ERRORS, f"attempt_{restart_count}_rank_{rank}.pkl")


def note_file(fit_dir: str, index: int, rank: int) -> str:
    """Where rank ``rank`` notes the checkpoint it hands in with report ``index``."""
    return os.path.join(fit_dir, NOTES, f"{index}_{rank}.json")


def write_atomically(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that a reader sees the old file or the new one whole."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_spec(fit_dir: str) -> Dict[str, Any]:
    """The driver's ``spec.json``."""
    with open(os.path.join(fit_dir, SPEC), encoding="utf-8") as f:
        return dict(json.load(f))


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``, or ``None`` when there is none (yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def take_driver_paths(spec: Dict[str, Any]) -> None:
    """The driver's working directory, and its ``sys.path`` before this process's own."""
    import sys

    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    ours = list(sys.path)
    sys.path[:] = [p for p in spec["sys_path"] if p not in ours] + ours


def call_loop(fn: Callable[..., Any], config: Optional[Dict[str, Any]]) -> Any:
    """``fn(config)`` or ``fn()``, as Ray calls a loop function by its parameters."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(config if config is not None else {})
    if len(parameters) == 0:
        return fn()
    return fn(config if config is not None else {})


def wait_for(predicate: Callable[[], bool], timeout_s: Optional[float]) -> bool:
    """Polls ``predicate`` (every 10 ms at first, backing off to 200 ms) until it holds or
    ``timeout_s`` seconds have passed (``None``: for ever); whether it held."""
    deadline = None if timeout_s is None else time.monotonic() + max(0.0, timeout_s)
    pause = 0.01
    while True:
        if predicate():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        left = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
        time.sleep(left)
        pause = min(pause * 1.5, 0.2)
