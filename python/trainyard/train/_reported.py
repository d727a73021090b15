"""``get_all_reported_checkpoints``: the run's committed checkpoints, read by a worker during
the run, as Ray Train v2's.

Where they come from: the run's own record (``run.json``), read through the CLI's read side
of runs (``trainyard show NAME --storage S --format json``, with its trust checks), so a
worker sees exactly the checkpoints the run keeps, with the metrics rank 0 reported with
them. What it waits for comes from the driver of a ``TorchTrainer`` (``progress.json`` in the
fit's folder, see ``trainyard._fit``): the last report round every rank has made, and each
checkpoint's validation, whose status and metrics are merged in. A program that ``trainyard
run`` starts has no such driver: it gets the record as it is, without waiting.
"""

from __future__ import annotations

import enum
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from trainyard import _fit
from trainyard.train._checkpoint import Checkpoint
from trainyard.train._context import RUN_DIR_ENV
from trainyard.train._report_config import CheckpointConsistencyMode

__all__ = ["ReportedCheckpoint", "ReportedCheckpointStatus", "get_all_reported_checkpoints"]


class ReportedCheckpointStatus(enum.Enum):
    """Where a reported checkpoint stands.

    * ``COMMITTED``: saved, and no validation was asked for.
    * ``PENDING_VALIDATION``: saved, and its validation is queued or running.
    * ``VALIDATED``: saved and validated; its metrics hold the validation's.
    * ``VALIDATION_TIMEOUT``: saved; its validation ran past ``ValidationTaskConfig.timeout_s``.
    * ``VALIDATION_FAILED``: saved; its validation raised or returned no dict.
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclass
class ReportedCheckpoint:
    """A reported checkpoint and its metrics.

    Attributes:
        checkpoint: The checkpoint, in the run folder.
        metrics: Rank 0's metrics reported with it (merged with its validation's once
            validated).
        status: Where it stands.
    """

    checkpoint: Checkpoint
    metrics: Dict[str, Any]
    status: ReportedCheckpointStatus


class _Reports:
    """This worker's reports so far: the index each one got (the N-th report of a task is
    ``TRAINYARD_CHECKPOINT_BASE + N``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._last: Optional[int] = None

    def _mine(self) -> None:
        # A forked child counts its own reports (it gets its own task's numbering).
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._last = None

    def last(self) -> Optional[int]:
        """The index of this worker's latest report, or ``None`` before its first."""
        with self._lock:
            self._mine()
            return self._last

    def next_index(self) -> int:
        """The index this worker's next report gets."""
        with self._lock:
            self._mine()
            if self._last is not None:
                return self._last + 1
            base = os.environ.get(_fit.CHECKPOINT_BASE_ENV, "").strip()
            return (int(base) if base.isdigit() else 0) + 1

    def took(self, index: int) -> None:
        """The agent counted a report as ``index``."""
        with self._lock:
            self._mine()
            if index >= 0:
                self._last = index


reports = _Reports()


def _progress(fit_dir: str) -> Dict[str, Any]:
    return _fit.read_json(os.path.join(fit_dir, _fit.PROGRESS)) or {}


def _round_is_in(fit_dir: str, attempt: int, index: int, validated: bool) -> bool:
    progress = _progress(fit_dir)
    if progress.get("attempt") != attempt or int(progress.get("step") or 0) < index:
        return False
    if not validated:
        return True
    return all(
        v.get("status") != ReportedCheckpointStatus.PENDING_VALIDATION.value
        for v in (progress.get("validations") or {}).values()
    )


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
    timeout_s: Optional[float] = None,
) -> List[ReportedCheckpoint]:
    """All the checkpoints the run keeps so far, as ``ReportedCheckpoint``s, in Ray's order
    (by ``checkpoint_score_attribute``, worst first, when there is one; else oldest first).

    Waits until every rank has made the report round of this worker's latest ``report``
    (and its checkpoint is committed); with ``CheckpointConsistencyMode.VALIDATED`` (the
    default) also until no validation is pending. After ``timeout_s`` seconds (``None``:
    no limit) it stops waiting and returns what there is, as Ray does.

    In local mode (``ScalingConfig(num_workers=0)``) it returns ``[]``, as Ray's. Raises
    ``ValueError`` for another ``consistency_mode``, ``RuntimeError`` outside a run.
    """
    from trainyard.train import _local

    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise ValueError(f"Unexpected CheckpointConsistencyMode: {consistency_mode}")
    if _local.session() is not None:
        return []
    from trainyard import _client

    if _client.address() is not None:
        # This worker's ASYNC reports on their way go first (their failure is raised here).
        _client.flush()
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        raise RuntimeError(
            "get_all_reported_checkpoints() is called outside a run: it is for the training "
            f"function of a TorchTrainer or a program that trainyard run starts ({RUN_DIR_ENV} "
            "is not set)"
        )
    fit_dir = _fit.fit_dir()
    spec: Dict[str, Any] = {}
    validations: Dict[str, Any] = {}
    if fit_dir is not None:
        spec = _fit.read_spec(fit_dir)
        index = reports.last()
        attempt = int(os.environ.get(_fit.RESTART_COUNT_ENV) or 0)
        validated = consistency_mode is CheckpointConsistencyMode.VALIDATED
        if index is not None:
            _fit.wait_for(lambda: _round_is_in(fit_dir, attempt, index, validated), timeout_s)
        elif validated:
            _fit.wait_for(lambda: _round_is_in(fit_dir, attempt, 0, True), timeout_s)
        validations = dict(_progress(fit_dir).get("validations") or {})
    return _kept(run_dir, validations, spec.get("checkpoint_score"))


def _kept(
    run_dir: str, validations: Dict[str, Any], score: Optional[Dict[str, Any]]
) -> List[ReportedCheckpoint]:
    from trainyard.train._result import _shown, sorted_by_score

    record = _shown(run_dir).get("record") or {}
    found = []
    for entry in sorted(record.get("checkpoints") or [], key=lambda c: c.get("index", 0)):
        validation = validations.get(str(entry.get("index"))) or {}
        status = ReportedCheckpointStatus(
            validation.get("status", ReportedCheckpointStatus.COMMITTED.value)
        )
        metrics = dict(entry.get("metrics") or {})
        if status is ReportedCheckpointStatus.VALIDATED:
            metrics.update(validation.get("metrics") or {})
        path = f"{run_dir.rstrip('/')}/{entry['dir']}"
        found.append(ReportedCheckpoint(Checkpoint(path), metrics, status))
    score = score or {}
    return sorted_by_score(
        found, lambda c: c.metrics, score.get("attribute"), score.get("order", "max")
    )
