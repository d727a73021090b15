"""Checkpoint validation off the training path: the driver's side (``Validations``) and the
validating process (``python -m trainyard._validate FIT_DIR RESULT_FD``).

The driver of a ``TorchTrainer`` with a ``validation_config`` asks for a validation when a
checkpoint whose report asked for one commits. Validations run one at a time, in the order
asked, in one Python process of their own on the driver's machine (started with the first,
kept for the next ones as Ray keeps its worker, started again after a timeout killed it). The
process takes the driver's working directory and ``sys.path``, loads the ``ValidationConfig``
(``validation.pkl``), and for each request on its stdin (one JSON line: index, checkpoint
path, the report's ``validation``) calls ``fn(checkpoint, **fn_kwargs)`` (the config's
``fn_kwargs`` overridden by the report's), leaves what it returned or raised in
``FIT_DIR/validation/<index>.pkl`` and writes the index on ``RESULT_FD``. Its own output goes
where the driver's goes.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from trainyard import _fit

RESULTS = "validation"

_log = logging.getLogger("trainyard.train")

PENDING = "PENDING_VALIDATION"
VALIDATED = "VALIDATED"
TIMEOUT = "VALIDATION_TIMEOUT"
FAILED = "VALIDATION_FAILED"


def _result_file(fit_dir: str, index: int) -> str:
    return os.path.join(fit_dir, RESULTS, f"{index}.pkl")


class Validations:
    """The validations of one ``fit()``: asked for as checkpoints commit, run one at a time
    by a thread of the driver, each checkpoint's status and metrics kept here."""

    def __init__(
        self, fit_dir: str, default_timeout_s: Optional[float], changed: Callable[[], None]
    ) -> None:
        self._fit_dir = fit_dir
        self._default_timeout_s = default_timeout_s
        self._changed = changed
        self._lock = threading.Condition()
        self._queue: Deque[Tuple[int, str, Any]] = deque()
        self._states: Dict[int, Tuple[str, Dict[str, Any]]] = {}
        self._busy = False
        self._closing = False
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._results: Optional[int] = None
        self._thread = threading.Thread(target=self._run, name="trainyard-validation", daemon=True)
        self._thread.start()

    def request(self, index: int, path: str, request: Any) -> None:
        """Validates checkpoint ``index`` (at ``path``) as its report asked (``True`` or
        ``{"fn_kwargs", "timeout_s"}``)."""
        with self._lock:
            self._states[index] = (PENDING, {})
            self._queue.append((index, path, request))
            self._lock.notify_all()
        self._changed()

    def states(self) -> Dict[int, Tuple[str, Dict[str, Any]]]:
        """Each checkpoint asked for: its status and (validated) the validation's metrics."""
        with self._lock:
            return dict(self._states)

    def finish(self, wait: bool) -> None:
        """Waits for every validation asked for to end (``wait``), or stops the one running
        (those not run stay pending); then ends the validating process."""
        with self._lock:
            if wait:
                while self._queue or self._busy:
                    self._lock.wait()
            self._closing = True
            self._queue.clear()
            self._lock.notify_all()
        if not wait:
            self._stop_process()
        self._thread.join()
        self._stop_process()

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                index, path, request = self._queue.popleft()
                self._busy = True
            try:
                state = self._validate(index, path, request)
            except Exception as error:  # noqa: BLE001 - the run goes on; said here
                if self._closing:
                    # Stopped with the run (Ray cancels it too): it stays pending.
                    state = (PENDING, {})
                else:
                    _log.error("Validation failed for checkpoint %s: %s", path, error)
                    state = (FAILED, {})
            with self._lock:
                if self._states.get(index, (PENDING,))[0] == PENDING:
                    self._states[index] = state
                self._busy = False
                self._lock.notify_all()
            self._changed()

    def _validate(self, index: int, path: str, request: Any) -> Tuple[str, Dict[str, Any]]:
        # Ray's: a report's ValidationTaskConfig brings its own timeout (None: none), a
        # report's ``True`` the config's.
        timeout = request.get("timeout_s") if isinstance(request, dict) else self._default_timeout_s
        proc = self._process()
        assert proc.stdin is not None and self._results is not None
        line = json.dumps({"index": index, "path": path, "request": request}) + "\n"
        try:
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        except OSError:
            pass
        if not self._wait_result(index, timeout):
            if self._closing:
                return PENDING, {}
            if proc.poll() is None:
                _log.warning(
                    "Validation for checkpoint %s exceeded timeout_s=%ss. Cancelling.",
                    path,
                    timeout,
                )
                self._stop_process()
                return TIMEOUT, {}
            self._stop_process()
            _log.error(
                "Validation failed for checkpoint %s: its process ended (exit code %s)",
                path,
                proc.returncode,
            )
            return FAILED, {}
        with open(_result_file(self._fit_dir, index), "rb") as f:
            outcome = pickle.load(f)
        if outcome.get("error") is not None:
            _log.error("Validation failed for checkpoint %s\n%s", path, outcome["error"].rstrip())
            return FAILED, {}
        return VALIDATED, dict(outcome["metrics"])

    def _wait_result(self, index: int, timeout: Optional[float]) -> bool:
        """Whether the validating process answered ``index`` within ``timeout`` seconds (or
        for ever); ``False`` also when it ended without answering. It runs one validation at
        a time, so its next line is this one's answer."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        buffer = b""
        assert self._results is not None
        while not buffer.endswith(b"\n"):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._results], [], [], left)
            if not ready:
                return False
            chunk = os.read(self._results, 4096)
            if not chunk:
                return False
            buffer += chunk
        return buffer.strip() == str(index).encode()

    def _process(self) -> "subprocess.Popen[bytes]":
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        read, write = os.pipe()
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(_fit.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "trainyard._validate", self._fit_dir, str(write)],
                stdin=subprocess.PIPE,
                pass_fds=(write,),
                env=env,
            )
        finally:
            os.close(write)
        self._results = read
        return self._proc

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        if self._results is not None:
            os.close(self._results)
            self._results = None


# --- the validating process ------------------------------------------------------------------


def _kwargs(config: Any, request: Any) -> Dict[str, Any]:
    """Ray's merge: the config's ``fn_kwargs``, overridden by the report's."""
    defaults = dict(config.task_config.fn_kwargs or {})
    if isinstance(request, dict):
        defaults.update(request.get("fn_kwargs") or {})
    return defaults


def main(fit_dir: str, results: int) -> int:
    import traceback

    import cloudpickle

    spec = _fit.read_spec(fit_dir)
    _fit.take_driver_paths(spec)
    with open(os.path.join(fit_dir, _fit.VALIDATION), "rb") as f:
        config = cloudpickle.load(f)
    from trainyard.train._checkpoint import Checkpoint

    for line in sys.stdin:
        asked = json.loads(line)
        index = int(asked["index"])
        outcome: Dict[str, Any] = {"metrics": None, "error": None}
        try:
            metrics = config.fn(Checkpoint(asked["path"]), **_kwargs(config, asked["request"]))
            if not isinstance(metrics, dict):
                raise ValueError(
                    "The validation function must return a dictionary of metrics. "
                    f"Got {type(metrics)} instead."
                )
            outcome["metrics"] = metrics
            data = cloudpickle.dumps(outcome)
        except Exception:  # noqa: BLE001 - the driver says it and goes on
            outcome = {"metrics": None, "error": traceback.format_exc()}
            data = pickle.dumps(outcome)
        _fit.write_atomically(_result_file(fit_dir, index), data)
        os.write(results, f"{index}\n".encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
