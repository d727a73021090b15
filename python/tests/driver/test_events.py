"""The event stream's contract on the Python side: the driver has a handler for every event
kind ``trainyard._events`` lists (a Rust test, ``crates/backend-executor/tests/it/
python_events.rs``, checks that the list is the stream's own), passes over kinds it does not
know, and warns once when the stream is of a newer version than it reads."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List

import pytest

from trainyard import _driver, _events
from trainyard.train import UserCallback

# One event of each kind, as `trainyard run --log-format json` writes it (version 1).
SAMPLES: Dict[str, Dict[str, Any]] = {
    "run_started": {"name": "demo", "run_dir": "/runs/demo", "params": {}},
    "placing": {"restart_count": 0, "bundles": 2, "requested": {"CPU": 2}},
    "placed": {"bundle_nodes": ["local-0", "local-0"]},
    "attempt_started": {"restart_count": 0, "world_size": 2, "workers": []},
    "task_started": {"rank": 0, "pid": 10},
    "report": {
        "rank": 0,
        "metrics": {"loss": 1.0},
        "step": 1,
        "attempt": 0,
        "time": 1.0,
        "checkpoint": True,
    },
    "log": {"rank": 1, "pid": 11, "stream": "stdout", "line": "hello"},
    "logs_dropped": {"rank": 1, "count": 3},
    "resuming": {"restart_count": 1, "checkpoint": {"index": 1, "path": "/c", "metrics": {}}},
    "checkpoint_committed": {"checkpoint": {"index": 1, "path": "/c1", "metrics": {"a": 1}}},
    "log_files": {"restart_count": 0, "dir": "/runs/demo/logs/attempt_0"},
    "stacks": {"reason": "requested", "ranks": []},
    "resized": {"restart_count": 1, "from": 2, "to": 1, "reason": "lost"},
    "restarting": {
        "restart_count": 0,
        "failure": {"kind": "worker_died", "rank": 1, "cause": "killed"},
        "backoff_ms": 1000,
    },
    "run_succeeded": {"attempts": 1, "failures": [], "metrics": [], "returns": []},
    "run_failed": {"error": "the training run failed", "report": None},
    "run_interrupted": {"stopped": True, "report": None},
}


def _event(kind: str, v: int = _events.VERSION) -> Dict[str, Any]:
    return {"event": kind, "v": v, "time": 1.0, **SAMPLES[kind]}


class Rounds(UserCallback):
    def __init__(self) -> None:
        self.seen: List[Any] = []

    def after_report(self, run_context, metrics, checkpoint):  # type: ignore[no-untyped-def]
        self.seen.append((metrics, None if checkpoint is None else checkpoint.path))

    def after_exception(self, run_context, worker_exceptions):  # type: ignore[no-untyped-def]
        self.seen.append({r: str(e) for r, e in worker_exceptions.items()})


def test_the_driver_handles_every_kind_of_the_contract() -> None:
    assert set(SAMPLES) == set(_events.KINDS)
    reader = _driver._Events()
    assert reader.handled_kinds() == sorted(_events.KINDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in _events.KINDS:
            reader.take(_event(kind))
    assert reader.run_dir == "/runs/demo"
    assert [c["index"] for c in reader.committed] == [1]
    assert reader.end is not None and reader.end["event"] == "run_interrupted"


def test_a_round_with_a_checkpoint_waits_for_its_commit_and_one_without_does_not() -> None:
    callback = Rounds()
    reader = _driver._Events(callbacks=[callback])
    reader.take(_event("attempt_started"))
    # Rank 0 hands in a checkpoint, rank 1 does not (Ray's usual rank-0 checkpoint).
    for rank in (0, 1):
        reader.take(
            {**_event("report"), "rank": rank, "metrics": {"r": rank}, "checkpoint": rank == 0}
        )
    assert callback.seen == []
    # Its commit comes next: the round gets it.
    reader.take(_event("checkpoint_committed"))
    assert callback.seen == [([{"r": 0}, {"r": 1}], "/c1")]
    # No rank hands in a checkpoint: the round is told as soon as it is complete.
    for rank in (1, 0):
        report = {"rank": rank, "step": 2, "metrics": {"r": rank}, "checkpoint": False}
        reader.take({**_event("report"), **report})
    assert callback.seen == [([{"r": 0}, {"r": 1}], "/c1"), ([{"r": 0}, {"r": 1}], None)]
    # A failed attempt names its rank (no fit folder here: the driver's account of it).
    reader.take(_event("restarting"))
    assert callback.seen[-1] == {1: "rank 1 failed: worker_died (killed)"}


def test_kinds_it_does_not_know_are_passed_over_and_a_newer_version_warns_once() -> None:
    reader = _driver._Events()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reader.take({"event": "something_new", "v": _events.VERSION, "detail": 1})
    newer = _events.VERSION + 1
    with pytest.warns(RuntimeWarning, match=f"version {newer} of the run's event stream") as said:
        reader.take(_event("run_started", v=newer))
        reader.take(_event("attempt_started", v=newer))
        reader.take({"event": "something_newer", "v": newer})
    assert len(said) == 1
    assert reader.run_dir == "/runs/demo" and reader.world_size == 2
