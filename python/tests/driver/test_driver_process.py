"""The driver as a user runs it: a script whose loop function lives in ``__main__``, run from
another directory; its workers' output with the rank prefix; Ctrl-C; no process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from trainyard import _worker
from trainyard.train import get_context

MAIN = textwrap.dedent(
    """
    import os, sys
    from trainyard import train
    from trainyard.train import RunConfig, ScalingConfig
    from trainyard.train.torch import TorchTrainer
    from trainyard.train import WorkerGroupError
    import helper  # beside this script: the driver's sys.path reaches the workers

    class BadBatch(Exception):
        pass

    def loop(config):
        rank = train.get_context().get_world_rank()
        print(f"hello from {rank} with {helper.VALUE}", flush=True)
        with open(os.path.join(config["pids"], f"{rank}"), "w") as f:
            f.write(str(os.getpid()))
        if config["mode"] == "raise" and rank == 1:
            raise BadBatch("bad batch 7")
        if config["mode"] == "sleep":
            import time
            time.sleep(600)
        return os.getcwd()

    if __name__ == "__main__":
        trainer = TorchTrainer(
            loop,
            train_loop_config={"pids": sys.argv[1], "mode": sys.argv[2]},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(storage_path=sys.argv[3]),
        )
        try:
            result = trainer.fit()
        except WorkerGroupError as error:
            failure = error.worker_failures[1]
            print("raised", type(failure).__name__, isinstance(failure, BadBatch), failure)
        else:
            print("returned", result.return_value)
    """
)


def _script(tmp_path):  # type: ignore[no-untyped-def]
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "helper.py").write_text("VALUE = 'helper'\n")
    pids = tmp_path / "pids"
    pids.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return project, pids, elsewhere


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for every purpose here.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_loop_function_in_main_runs_with_the_drivers_directory_and_path(
    tmp_path, storage
) -> None:
    project, pids, elsewhere = _script(tmp_path)
    out = subprocess.run(
        [sys.executable, str(project / "main.py"), str(pids), "return", storage],
        cwd=str(elsewhere),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"returned {elsewhere}" in out.stdout
    for rank in (0, 1):
        assert any(
            line.startswith(f"(rank={rank}, pid=")
            and line.endswith(f"hello from {rank} with helper")
            for line in out.stdout.splitlines()
        ), out.stdout
    workers = [int((pids / f).read_text()) for f in os.listdir(pids)]
    assert len(workers) == 2 and not [pid for pid in workers if _alive(pid)]


def test_an_exception_class_of_main_is_rebuilt_as_itself_and_no_worker_is_left(
    tmp_path, storage
) -> None:
    project, pids, elsewhere = _script(tmp_path)
    out = subprocess.run(
        [sys.executable, str(project / "main.py"), str(pids), "raise", storage],
        cwd=str(elsewhere),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "raised BadBatch True bad batch 7" in out.stdout, out.stdout + out.stderr
    workers = [int((pids / f).read_text()) for f in os.listdir(pids)]
    assert len(workers) == 2 and not [pid for pid in workers if _alive(pid)]


def test_ctrl_c_stops_the_run_and_leaves_no_process(tmp_path, storage) -> None:
    project, pids, elsewhere = _script(tmp_path)
    driver = subprocess.Popen(
        [sys.executable, str(project / "main.py"), str(pids), "sleep", storage],
        cwd=str(elsewhere),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while len(os.listdir(pids)) < 2:
            assert driver.poll() is None, driver.communicate()[0]
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
        time.sleep(0.5)
        children = subprocess.run(
            ["pgrep", "-P", str(driver.pid)], capture_output=True, text=True
        ).stdout.split()
        driver.send_signal(signal.SIGINT)
        output, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0
    assert "KeyboardInterrupt" in output, output
    assert "interrupted: stopping the run" in output, output
    workers = [int((pids / f).read_text()) for f in os.listdir(pids)]
    leftovers = [pid for pid in workers + [int(c) for c in children] if _alive(pid)]
    assert not leftovers, output


def test_a_worker_of_another_python_version_is_refused_with_a_clear_error() -> None:
    spec = {"python": [2, 7], "executable": "/usr/bin/python2.7"}
    try:
        _worker._check_python(spec)
    except RuntimeError as error:
        text = str(error)
    else:
        raise AssertionError("a Python 2.7 driver was accepted")
    assert "Python 2.7" in text and "one Python version on both sides" in text


def test_the_context_outside_a_run_is_a_single_worker() -> None:
    ctx = get_context()
    assert (ctx.get_world_rank(), ctx.get_world_size()) == (0, 1)
