"""Validation (``ValidationConfig``, ``report(validation=...)``), ``get_all_reported_checkpoints``,
``report(checkpoint_upload_fn=...)`` and ``get_preemption_info`` behave as Ray Train 2.60's.

The programs are ``v2_programs.py``'s; the expected values were measured on Ray 2.60
(``ray[train]==2.60.0``, 2 workers, this machine, ``ray.init(num_cpus=4)``) with the same
programs, only the imports changed. Where trainyard differs on purpose, a comment says so.
"""

from __future__ import annotations

import pytest
import v2_programs as programs

from trainyard.train import (
    PreemptionError,
    PreemptionInfo,
    RunConfig,
    TrainingFailedError,
    ValidationConfig,
    ValidationTaskConfig,
)
from trainyard.train.torch import TorchTrainer

# --- get_all_reported_checkpoints ------------------------------------------------------------


def test_reported_checkpoints_wait_for_the_round_and_give_up_after_the_timeout(storage) -> None:
    seen = programs.reported_program(storage)
    # Ray 2.60, measured: nothing before any report; after round 2 (which it waited for, rank
    # 1 being late) its checkpoint; while rank 1 has not made round 3 the same one, at once
    # with timeout_s=0 and after 0.5 s with timeout_s=0.5; then only round 3's (one kept).
    assert seen["rank_0"] == {
        "before": [],
        "round_2": [[{"rank0": "2"}, {"i": 2}, "COMMITTED"]],
        "round_2_waited": True,
        "now": [[{"rank0": "2"}, {"i": 2}, "COMMITTED"]],
        "now_waited": False,
        "half_a_second": [[{"rank0": "2"}, {"i": 2}, "COMMITTED"]],
        "half_a_second_waited": True,
        "round_3": [[{"rank0": "3"}, {"i": 3}, "COMMITTED"]],
        "text_mode": "Unexpected CheckpointConsistencyMode: COMMITTED",
    }
    assert seen["rank_1"] == {"round_3": [[{"rank0": "3"}, {"i": 3}, "COMMITTED"]]}


# --- validation ------------------------------------------------------------------------------

_VALIDATED = [
    [{"rank0": "0", "rank1": "0"}, {"i": 0, "shared": "val", "val_loss": 0.7}, "VALIDATED"],
    [{"rank0": "1", "rank1": "1"}, {"i": 1, "shared": "val", "val_loss": 0.1}, "VALIDATED"],
    [{"rank0": "2", "rank1": "2"}, {"i": 2, "shared": "train"}, "VALIDATION_FAILED"],
    [{"rank0": "3", "rank1": "3"}, {"i": 3, "shared": "train"}, "VALIDATION_TIMEOUT"],
    [{"rank0": "4", "rank1": "4"}, {"i": 4, "shared": "train"}, "VALIDATION_FAILED"],
    [{"rank0": "5", "rank1": "5"}, {"i": 5, "shared": "train"}, "COMMITTED"],
]


def test_validation_runs_beside_training_and_merges_its_metrics_as_in_ray(storage) -> None:
    seen = programs.validation_program(storage)
    # Ray 2.60, measured: one call per checkpoint that asked, in order, with the config's
    # kwargs overridden by the report's, on the checkpoint in storage; one process of its own
    # until a timeout kills it.
    assert seen["calls"] == [
        {"files": {"rank0": "0", "rank1": "0"}, "kwargs": {"v": 0.7}, "type": "Checkpoint"},
        {"files": {"rank0": "1", "rank1": "1"}, "kwargs": {"v": 0.1}, "type": "Checkpoint"},
        {
            "files": {"rank0": "2", "rank1": "2"},
            "kwargs": {"v": 0.7, "fail": True},
            "type": "Checkpoint",
        },
        {
            "files": {"rank0": "3", "rank1": "3"},
            "kwargs": {"v": 0.7, "sleep": 4},
            "type": "Checkpoint",
        },
        {
            "files": {"rank0": "4", "rank1": "4"},
            "kwargs": {"v": 0.7, "notdict": True},
            "type": "Checkpoint",
        },
    ]
    assert seen["one_process_until_the_timeout"]
    rank_0, rank_1 = seen["seen"]
    # Ray 2.60, measured: right after report 1 both checkpoints are still pending; at the end
    # (VALIDATED: it waits for every validation) each has its status, the validated ones the
    # validation's metrics merged in (the validation's "shared" wins).
    assert rank_0["committed_after_1"] == [
        [{"rank0": "0", "rank1": "0"}, {"i": 0, "shared": "train"}, "PENDING_VALIDATION"],
        [{"rank0": "1", "rank1": "1"}, {"i": 1, "shared": "train"}, "PENDING_VALIDATION"],
    ]
    assert rank_0["validated"] == _VALIDATED
    for rank in (rank_0, rank_1):
        assert rank["without_checkpoint"] == "Validation requires a checkpoint to be provided."
        # Off the training path: no report waits for a validation (Ray 2.60's reports took
        # about 2 s each here, for reasons of their own, so this one is not Ray's value).
        assert rank["report_s"] is True
    # Ray 2.60, measured: the Result holds the merged metrics; the latest checkpoint asked for
    # no validation.
    assert seen["metrics"] == {"i": 5, "shared": "train"}
    assert seen["best"] == [[files, metrics] for files, metrics, _ in _VALIDATED]
    assert seen["dataframe"] == [
        {"i": 0, "shared": "val", "val_loss": 0.7},
        {"i": 1, "shared": "val", "val_loss": 0.1},
        {"i": 2, "shared": "train", "val_loss": None},
        {"i": 3, "shared": "train", "val_loss": None},
        {"i": 4, "shared": "train", "val_loss": None},
        {"i": 5, "shared": "train", "val_loss": None},
    ]


