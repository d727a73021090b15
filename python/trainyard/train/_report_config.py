"""How ``report`` hands in a checkpoint and how ``get_all_reported_checkpoints`` reads them,
as Ray Train v2's ``ray.train.v2.api.report_config``."""

from __future__ import annotations

import enum

__all__ = ["CheckpointConsistencyMode", "CheckpointUploadMode"]


class CheckpointUploadMode(enum.Enum):
    """How ``report`` hands in a checkpoint.

    ``SYNC``: ``report`` returns once the files are persisted. ``ASYNC``: ``report``
    returns once the report is on its way to the rank's agent, without waiting for it (as
    Ray's, whose upload reads the directory after ``report`` returned): the agent takes the
    directory when it reads the report, moments later, and persists it in the background
    (the report reaches the driver, in order with the others, when it is; the checkpoint
    commits when every rank's part is persisted). Write each checkpoint to a new directory
    (``tempfile.mkdtemp()``) and leave it alone once reported. Taken means renamed away
    (the directory is gone then), or, with ``delete_local_checkpoint_after_upload=False``,
    its files hard-linked: replace a file (write a new one and rename it over) rather than
    write it again in place until it is persisted, which is known once three more ``ASYNC``
    reports with a checkpoint have returned. What a hand-in fails with is raised by the
    rank's next ``report``, by ``get_all_reported_checkpoints``, or at the loop function's
    end (which waits for the reports on their way). Per rank the agent persists at most two
    at once and one more may wait for it; the next ``ASYNC`` report waits for room. A rank
    that dies after ``report`` returned still has its files persisted (the agent has its
    report).
    ``NO_UPLOAD``: the rank wrote the checkpoint into the run folder itself
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
