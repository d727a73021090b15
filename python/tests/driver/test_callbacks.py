"""``UserCallback`` and ``get_all_reported_checkpoints`` behave as Ray Train 2.60's.

The programs are ``v2_programs.py``'s; the expected values were measured on Ray 2.60
(``ray[train]==2.60.0``, 2 workers, this machine, ``ray.init(num_cpus=4)``) with the same
programs, only the imports changed (see ``v2_programs.py``). Where trainyard differs on
purpose, a comment says so.
"""

from __future__ import annotations

from typing import Any, Dict, List

import v2_programs as programs

from trainyard import _driver, _events


def _round(step: int, checkpoint: Any = None) -> Dict[str, Any]:
    return {
        "hook": "after_report",
        "metrics": [{"step": step, "rank": 0}, {"step": step, "rank": 1}],
        "checkpoint": checkpoint,
        "context": ["TrainRunContext", "callbacks", ["scratch"], 2],
    }


# Ray 2.60, measured: the first attempt's two rounds (round 2 with rank 0's checkpoint), rank
# 1's ValueError, then the second attempt's four rounds.
RAY_CALLS: List[Dict[str, Any]] = [
    _round(1),
    _round(2, {"rank0": "2"}),
    {"hook": "after_exception", "exceptions": {"1": ["ValueError", "bad batch 7"]}},
    _round(1),
    _round(2, {"rank0": "2"}),
    _round(3, {"rank0": "3", "rank1": "3"}),
    _round(4),
]
# Ray 2.60, measured: what each rank's get_all_reported_checkpoints() returned in round 3 of
# the second attempt: the first attempt's checkpoint and the second's two, rank 0's metrics.
RAY_REPORTED = [
    [{"rank0": "2"}, {"step": 2, "rank": 0}, "COMMITTED"],
    [{"rank0": "2"}, {"step": 2, "rank": 0}, "COMMITTED"],
    [{"rank0": "3", "rank1": "3"}, {"step": 3, "rank": 0}, "COMMITTED"],
]


def test_callbacks_see_every_round_and_every_failed_attempt_as_in_ray(storage, monkeypatch) -> None:
    kinds: List[str] = []
    take = _driver._Events.take

    def recording(self, event):  # type: ignore[no-untyped-def]
        kinds.append(event.get("event"))
        take(self, event)

    monkeypatch.setattr(_driver._Events, "take", recording)
    seen = programs.callbacks_program(storage)
    assert seen["calls"] == RAY_CALLS
    # Ray 2.60, measured: each rank's metrics keep the order their keys were reported in.
    reports = [call for call in seen["calls"] if call["hook"] == "after_report"]
    assert {tuple(m) for call in reports for m in call["metrics"]} == {("step", "rank")}
    assert seen["reported"] == [[RAY_REPORTED], [RAY_REPORTED]]
    assert seen["metrics"] == {"step": 3, "rank": 0}
    assert seen["checkpoint"] == {"rank0": "3", "rank1": "3"}
    # Every event of a real run is of a kind the contract lists.
    assert set(kinds) <= set(_events.KINDS)
    assert {"run_started", "report", "checkpoint_committed", "restarting"} <= set(kinds)
    assert kinds[-1] == "run_succeeded"


def test_a_callback_that_raises_ends_the_run_with_a_controller_error(storage) -> None:
    seen = programs.broken_callback_program(storage)
    # Ray 2.60, measured: a ControllerError, a TrainingFailedError (whose own base is Ray's
    # RayTrainError there, RuntimeError here), carrying the callback's error.
    assert seen["raised"] == "ControllerError"
    assert seen["bases"][0] == "TrainingFailedError"
    assert seen["message"] == "Training failed due to controller error:\n'callback broke'"


def test_only_user_callbacks_are_taken() -> None:
    # Ray 2.60, measured (its message names `ray.train.UserCallback`).
    assert programs.not_a_callback_program() == {
        "raised": "ValueError",
        "message": "All callbacks must be instances of `trainyard.train.UserCallback`. Passing "
        "in a Ray Tune callback is no longer supported. See this issue for more context: "
        "https://github.com/ray-project/ray/issues/49454",
    }
