"""trainyard's Python side: Ray Train's API on trainyard's engine.

``trainyard.train`` mirrors ``ray.train`` (v2) name for name and
``trainyard.train.torch`` mirrors ``ray.train.torch``: a Ray Train program runs
with ``ray.train`` replaced by ``trainyard.train``. ``pip install .`` at the
repository root installs this package with the ``trainyard`` binary (CLI and
worker agent) that runs it.

Scripts that ``trainyard run`` starts use the worker side of ``trainyard.train``
(``report``, ``Checkpoint``, ``get_checkpoint``, ``get_context``): a binary built
from source puts the copy it carries on their ``PYTHONPATH``; one installed from
the wheel leaves them the installed package, the same version.
"""

from trainyard import train

__all__ = ["train"]
__version__ = "0.2.0"
