"""The run's event stream as this package understands it: ``trainyard run --log-format json``
writes one JSON object per line, each with ``"event"`` (its kind), ``"v"`` (the version of the
stream's contract) and ``"time"``; ``trainyard._driver`` reads it.

``KINDS`` and ``VERSION`` are the contract's, as the Rust side defines them
(``RunEvent::KINDS`` and ``RUN_EVENTS_VERSION`` in ``crates/backend-executor/src/report.rs``);
a Rust test checks that they are equal, and a Python test that the driver handles every kind.
A stream of a newer version is read as far as it is understood, with one warning; a kind not
listed here (a newer binary's) is passed over.
"""

from __future__ import annotations

from typing import Tuple

# The version of the contract this package reads.
VERSION = 1

# Every event kind, in the contract's order.
KINDS: Tuple[str, ...] = (
    "run_started",
    "placing",
    "placed",
    "attempt_started",
    "task_started",
    "report",
    "log",
    "logs_dropped",
    "resuming",
    "checkpoint_committed",
    "log_files",
    "stacks",
    "resized",
    "restarting",
    "run_succeeded",
    "run_failed",
    "run_interrupted",
)

# The kinds that end a run: exactly one of them is its last event.
ENDS: Tuple[str, ...] = ("run_succeeded", "run_failed", "run_interrupted")
