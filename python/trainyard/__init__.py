"""trainyard's Python side, for the scripts that ``trainyard run`` starts.

Standard library only. ``from trainyard import train`` gives Ray Train's worker
API: ``train.report(metrics, checkpoint=None)``, ``train.Checkpoint``,
``train.get_checkpoint()`` and ``train.get_context()``. A script started by
trainyard can import it with nothing installed: the agent puts the copy it
carries on ``PYTHONPATH``. Elsewhere, ``pip install .`` at the repository root.
"""

from trainyard import train

__all__ = ["train"]
__version__ = "0.1.0"
