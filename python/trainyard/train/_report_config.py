"""How ``report`` hands in a checkpoint and how ``get_all_reported_checkpoints`` reads them,
as Ray Train v2's ``ray.train.v2.api.report_config``."""

from __future__ import annotations

import enum

__all__ = ["CheckpointConsistencyMode", "CheckpointUploadMode"]


class CheckpointUploadMode(enum.Enum):
    """How ``report`` hands in a checkpoint.

    ``SYNC``: ``report`` returns once the files are persisted. ``ASYNC``: ``report``
    returns once the agent has taken the directory, and the agent persists it in the
    background (the report reaches the driver, in order with the others, when it is;
    the checkpoint commits when every rank's part is persisted). Taken means renamed
    away (the directory is gone then), or, with
    ``delete_local_checkpoint_after_upload=False``, its files hard-linked: replace a
    file (write a new one and rename it over) rather than write it again in place until
    it is persisted, which is known once two more ``ASYNC`` reports with a checkpoint
    have returned. At
    most two are on their way per rank; the next ``ASYNC`` report with a checkpoint
    waits for room. A rank that dies after ``report`` returned still has its files
    persisted. ``NO_UPLOAD``: the rank wrote the checkpoint into the run folder itself
    (to ``get_context().get_storage().build_checkpoint_path_from_name(name)``, with
    ``torch.distributed.checkpoint``, say): it is registered where it is, nothing is
    copied or deleted, and ``report`` returns once the report has gone on to the
    driver. Every rank that reports a checkpoint for the same step must name the same
    folder; a folder outside the run folder is refused (``ReportError``).
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Whether ``report`` takes the directory away by default: with ``ASYNC`` only."""
        return self == CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(enum.Enum):
    """What ``get_all_reported_checkpoints`` waits for during a run.

    ``COMMITTED``: until the round of this worker's latest ``report`` is in (every rank has
    made it) and its checkpoint, if it has one, is committed. ``VALIDATED``: that, and until
    no checkpoint's validation is pending.
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"
