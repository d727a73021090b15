"""The installed package: a light ``import trainyard.train``, the binary beside it, and (when
CI runs this suite from the wheel) no Rust toolchain needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import trainyard
from trainyard._find_trainyard import find_trainyard_bin

# Set by `cargo xtask ci` when it runs this suite from the wheel in a fresh venv.
FROM_WHEEL = os.environ.get("TRAINYARD_TEST_FROM_WHEEL") == "1"


def test_import_trainyard_train_is_light() -> None:
    # CPU time, the import's own cost: wall time on a busy 2-core machine measures the
    # neighbours (quiet, the two agree).
    code = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "import trainyard.train\n"
        "elapsed = time.process_time() - t\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print(elapsed)\n"
    )
    times = []
    for _ in range(5):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        times.append(float(out.stdout))
    assert min(times) <= 0.050, times


def test_a_driver_that_builds_a_torch_trainer_does_not_import_torch() -> None:
    # Importing torch takes seconds; a driver only hands the loop function to the workers.
    code = (
        "import sys\n"
        "from trainyard.train.torch import TorchConfig, TorchTrainer, prepare_model\n"
        "TorchTrainer(lambda: None, torch_config=TorchConfig(backend='gloo'))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_binary_is_found_and_runs_a_plain_command(tmp_path) -> None:
    binary = find_trainyard_bin()
    out = subprocess.run(
        [
            binary,
            "run",
            "-n",
            "2",
            "--backend",
            "none",
            "--storage",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            "import trainyard.train, cloudpickle; print('worker ok')",
        ],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("worker ok") == 2, out.stdout


def test_python_m_trainyard_runs_the_binary() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trainyard", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert trainyard.__version__ in out.stdout


@pytest.mark.skipif(not FROM_WHEEL, reason="only when the suite runs from the installed wheel")
def test_the_wheel_needs_no_rust_toolchain_nor_source_tree() -> None:
    assert shutil.which("cargo") is None and shutil.which("rustc") is None
    # The package and the binary are the installed ones, one version.
    prefix = os.path.realpath(sys.prefix)
    assert os.path.realpath(trainyard.__file__).startswith(prefix)
    assert os.path.realpath(find_trainyard_bin()).startswith(prefix)
    assert "TRAINYARD_BIN" not in os.environ
