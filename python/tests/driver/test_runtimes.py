"""``TorchTrainer.fit()`` on the Ray and Slurm runtimes: ``runtime="ray"|"slurm"`` and
``TRAINYARD_RUNTIME`` mean what ``trainyard run --runtime`` means. The same DDP loop runs in
workers that Ray actors or Slurm job steps started.

Each test needs its cluster: Slurm's test cluster (``scripts/slurm-env.sh up``), or Ray in
this interpreter (a throwaway head is started for the run). Without it a test skips, saying
why; under ``CI=true`` it fails instead, unless CI said why (``TRAINYARD_SLURM_SKIP``,
``TRAINYARD_RAY_SKIP``)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

from trainyard.train import RunConfig, ScalingConfig
from trainyard.train.torch import TorchTrainer


def _needs(what: str, available: bool, skip_var: str) -> None:
    if available:
        return
    reason = os.environ.get(skip_var)
    if os.environ.get("CI") == "true" and not reason:
        pytest.fail(f"{what} is not available, and CI did not say why ({skip_var})")
    pytest.skip(reason or f"{what} is not available")


def _slurm_is_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        nodes = subprocess.run(
            ["sinfo", "-h", "-r", "-o", "%D"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return nodes.returncode == 0 and any(n.strip() not in ("", "0") for n in nodes.stdout.split())


def _ray_is_supported() -> bool:
    """Ray of the release the Ray runtime drives (another is refused by the CLI)."""
    if importlib.util.find_spec("ray") is None:
        return False
    from importlib.metadata import version

    return version("ray").startswith("2.60.")


def where_loop():  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist

    from trainyard import train

    total = torch.ones(1)
    dist.all_reduce(total)
    train.report({"sum": float(total.item())})
    return {
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "slurm_step": os.environ.get("SLURM_STEP_ID"),
        "raylet": os.environ.get("RAY_RAYLET_PID"),
        "world": train.get_context().get_world_size(),
    }


def _fit(storage: str, name: str, runtime=None):  # type: ignore[no-untyped-def]
    return TorchTrainer(
        where_loop,
        scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "memory": 1024**3}
        ),
        run_config=RunConfig(name=name, storage_path=storage),
        runtime=runtime,
    ).fit()


def test_runtime_slurm_runs_each_worker_as_a_job_step(storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _needs("Slurm's test cluster", _slurm_is_up(), "TRAINYARD_SLURM_SKIP")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = _fit(storage, "on-slurm", runtime="slurm")
    assert result.error is None
    assert result.return_value["world"] == 2
    assert result.return_value["slurm_job"], result.return_value
    assert result.return_value["slurm_step"] not in (None, "", "batch"), result.return_value
    # TRAINYARD_RUNTIME chooses it too.
    monkeypatch.setenv("TRAINYARD_RUNTIME", "slurm")
    again = _fit(storage, "on-slurm-by-env")
    assert again.error is None
    assert again.return_value["slurm_job"], again.return_value


def test_runtime_ray_runs_the_workers_in_ray_actors(storage, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _needs("Ray 2.60", _ray_is_supported(), "TRAINYARD_RAY_SKIP")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("TRAINYARD_RAY_PYTHON", raising=False)
    result = _fit(storage, "on-ray", runtime="ray")
    assert result.error is None
    assert result.return_value["world"] == 2
    assert result.return_value["raylet"], "the workers run under a raylet"
    assert result.return_value["slurm_step"] is None


def test_an_unknown_runtime_is_refused_by_name(storage) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="runtime must be one of local, ray, slurm, got 'k8s'"):
        _fit(storage, "nowhere", runtime="k8s")


@pytest.mark.parametrize("runtime", ["slurm", "ray"])
def test_a_surviving_rank_restarts_in_place(runtime, storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from test_torch_trainer import _attempts_of, in_place_loop

    from trainyard import _fit
    from trainyard.train import FailureConfig

    if runtime == "slurm":
        _needs("Slurm's test cluster", _slurm_is_up(), "TRAINYARD_SLURM_SKIP")
    else:
        _needs("Ray 2.60", _ray_is_supported(), "TRAINYARD_RAY_SKIP")
    (tmp_path / "leftover.py").write_text("seen = []\n")
    TorchTrainer(
        in_place_loop,
        train_loop_config={"dir": str(tmp_path)},
        scaling_config=ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "memory": 1024**3}
        ),
        run_config=RunConfig(
            name=f"in-place-{runtime}",
            storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
        ),
        runtime=runtime,
    ).fit()
    (first0, again0), (first1, again1) = (_attempts_of(tmp_path, rank) for rank in (0, 1))
    # Rank 0 trained again in its own process, its modules as it left them; rank 1 anew.
    assert again0[1] == first0[1] and again0[2] == 2, (first0, again0)
    assert again1[1] != first1[1] and again1[2] == 1, (first1, again1)
    assert (tmp_path / "unwound").exists()
    pids = {first0[1], first1[1], again1[1]}
    assert _fit.wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), 10), (
        "a rank's process outlived the run"
    )
