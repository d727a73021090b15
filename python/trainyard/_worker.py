"""The worker side of ``TorchTrainer.fit()``: ``python -m trainyard._worker FIT_DIR``.

The driver writes into ``FIT_DIR`` the loop function and its config and ``spec.json`` (see
``trainyard._fit``). Each rank checks the Python version, takes the driver's working
directory and ``sys.path``, notes a scheduler's pre-emption warning from then on
(``SIGUSR1``, see ``trainyard.train._preemption``), joins the run's ``torch.distributed``
process group, calls the loop function, and leaves behind in ``FIT_DIR``: rank 0 its return
value; a rank that raises, its exception, which the driver raises again within
``WorkerGroupError.worker_failures``.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from typing import Any, Dict, Optional

from trainyard import _fit


def _rank() -> int:
    return int(os.environ.get("TRAINYARD_WORLD_RANK") or os.environ.get("RANK") or 0)


def _leave_error(fit_dir: str, error: BaseException) -> None:
    """Writes ``error`` (pickled when it can be, its text always) for the driver."""
    # The traceback from the user's code on: this module's frames tell nothing.
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(error), error, tb or error.__traceback__))
    try:
        import cloudpickle

        pickled: Optional[bytes] = cloudpickle.dumps(error)
        pickle.loads(pickled)
    except Exception:  # noqa: BLE001 - the text is kept whatever the exception holds
        pickled = None
    record = {
        "type": f"{type(error).__module__}.{type(error).__qualname__}",
        "message": str(error),
        "traceback": text,
        "pickled": pickled,
    }
    restart_count = int(os.environ.get(_fit.RESTART_COUNT_ENV) or 0)
    try:
        _fit.write_atomically(
            _fit.error_file(fit_dir, restart_count, _rank()), pickle.dumps(record, protocol=4)
        )
    except OSError:
        pass


def _check_python(spec: Dict[str, Any]) -> None:
    driver = tuple(spec["python"])
    here = sys.version_info[:2]
    if driver != here:
        raise RuntimeError(
            f"the driver runs Python {driver[0]}.{driver[1]} ({spec['executable']}) and this "
            f"worker Python {here[0]}.{here[1]} ({sys.executable}): the loop function travels "
            "pickled (cloudpickle), which needs one Python version on both sides; run the "
            "workers with the driver's Python version"
        )


def _init_process_group(spec: Dict[str, Any]) -> bool:
    """Joins the run's process group as Ray's ``TorchConfig`` has the workers do; whether
    it did (not when there is no torch backend)."""
    backend = spec.get("backend") or os.environ.get("TRAINYARD_TORCH_BACKEND")
    if not backend or "MASTER_ADDR" not in os.environ:
        return False
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if backend == "nccl" and torch.cuda.is_available():
        from trainyard.train.torch import get_device

        torch.cuda.set_device(get_device())
    timeout = spec.get("timeout_s") or int(os.environ.get("TRAINYARD_TORCH_TIMEOUT_S") or 1800)
    from trainyard._warm import join_once_the_store_listens

    join_once_the_store_listens()
    dist.init_process_group(
        backend=backend,
        init_method=os.environ.get("TRAINYARD_TORCH_INIT_METHOD") or "env://",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=timeout),
    )
    return True


def main(fit_dir: str) -> int:
    spec = _fit.read_spec(fit_dir)
    try:
        _check_python(spec)
        _fit.take_driver_paths(spec)
        os.environ[_fit.FIT_DIR_ENV] = fit_dir
        from trainyard.train import _preemption

        _preemption.listen()
        if spec.get("use_gpu"):
            os.environ["TRAINYARD_USE_GPU"] = "1"
        if spec.get("resume_from"):
            os.environ.setdefault("TRAINYARD_RESUME_FROM_CHECKPOINT", spec["resume_from"])
        import cloudpickle

        with open(os.path.join(fit_dir, _fit.LOOP), "rb") as f:
            fn, config = cloudpickle.load(f)
        grouped = _init_process_group(spec)
        value = _fit.call_loop(fn, config)
        from trainyard import _client

        # The loop's ASYNC reports still on their way are sent; one that failed fails the rank.
        _client.flush()
        if _rank() == 0:
            try:
                data = cloudpickle.dumps(value)
            except Exception as error:  # noqa: BLE001 - said, not fatal
                print(
                    f"trainyard: rank 0's return value cannot be pickled ({error}): "
                    "Result.return_value is None",
                    file=sys.stderr,
                )
                data = cloudpickle.dumps(None)
            _fit.write_atomically(os.path.join(fit_dir, _fit.RETURN), data)
        if grouped:
            import torch.distributed as dist

            dist.destroy_process_group()
    except BaseException as error:
        if isinstance(error, SystemExit) and error.code in (0, None):
            raise
        _leave_error(fit_dir, error)
        raise
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m trainyard._worker FIT_DIR", file=sys.stderr)
        sys.exit(2)
    code = main(sys.argv[1])
    # The result is written: what is left is the interpreter's teardown, where torch's gloo
    # was seen to abort the process ("terminate called without an active exception",
    # SIGABRT) in its C++ destructors although the process group was destroyed, failing a
    # run that had succeeded. The user's exit handlers (``atexit``: logging's flush, a
    # tracker's ``finish``) still run; the teardown after them is skipped.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
