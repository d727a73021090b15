"""Where the ``trainyard`` binary is: the one this package was installed with.

``TRAINYARD_BIN`` names it when set (a binary built from source, say). Otherwise it is the
one the wheel put in the environment's scripts folder (``bin/`` of a virtual environment,
``~/.local/bin`` for ``pip install --user``), beside the interpreter that installed it, so
that the driver and its package are one version; else the one on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from typing import List

__all__ = ["find_trainyard_bin"]

BIN_ENV = "TRAINYARD_BIN"


def _scripts_dirs() -> List[str]:
    """The scripts folders of the install schemes this interpreter knows, likeliest first."""
    dirs = [sysconfig.get_path("scripts")]
    user_scheme = {"posix": "posix_user", "nt": "nt_user"}.get(os.name)
    if user_scheme is not None:
        try:
            dirs.append(sysconfig.get_path("scripts", scheme=user_scheme))
        except KeyError:
            pass
    # A venv's interpreter is in its scripts folder already; a base interpreter's may not be.
    dirs.append(os.path.dirname(sys.executable))
    seen: List[str] = []
    for d in dirs:
        if d and d not in seen:
            seen.append(d)
    return seen


def find_trainyard_bin() -> str:
    """The path of the ``trainyard`` binary.

    Raises ``FileNotFoundError`` naming where it looked when there is none.
    """
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return os.path.abspath(explicit)
        raise FileNotFoundError(f"{BIN_ENV}={explicit} is not an executable file")
    name = "trainyard.exe" if os.name == "nt" else "trainyard"
    for d in _scripts_dirs():
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        "the trainyard binary was not found in "
        + ", ".join(_scripts_dirs())
        + f" nor on PATH: install the wheel (pip install trainyard), or set {BIN_ENV}"
    )
