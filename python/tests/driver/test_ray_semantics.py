"""Where Ray Train 2.60 and trainyard could answer differently, the same program answers as
Ray's: the order of ``best_checkpoints``, the rows of ``metrics_dataframe``, a score attribute
no report has, ``Result.from_path``, local mode, tracebacks, and Ray's deprecated arguments.

The expected values were measured on Ray 2.60 (``ray[train]==2.60.0``, 2 workers, this
machine) with the same loops, unless a comment says otherwise.
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from trainyard import train
from trainyard.train import (
    Checkpoint,
    CheckpointConfig,
    FailureConfig,
    LoggingConfig,
    Result,
    RunConfig,
    ScalingConfig,
    WorkerGroupError,
)
from trainyard.train.torch import TorchTrainer

TWO = ScalingConfig(num_workers=2)
ACCS = [0.1, 0.5, 0.3, 0.9, 0.2, 0.4]
MIGRATION = (
    "See this issue for more context and migration options: "
    "https://github.com/ray-project/ray/issues/49454."
)
DISABLE = (
    " Disable these warnings by setting the environment variable: "
    "RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS=0"
)


def scored_loop(config):  # type: ignore[no-untyped-def]
    for step, acc in enumerate(config["accs"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as f:
                f.write(str(step))
            train.report({"step": step, "acc": acc}, checkpoint=Checkpoint.from_directory(d))


def _scored(storage: str, name: str, checkpoint_config: CheckpointConfig, **run) -> Result:  # type: ignore[no-untyped-def]
    return TorchTrainer(
        scored_loop,
        train_loop_config={"accs": ACCS},
        scaling_config=TWO,
        run_config=RunConfig(
            name=name, storage_path=storage, checkpoint_config=checkpoint_config, **run
        ),
    ).fit()


def _on_disk(result: Result) -> list:  # type: ignore[type-arg]
    assert result.path is not None
    return sorted(d for d in os.listdir(result.path) if d.startswith("checkpoint_"))


def _steps(pairs) -> list:  # type: ignore[no-untyped-def,type-arg]
    return [metrics["step"] for _, metrics in pairs]


# --- best_checkpoints, metrics_dataframe, from_path -------------------------------------------


def test_best_checkpoints_go_worst_to_best_and_the_dataframe_has_their_rows(storage, capfd) -> None:
    result = _scored(
        storage,
        "min3",
        CheckpointConfig(
            num_to_keep=3, checkpoint_score_attribute="acc", checkpoint_score_order="min"
        ),
    )
    # Ray 2.60: acc 0.3, 0.2, 0.1 (steps 2, 4, 0); the latest (0.4) kept on disk but not
    # among them; metrics are the latest checkpoint's.
    assert _steps(result.best_checkpoints) == [2, 4, 0]
    assert result.metrics_dataframe.to_dict("records") == [
        {"step": 2, "acc": 0.3},
        {"step": 4, "acc": 0.2},
        {"step": 0, "acc": 0.1},
    ]
    assert result.metrics == {"step": 5, "acc": 0.4}
    assert len(_on_disk(result)) == 4
    for checkpoint, metrics in result.best_checkpoints:
        with open(os.path.join(checkpoint.path, "step")) as f:
            assert int(f.read()) == metrics["step"]
    # The driver's own logging is shown at the default level (LoggingConfig "INFO").
    assert "Setting up process group" in capfd.readouterr().err

    # Read back from its folder: every checkpoint kept, worst to best by the run's score, the
    # latest among them (Ray 2.60 reads its snapshot with a default CheckpointConfig).
    again = Result.from_path(result.path)
    assert again.path == result.path and again.error is None
    assert again.metrics == {"step": 5, "acc": 0.4}
    assert again.checkpoint == result.checkpoint
    assert _steps(again.best_checkpoints) == [5, 2, 4, 0]
    assert list(again.metrics_dataframe["step"]) == [5, 2, 4, 0]
    assert again.get_best_checkpoint("acc", "max") == result.checkpoint


def test_from_path_refuses_a_missing_folder_and_one_no_run_wrote(storage, tmp_path) -> None:
    missing = os.path.join(storage, "nope")
    # Ray 2.60: RuntimeError "Experiment folder <path> doesn't exist."
    with pytest.raises(RuntimeError, match=f"^Experiment folder {missing} doesn't exist.$"):
        Result.from_path(missing)
    with pytest.raises(RuntimeError, match="run.json doesn't exist in the experiment folder"):
        Result.from_path(tmp_path)


def test_a_score_attribute_no_report_has_logs_rays_error_and_keeps_the_newest(
    storage, caplog
) -> None:
    with caplog.at_level(logging.ERROR, logger="trainyard.train"):
        result = _scored(
            storage,
            "missing",
            CheckpointConfig(
                num_to_keep=2,
                checkpoint_score_attribute="val_loss",
                checkpoint_score_order="min",
            ),
        )
    # Ray 2.60: the two newest kept, and this error on the controller's log, the keys in the
    # order reported.
    assert _steps(result.best_checkpoints) == [4, 5]
    assert len(_on_disk(result)) == 2
    said = [r.getMessage() for r in caplog.records if r.name == "trainyard.train"]
    assert len(said) == len(ACCS) and set(said) == {
        "Result dict has no key: val_loss. checkpoint_score_attr must be set to a key in "
        "the result dict. Valid keys are: ['step', 'acc']"
    }
    # Metrics keep the order reported, as Ray's.
    assert list(result.metrics) == ["step", "acc"]
    assert list(result.metrics_dataframe.columns) == ["step", "acc"]


def test_without_a_score_the_newest_are_kept_oldest_first(storage) -> None:
    result = _scored(storage, "newest", CheckpointConfig(num_to_keep=2))
    # Ray 2.60: steps 4, 5.
    assert _steps(result.best_checkpoints) == [4, 5]
    assert list(result.metrics_dataframe["step"]) == [4, 5]
    assert _steps(Result.from_path(result.path).best_checkpoints) == [4, 5]


def nested_loop(config):  # type: ignore[no-untyped-def]
    for step, acc in enumerate(config["accs"]):
        with tempfile.TemporaryDirectory() as d:
            train.report(
                {"step": step, "val": {"acc": acc}}, checkpoint=Checkpoint.from_directory(d)
            )


def test_a_nested_score_attribute_names_its_metric_by_path(storage, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="trainyard.train"):
        result = TorchTrainer(
            nested_loop,
            train_loop_config={"accs": ACCS},
            scaling_config=TWO,
            run_config=RunConfig(
                name="nested",
                storage_path=storage,
                checkpoint_config=CheckpointConfig(
                    num_to_keep=3,
                    checkpoint_score_attribute="val/acc",
                    checkpoint_score_order="min",
                ),
            ),
        ).fit()
    # As the flat "acc" above (Ray 2.60 flattens the metrics to find "val/acc").
    assert _steps(result.best_checkpoints) == [2, 4, 0]
    assert len(_on_disk(result)) == 4
    assert _steps(Result.from_path(result.path).best_checkpoints) == [5, 2, 4, 0]
    assert not [r for r in caplog.records if r.name == "trainyard.train"]


def epochs_loop(config):  # type: ignore[no-untyped-def]
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "epoch")) as f:
            start = int(f.read()) + 1
    for epoch in range(start, config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "epoch"), "w") as f:
                f.write(str(epoch))
            train.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d))
    return list(range(start, config["epochs"]))


def test_running_a_finished_run_again_trains_on_from_its_latest_checkpoint(storage) -> None:
    def fit(epochs: int) -> Result:
        return TorchTrainer(
            epochs_loop,
            train_loop_config={"epochs": epochs},
            scaling_config=TWO,
            run_config=RunConfig(name="more", storage_path=storage),
        ).fit()

    first = fit(2)
    assert first.return_value == [0, 1]
    # Ray 2.60: the same name and storage_path resume the finished run ("2 more epochs").
    again = fit(4)
    assert again.return_value == [2, 3]
    assert again.path == first.path
    assert again.metrics == {"epoch": 3}
    assert [m["epoch"] for _, m in again.best_checkpoints] == [0, 1, 2, 3]
    assert again.checkpoint is not None
    assert again.checkpoint.path.endswith("checkpoint_000004")
    assert list(again.metrics_history["epoch"]) == [0, 1, 2, 3]


def named_loop(config):  # type: ignore[no-untyped-def]
    """Rank by rank, iteration by iteration, one of: copied (SYNC, ASYNC), written into the run
    folder (NO_UPLOAD), or no checkpoint; every checkpoint named ``iteration_<i>``."""
    rank = train.get_context().get_world_rank()
    scratch = tempfile.mkdtemp()
    seen = []
    for i, modes in enumerate(config["modes"]):
        mode = modes[rank]
        name = f"iteration_{i}"
        if mode is None:
            train.report({"i": i})
            continue
        if mode == "NO_UPLOAD":
            folder = train.get_context().get_storage().build_checkpoint_path_from_name(name)
        else:
            folder = os.path.join(scratch, name, str(rank))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"shard_{rank}"), "w") as f:
            f.write(str(i))
        train.report(
            {"i": i},
            checkpoint=Checkpoint.from_directory(folder),
            checkpoint_upload_mode=train.CheckpointUploadMode[mode],
            checkpoint_dir_name=name,
        )
        if mode == "SYNC":
            seen.append(os.path.basename(train.get_checkpoint().path))
    return seen


def test_checkpoint_dir_name_names_the_folder_whatever_each_ranks_upload_mode(storage) -> None:
    # Ray's test_report_mixed_checkpoint_upload_modes in small: every pair of modes.
    modes = [
        ("SYNC", "SYNC"),
        ("ASYNC", "SYNC"),
        ("SYNC", "NO_UPLOAD"),
        ("ASYNC", "NO_UPLOAD"),
        ("NO_UPLOAD", "NO_UPLOAD"),
        ("ASYNC", None),
        ("NO_UPLOAD", None),
        (None, None),
    ]
    result = TorchTrainer(
        named_loop,
        train_loop_config={"modes": modes},
        scaling_config=TWO,
        run_config=RunConfig(name="named", storage_path=storage),
    ).fit()
    # Ray 2.60: a checkpoint per iteration where any rank handed one in, in its named folder.
    # After a SYNC report (rank 0's: iterations 0 and 2), get_checkpoint() is in that folder.
    assert result.return_value == ["iteration_0", "iteration_2"]
    assert [m["i"] for _, m in result.best_checkpoints] == list(range(7))
    for i, (checkpoint, _) in enumerate(result.best_checkpoints):
        assert checkpoint.path.endswith(f"/iteration_{i}")
        shards = sorted(os.listdir(checkpoint.path))
        assert shards == [f"shard_{r}" for r in range(2) if modes[i][r] is not None]
    assert not _on_disk(result), "no folder named by index"


def latest_loop():  # type: ignore[no-untyped-def]
    before = train.get_checkpoint()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "state"), "w") as f:
            f.write("one")
        train.report({"step": 0}, checkpoint=Checkpoint.from_directory(d))
    latest = train.get_checkpoint()
    with latest.as_directory() as folder, open(os.path.join(folder, "state")) as f:
        return before, f.read(), os.path.dirname(latest.path)


def test_get_checkpoint_during_the_run_is_the_latest_reported_once_persisted(storage) -> None:
    # Ray 2.60: after a SYNC report, get_checkpoint() is that checkpoint, in storage.
    result = TorchTrainer(
        latest_loop, scaling_config=TWO, run_config=RunConfig(name="latest", storage_path=storage)
    ).fit()
    assert result.return_value == (None, "one", result.path)


# --- local mode -------------------------------------------------------------------------------


def local_loop(config):  # type: ignore[no-untyped-def]
    ctx = train.get_context()
    train.report({"a": 1})
    with tempfile.TemporaryDirectory() as d:
        train.report({"b": 2}, checkpoint=Checkpoint.from_directory(d))
        seen_checkpoint = train.get_checkpoint() is not None
    train.report({"c": 3})
    train.collective.barrier()
    return {
        "world_size": ctx.get_world_size(),
        "rank": ctx.get_world_rank(),
        "local_rank": ctx.get_local_rank(),
        "local_world_size": ctx.get_local_world_size(),
        "node_rank": ctx.get_node_rank(),
        "name": ctx.get_experiment_name(),
        "pid": os.getpid(),
        "seen_checkpoint": seen_checkpoint,
        "context": type(ctx).__name__,
        "shared": train.collective.broadcast_from_rank_zero("from me"),
    }


def test_local_mode_runs_the_loop_in_this_process_as_rank_0_of_1(storage) -> None:
    result = TorchTrainer(
        local_loop,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="local", storage_path=storage),
    ).fit()
    # Ray 2.60: the same values; metrics are the latest report's (no checkpoint), and the
    # checkpoint is the latest report's (none).
    assert result.return_value == {
        "world_size": 1,
        "rank": 0,
        "local_rank": 0,
        "local_world_size": 1,
        "node_rank": 0,
        "name": "local",
        "pid": os.getpid(),
        "seen_checkpoint": True,
        "context": "LocalTrainContext",
        "shared": "from me",
    }
    assert result.metrics == {"c": 3}
    assert result.checkpoint is None and result.path is None and result.error is None
    assert result.best_checkpoints is None and result.metrics_dataframe is None
    assert os.listdir(storage) == []


def test_local_mode_raises_the_loops_own_exception() -> None:
    def boom():  # type: ignore[no-untyped-def]
        raise ValueError("bad batch 7")

    # Ray 2.60: ValueError("bad batch 7"), not wrapped.
    with pytest.raises(ValueError, match="^bad batch 7$"):
        TorchTrainer(boom, scaling_config=ScalingConfig(num_workers=0)).fit()


def test_local_mode_under_a_launcher_takes_its_ranks_and_process_group(tmp_path) -> None:
    """Ray's local mode under torchrun joins torchrun's process group; here the launcher is
    ``trainyard run -n 2``, which sets the same variables."""
    from trainyard._find_trainyard import find_trainyard_bin

    script = tmp_path / "launched.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch, torch.distributed as dist
            from trainyard import train
            from trainyard.train import ScalingConfig
            from trainyard.train.torch import TorchTrainer

            def loop():
                total = torch.ones(1)
                dist.all_reduce(total)
                ctx = train.get_context()
                return (ctx.get_world_rank(), ctx.get_world_size(), int(total.item()))

            rank, size, total = TorchTrainer(
                loop, scaling_config=ScalingConfig(num_workers=0)
            ).fit().return_value
            print(f"LOCAL rank={rank} size={size} total={total}", flush=True)
            """
        )
    )
    done = subprocess.run(
        [
            find_trainyard_bin(),
            "run",
            "-n",
            "2",
            "--storage",
            os.fspath(tmp_path / "runs"),
            "--",
            sys.executable,
            os.fspath(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line.split(") ", 1)[1] for line in done.stdout.splitlines() if "LOCAL" in line)
    assert lines == ["LOCAL rank=0 size=2 total=2", "LOCAL rank=1 size=2 total=2"]


# --- tracebacks -------------------------------------------------------------------------------


def failing_loop():  # type: ignore[no-untyped-def]
    if train.get_context().get_world_rank() == 1:
        raise ValueError("bad batch 7")


def test_a_ranks_traceback_names_the_file_and_line_of_the_loop(storage) -> None:
    with pytest.raises(WorkerGroupError) as caught:
        TorchTrainer(
            failing_loop, scaling_config=TWO, run_config=RunConfig(storage_path=storage)
        ).fit()
    line = inspect.getsourcelines(failing_loop)[1] + 2
    where = f'File "{__file__}", line {line}, in failing_loop'
    text = caught.value.worker_failures[1].traceback_str  # type: ignore[attr-defined]
    assert where in text and 'raise ValueError("bad batch 7")' in text, text
    assert "<dynamic-code>" not in str(caught.value)
    assert where in str(caught.value)


# --- worker_runtime_env, LoggingConfig --------------------------------------------------------


def env_loop():  # type: ignore[no-untyped-def]
    return os.environ.get("FROM_RUNTIME_ENV")


def test_worker_runtime_env_vars_reach_every_worker_and_log_level_quiets_the_driver(
    storage, capfd
) -> None:
    # A value with what a command line or an env file could not carry: it travels in the
    # driver's environment, never on its command line.
    value = "s3cret=yes\nsecond line"
    run_config = RunConfig(
        storage_path=storage,
        worker_runtime_env={"env_vars": {"FROM_RUNTIME_ENV": value}},
        logging_config=LoggingConfig(log_level="ERROR"),
    )
    args = run_config._cli_args()
    assert args[args.index("--env") + 1] == "FROM_RUNTIME_ENV"
    assert not any("s3cret" in arg for arg in args)
    result = TorchTrainer(env_loop, scaling_config=TWO, run_config=run_config).fit()
    assert result.return_value == value
    assert "Setting up process group" not in capfd.readouterr().err


def test_runtime_env_keys_other_than_env_vars_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="key 'pip' is not supported.*only 'env_vars'"):
        RunConfig(worker_runtime_env={"env_vars": {"A": "1"}, "pip": ["torch"]})
    with pytest.raises(TypeError, match="must map names to strings"):
        RunConfig(worker_runtime_env={"env_vars": {"A": 1}})


def test_logging_config_takes_rays_level_names() -> None:
    # Ray 2.60: "debug" becomes "DEBUG"; an unknown name is a ValueError listing them.
    assert LoggingConfig(log_level="debug").log_level == "DEBUG"
    with pytest.raises(ValueError) as caught:
        LoggingConfig(log_level="LOUD")
    assert str(caught.value) == (
        "Invalid log_level: 'LOUD'. Must be one of: 'CRITICAL', 'DEBUG', 'ERROR', 'FATAL', "
        "'INFO', 'NOTSET', 'TRACE', 'WARN', 'WARNING'."
    )


# --- Ray's deprecated and Ray-only arguments (messages measured on Ray 2.60) ----------------


RUN_CONFIG_DEPRECATED = (
    "`RunConfig({})` is deprecated. This configuration was a Ray Tune API that did not "
    "support Ray Train usage well, so we are dropping support going forward. If you "
    "heavily rely on these configurations, you can run Ray Train as a single Ray Tune "
    "trial. See this issue for more context: https://github.com/ray-project/ray/issues/49454"
)
METADATA_DEPRECATED = (
    "`get_metadata` was an experimental API that accessed the metadata passed to "
    "`<Framework>Trainer(metadata=...)`. This API can be replaced by passing the metadata "
    "directly to the training function (e.g., via `train_loop_config`). " + MIGRATION + DISABLE
)


@pytest.mark.parametrize(
    "param", ["sync_config", "verbose", "stop", "progress_reporter", "log_to_file"]
)
def test_rays_deprecated_run_config_arguments_raise_its_deprecation(param: str) -> None:
    with pytest.raises(DeprecationWarning) as caught:
        RunConfig(**{param: 0})
    assert str(caught.value) == RUN_CONFIG_DEPRECATED.format(param)


def test_rays_deprecated_config_arguments_raise_its_deprecation() -> None:
    with pytest.raises(DeprecationWarning) as caught:
        ScalingConfig(trainer_resources={"CPU": 1})
    assert str(caught.value).startswith(
        "`ray.train.ScalingConfig(trainer_resources)` is deprecated."
    ) and str(caught.value).endswith(MIGRATION + DISABLE)
    with pytest.raises(DeprecationWarning) as caught:
        FailureConfig(fail_fast=True)
    assert str(caught.value).startswith("`ray.train.FailureConfig(fail_fast)` is deprecated")
    for param in ("checkpoint_frequency", "checkpoint_at_end"):
        with pytest.raises(DeprecationWarning) as caught:
            CheckpointConfig(**{param: 1})
        assert str(caught.value) == (
            f"`{param}` is deprecated since it does not apply to user-defined training "
            "functions. Please remove this argument from your CheckpointConfig."
        )


def test_restore_and_can_restore_raise_rays_deprecation() -> None:
    for method in (TorchTrainer.restore, TorchTrainer.can_restore):
        with pytest.raises(DeprecationWarning) as caught:
            method("/any/path")
        assert str(caught.value) == (
            "The `restore` and `can_restore` APIs are deprecated and will be removed in a "
            "future release. " + MIGRATION
        )


def metadata_loop():  # type: ignore[no-untyped-def]
    ctx = train.get_context()
    said = {}
    for method in ("get_metadata", "get_trial_name", "get_trial_id", "get_trial_dir"):
        try:
            getattr(ctx, method)()
        except DeprecationWarning as error:
            said[method] = str(error)
    return said


def test_metadata_raises_rays_deprecation_in_the_trainer_and_the_context(storage) -> None:
    with pytest.raises(DeprecationWarning) as caught:
        TorchTrainer(metadata_loop, metadata={"a": 1})
    assert str(caught.value) == METADATA_DEPRECATED
    said = (
        TorchTrainer(metadata_loop, scaling_config=TWO, run_config=RunConfig(storage_path=storage))
        .fit()
        .return_value
    )
    assert said["get_metadata"] == METADATA_DEPRECATED
    assert said["get_trial_name"] == (
        "`get_trial_name` is deprecated because the concept of a `Trial` will soon be "
        "removed in Ray Train.Ray Train will no longer assume that it's running within a Ray "
        "Tune `Trial` in the future. " + MIGRATION + DISABLE
    )
    assert set(said) == {"get_metadata", "get_trial_name", "get_trial_id", "get_trial_dir"}


def test_what_ray_offers_and_trainyard_does_not_is_refused_naming_what_to_use() -> None:
    with pytest.raises(ValueError, match="accelerator_type"):
        ScalingConfig(label_selector={"zone": "a"})
    with pytest.raises(ValueError, match="use_gpu=True"):
        ScalingConfig(use_tpu=True)
    with pytest.raises(ValueError, match="max_failures"):
        FailureConfig(controller_failure_limit=3)
    with pytest.raises(ValueError, match="prepare_data_loader"):
        TorchTrainer(env_loop, dataset_config=object())
    # Ray 2.60: negative workers are a ValueError, in its words; 0 is local mode.
    with pytest.raises(
        ValueError,
        match=r"^Invalid ScalingConfig\(num_workers=-1\): Number of workers cannot be negative\.$",
    ):
        ScalingConfig(num_workers=-1)
    assert ScalingConfig(num_workers=0).local_mode
    interval = ScalingConfig(num_workers=(1, 2), elastic_resize_monitor_interval_s=5)
    assert "--resize-interval" in interval._cli_args()


def test_pyarrow_file_systems_are_taken_as_rays_or_refused_naming_what_to_use() -> None:
    fs = pytest.importorskip("pyarrow.fs")
    s3 = RunConfig(storage_path="bucket/runs", storage_filesystem=fs.S3FileSystem())
    assert s3.storage_path == "s3://bucket/runs"
    with pytest.raises(ValueError, match="is not supported: give storage_path"):
        RunConfig(storage_filesystem=fs.SubTreeFileSystem("/", fs.LocalFileSystem()))


def test_rays_checks_speak_rays_words_and_trainyards_rules_are_the_binarys(storage) -> None:
    # Ray 2.60, measured: these raise ValueError at construction, with these words.
    for make, said in (
        (lambda: ScalingConfig(num_workers="2"), "ScalingConfig(num_workers) must be an int or a tuple of two ints."),
        (lambda: ScalingConfig(num_workers=[1, 2]), "ScalingConfig(num_workers) must be an int or a tuple of two ints."),
        (
            lambda: ScalingConfig(num_workers=(3, 2)),
            "Invalid ScalingConfig(num_workers=(3, 2)): min_workers=3 must be <= max_workers=2.",
        ),
        (
            lambda: ScalingConfig(num_workers=2, elastic_resize_monitor_interval_s=-1),
            "ScalingConfig(elastic_resize_monitor_interval_s) must be non-negative.",
        ),
        (
            lambda: CheckpointConfig(num_to_keep=0),
            "Received invalid num_to_keep: 0. Must be None or an integer >= 1.",
        ),
        (
            lambda: CheckpointConfig(checkpoint_score_order="best"),
            "Received invalid checkpoint_score_order: best. Must be 'max' or 'min'.",
        ),
    ):
        with pytest.raises(ValueError) as raised:
            make()
        assert str(raised.value) == said
    # Ray 2.60 takes these at construction and fails when it places the workers; trainyard's
    # binary, where its rules on these values live, refuses them at construction.
    with pytest.raises(
        ValueError,
        match="^ScalingConfig: invalid placement strategy `EVERYWHERE`: expected one of PACK, "
        "SPREAD, STRICT_PACK, STRICT_SPREAD$",
    ):
        ScalingConfig(num_workers=2, placement_strategy="EVERYWHERE")
    with pytest.raises(ValueError, match="^ScalingConfig: resource `memory` must be a non-negative"):
        ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "memory": "ten GB"})
    with pytest.raises(ValueError, match="`num_workers` must be between 1 and 1000000, got 0"):
        ScalingConfig(num_workers=(0, 2))
    # Ray 2.60 takes max_failures=-5 and never says; trainyard's binary refuses it when fit()
    # starts it, before any worker starts.
    failing = RunConfig(
        name="negative", storage_path=storage, failure_config=FailureConfig(max_failures=-5)
    )
    with pytest.raises(ValueError, match="max_failures. must be -1 .unlimited. or a number"):
        TorchTrainer(env_loop, scaling_config=TWO, run_config=failing).fit()
