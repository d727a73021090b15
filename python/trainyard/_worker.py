"""The worker side of ``TorchTrainer.fit()``: ``python -m trainyard._worker FIT_DIR``.

The driver writes into ``FIT_DIR`` the loop function and its config and ``spec.json`` (see
``trainyard._fit``). Each rank checks the Python version, takes the driver's working
directory and ``sys.path``, notes a scheduler's pre-emption warning from then on
(``SIGUSR1``, see ``trainyard.train._preemption``), joins the run's ``torch.distributed``
process group, calls the loop function, and leaves behind in ``FIT_DIR``: rank 0 its return
value; a rank that raises, its exception, which the driver raises again within
``WorkerGroupError.worker_failures``.

A rank forked by the warm Python restarts in place: when its loop function raised (said and
left for the driver as above; its agent told it failed with exit code 1), or it was stopped
for a restart (its agent's SIGTERM while the loop runs: the loop unwinds, its ``finally``
blocks run; see ``_Unwinding`` for a loop that does not), it leaves the process group,
forgets the attempt's reports and parks (``trainyard._warm.park``); the next attempt's task
for its worker is handed to it, and it calls the loop function again in the same process,
with the new attempt's environment. A run that ends has its parked ranks ended with their
agents (their exit handlers run). A SIGTERM outside the loop, a loop that does not unwind
within ``UNWIND_PATIENCE_S``, a loop whose modules handle SIGTERM themselves, or
``TRAINYARD_RESTART_IN_PLACE=0`` on the driver (a loop that leaves state behind in its
modules) ends the process as before, and the rank starts as a new fork.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
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


class _Restart(BaseException):
    """Raised in the loop by SIGTERM where the rank restarts in place (not an ``Exception``,
    so that the loop's ``except Exception`` lets it through)."""


def _restart_on_sigterm(signum: int, frame: Any) -> None:
    # A second SIGTERM, while this one unwinds or the rank is parked, ends the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise _Restart()


# How long a rank stopped for a restart may take to unwind its loop and leave the process
# group before it ends as the SIGTERM would have ended it (its agent waits 5 s, then kills).
UNWIND_PATIENCE_S = 2.0


class _Unwinding:
    """A rank's stop for a restart, while its loop runs: SIGTERM raises ``_Restart`` in the
    loop (unless the loop's modules took SIGTERM for themselves: theirs is left alone), and a
    watcher woken by the signal itself (a wake-up pipe, so also while the loop is blocked in
    C: a collective waiting for a dead peer) ends the process as the SIGTERM would have
    (exit 143) if the rank has not come to park within ``UNWIND_PATIENCE_S``: a loop blocked
    for good, or one that swallowed ``_Restart``. Then the rank starts as a new fork."""

    def __init__(self) -> None:
        self.armed = False
        self.done = threading.Event()

    def arm(self) -> None:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        self.armed = True
        woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGTERM, _restart_on_sigterm)
        self.previous = signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
        threading.Thread(
            target=self._watch, args=(woken_r, woken_w), name="trainyard-unwind", daemon=True
        ).start()

    def loop_ended(self) -> None:
        """The loop returned or raised: SIGTERM ends the process from now on."""
        if self.armed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.set_wakeup_fd(self.previous)

    def _watch(self, woken_r: int, woken_w: int) -> None:
        import select

        try:
            while not self.done.is_set():
                if not select.select([woken_r], [], [], 0.2)[0]:
                    continue
                try:
                    woke = os.read(woken_r, 64)
                except BlockingIOError:
                    continue
                if signal.SIGTERM in woke and not self.done.wait(UNWIND_PATIENCE_S):
                    os._exit(128 + signal.SIGTERM)
        finally:
            os.close(woken_r)
            os.close(woken_w)


def _undo_attempt() -> None:
    """What a stopped attempt left in this process that the next must not find: its process
    group, its report connection and what the rank knew of its reports."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a group whose peers are gone is let go all the same
            pass
    from trainyard import _client, train

    _client.abandon()
    train._forget_attempt()


def main(fit_dir: str) -> int:
    """Runs the loop function, again in place after each restart where it can."""
    spec = _fit.read_spec(fit_dir)
    from trainyard import _warm

    parking = _warm.park_socket()
    if parking is not None and not spec.get("in_place", True):
        parking[0].close()
        parking = None
    while True:
        unwinding = _Unwinding() if parking is not None else None
        try:
            return _attempt(fit_dir, spec, unwinding)
        except _Restart:
            status = signal.SIGTERM
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as error:
            if parking is None:
                raise
            # Said as Python says it, and told as the exit of 1 it ends with: the rank's
            # failure is judged by the run as any other.
            tb = error.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            sys.excepthook(type(error), error, tb or error.__traceback__)
            status = 1 << 8
        assert unwinding is not None
        _undo_attempt()
        import gc

        gc.collect()
        unwinding.done.set()
        _warm.park(*parking, status=status)
        spec = _fit.read_spec(fit_dir)


def _attempt(fit_dir: str, spec: Dict[str, Any], unwinding: Optional[_Unwinding]) -> int:
    """One attempt's loop: raises ``_Restart`` when it was stopped for a restart in place
    (with `unwinding`: the rank restarts in place)."""
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
        if unwinding is not None:
            unwinding.arm()
        try:
            grouped = _init_process_group(spec)
            value = _fit.call_loop(fn, config)
        finally:
            if unwinding is not None:
                unwinding.loop_ended()
        if unwinding is not None:
            unwinding.done.set()
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
    except _Restart:
        raise
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
