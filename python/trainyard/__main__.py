"""``python -m trainyard ARGS`` runs the ``trainyard`` binary with ``ARGS``."""

from __future__ import annotations

import os
import sys

from trainyard._find_trainyard import find_trainyard_bin


def _main() -> None:
    binary = find_trainyard_bin()
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    _main()