def test_a_validation_metric_orders_the_kept_checkpoints_once_known(storage) -> None:
    # Ray 2.60, measured: checkpoints are kept by the metrics they were reported with (the
    # validation's come later), so the two newest stay; once validated they are ordered by
    # it, worst first, and the Result's metrics hold the latest one's validation. (Measured
    # with a count of names starting with checkpoint_, which there took in Ray's
    # checkpoint_manager_snapshot.json too: 3; two of them folders.)
    assert programs.scored_validation_program(storage) == {
        "metrics": {"i": 3, "val_loss": 0.3, "shared": "val"},
        "best": [
            {"i": 2, "val_loss": 0.9, "shared": "val"},
            {"i": 3, "val_loss": 0.3, "shared": "val"},
        ],
        "kept": 2,
    }


def test_a_validation_asked_of_a_trainer_without_a_config_is_refused(storage) -> None:
    # Ray 2.60, measured: ValueError in the worker, with this text.
    assert programs.unasked_validation_program(storage) == {
        "returned": "`validation_config` was not set on the trainer, but a validation was "
        "requested."
    }


def test_validation_configs_check_what_ray_checks() -> None:
    # Ray 2.60, measured: an AssertionError with this text; no fn_kwargs are {}.
    with pytest.raises(
        AssertionError,
        match="^The `timeout_s` should be None or greater than zero, actual value: 0$",
    ):
        ValidationTaskConfig(timeout_s=0)
    assert ValidationTaskConfig().fn_kwargs == {}
    # trainyard runs the validation in a process of its own, outside Ray's scheduler.
    with pytest.raises(ValueError, match=r"ray_remote_kwargs=\{'num_cpus': 1\}\) is not supported"):
        ValidationConfig(programs.validate, ray_remote_kwargs={"num_cpus": 1})
    with pytest.raises(TypeError, match="must be a trainyard.train.ValidationConfig, got dict"):
        TorchTrainer(programs.two_reports_loop, validation_config={"fn": programs.validate})  # type: ignore[arg-type]


# --- checkpoint_upload_fn, get_preemption_info ------------------------------------------------


def test_an_upload_function_persists_the_checkpoint_where_it_says(storage) -> None:
    seen = programs.upload_program(storage)
    # Ray 2.60, measured: every rank's function is called with one folder name (Ray's default
    # names it by the time, `checkpoint_2026-12-07_06-22-28.843357`; trainyard's by the
    # report's index, the README's differences), then with the name given; get_checkpoint()
    # is the folder it returned; a function returning no Checkpoint raises ValueError.
    assert seen["checkpoint"] == "mine"
    assert seen["files"] == {"rank0": "b", "rank1": "b"}
    assert seen["metrics"] == {"a": 2}
    for rank, rank_seen in enumerate(seen["seen"]):
        assert rank_seen["preemption"] == "None"
        assert rank_seen["get_checkpoint"] == "mine"
        assert rank_seen["not_a_checkpoint"] == (
            "checkpoint_upload_fn must return a `trainyard.train.Checkpoint`. Actual type is "
            "<class 'str'>"
        )
        (first, first_files), (second, second_files) = rank_seen["uploads"]
        assert first == "checkpoint_upload_000001" and second == "mine"
        assert f"rank{rank}" in first_files and f"rank{rank}" in second_files


def test_a_schedulers_warning_is_the_preemption_every_rank_sees(storage) -> None:
    # Not measurable on Ray here (its watcher asks the cloud's node provider): trainyard's
    # warning is Slurm's --signal=USR1, which the agents hand on to every task; here rank 1
    # gets it by hand.
    result = TorchTrainer(
        programs.preempted_loop,
        scaling_config=programs.TWO,
        run_config=RunConfig(name="preempted", storage_path=storage),
    ).fit()
    before, after = result.return_value
    assert before is None
    assert isinstance(after, PreemptionInfo) and after.deadline_ms is None
    assert after.preempted_ranks == [1] and len(after.preempted_node_ids) == 1
    error = PreemptionError(after)
    assert isinstance(error, TrainingFailedError)
    assert str(error) == (
        "Training was interrupted by node preemption (preempted_ranks=[1], drain_timed_out=False)."
    )
