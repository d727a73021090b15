"""``TorchTrainer.fit()``: one run of the ``trainyard`` binary, the same driver as the CLI's.

The loop function and its config are cloudpickled into a fresh folder (``FIT_DIR``) with
what the workers need to unpickle them (``spec.json``: Python version, working directory,
``sys.path``); ``trainyard run --log-format json ... -- python -m trainyard._worker
FIT_DIR`` runs them. Its events, one JSON object per line on stdout, are turned back into
what a Ray Train user expects: worker output printed with its rank prefix, a ``Result``,
or a ``TrainingFailedError`` whose ``worker_failures`` hold each failed rank's own
exception (``trainyard._worker`` leaves it in ``FIT_DIR``).

Ctrl-C (``KeyboardInterrupt``, a notebook's interrupt too) asks the binary to stop the
run gracefully; a second one has it kill the workers; ``fit()`` waits for the binary to
end, so no process outlives it, and raises ``KeyboardInterrupt`` then.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from trainyard import _worker
from trainyard._find_trainyard import find_trainyard_bin
from trainyard.train import Checkpoint
from trainyard.train._config import RunConfig, ScalingConfig
from trainyard.train._result import (
    ControllerError,
    Result,
    TrainingFailedError,
    WorkerGroupError,
)

RUNTIME_ENV = "TRAINYARD_RUNTIME"
_RUNTIMES = ("local", "ray", "slurm")
# The interpreter the Ray runtime drives Ray with; fit() gives it its own unless it is set.
_RAY_PYTHON_ENV = "TRAINYARD_RAY_PYTHON"

# The binary's exit codes (the CLI's contract).
_EXIT_BAD_INPUT = 2
_EXIT_INTERRUPTED = 130

# How long the binary has to end after the run's last event, or after the kill.
_END_LIMIT = 30.0


def _dumps(value: Any) -> bytes:
    """``value`` cloudpickled, its functions' code keeping the file it was defined in.

    cloudpickle (3.1 on) names every function it pickles by value ``<dynamic-code>``, so a
    rank's traceback would not say ``train.py:42``; Ray's own copy of cloudpickle keeps
    the file name, and so does this.
    """
    import io
    import types
    from collections import ChainMap

    import cloudpickle

    def reduce_code(code: types.CodeType) -> Any:
        rebuild, args = cloudpickle.cloudpickle._code_reduce(code)
        return rebuild, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)

    buffer = io.BytesIO()
    Pickler(buffer).dump(value)
    return buffer.getvalue()


def _prepare(
    fit_dir: str,
    fn: Callable[..., Any],
    config: Optional[Dict[str, Any]],
    backend: Optional[str],
    timeout_s: Optional[int],
    use_gpu: bool,
    resume_from: Optional[Checkpoint],
) -> None:
    try:
        loop = _dumps((fn, config))
    except Exception as error:
        raise TypeError(
            f"the loop function or its config cannot be pickled for the workers: {error}"
        ) from error
    with open(os.path.join(fit_dir, _worker.LOOP), "wb") as f:
        f.write(loop)
    spec = {
        "python": list(sys.version_info[:2]),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
        "backend": backend,
        "timeout_s": timeout_s,
        "use_gpu": use_gpu,
        "resume_from": resume_from.path if resume_from is not None else None,
    }
    with open(os.path.join(fit_dir, _worker.SPEC), "w", encoding="utf-8") as f:
        json.dump(spec, f)


def _command(
    binary: str,
    fit_dir: str,
    scaling: ScalingConfig,
    run: RunConfig,
    timeout_s: Optional[int],
    runtime: str,
) -> List[str]:
    args = [binary, "run", "--log-format", "json", "--runtime", runtime]
    args += scaling._cli_args(runtime)
    args += run._cli_args()
    if timeout_s is not None:
        args += ["--torch-timeout", str(timeout_s)]
    warm = _warm_modules(runtime)
    if warm:
        args += ["--warm-python", warm]
    return args + ["--", sys.executable, "-m", "trainyard._worker", fit_dir]


WARM_PYTHON_VAR = "TRAINYARD_WARM_PYTHON"


def _warm_modules(runtime: str) -> str:
    """What the workers' warm Python imports before any rank starts (``trainyard run
    --warm-python``): ``$TRAINYARD_WARM_PYTHON`` when set (empty: every rank starts cold),
    else ``torch`` where it is installed. Local runs only: on Ray and Slurm ranks start cold."""
    if runtime != "local":
        return ""
    given = os.environ.get(WARM_PYTHON_VAR)
    if given is not None:
        return given.strip()
    import importlib.util

    return "torch" if importlib.util.find_spec("torch") is not None else ""


def _die_with_parent() -> None:
    """In the binary before it starts: a driver that dies (SIGKILL, say) interrupts the
    run, as Ctrl-C would, rather than leaving it behind."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except Exception:  # noqa: BLE001 - not Linux: Ctrl-C and fit()'s own cleanup remain
        pass


_log = logging.getLogger("trainyard.train")


def _flat_keys(metrics: Dict[str, Any], prefix: str = "") -> List[str]:
    """The keys of ``metrics`` with nested ones as ``"a/b"``, as Ray flattens them."""
    keys: List[str] = []
    for key, value in metrics.items():
        if isinstance(value, dict) and value:
            keys += _flat_keys(value, f"{prefix}{key}/")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _check_score(metrics: Dict[str, Any], attribute: Optional[str]) -> None:
    """Logs Ray's error when a committed checkpoint's metrics lack the score attribute (the
    checkpoint then ranks worst, so that among such checkpoints the newest are kept)."""
    from trainyard.train._result import _lookup

    if attribute and _lookup(metrics, attribute) is None:
        _log.error(
            "Result dict has no key: %s. checkpoint_score_attr must be set to a key in the "
            "result dict. Valid keys are: %s",
            attribute,
            _flat_keys(metrics),
        )


class _Events:
    """What the run's events told, as they came."""

    def __init__(self, score_attribute: Optional[str] = None) -> None:
        self.restart_count = 0
        self.committed: List[Dict[str, Any]] = []
        self.end: Optional[Dict[str, Any]] = None
        self.score_attribute = score_attribute

    def take(self, event: Dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "log":
            stream = sys.stderr if event.get("stream") == "stderr" else sys.stdout
            print(
                f"(rank={event.get('rank')}, pid={event.get('pid')}) {event.get('line', '')}",
                file=stream,
                flush=True,
            )
        elif kind == "logs_dropped":
            print(
                f"trainyard: {event.get('count')} lines of rank {event.get('rank')}'s output "
                "were dropped (its log file keeps them)",
                file=sys.stderr,
                flush=True,
            )
        elif kind == "attempt_started":
            self.restart_count = int(event.get("restart_count", 0))
        elif kind == "checkpoint_committed":
            checkpoint = event.get("checkpoint") or {}
            self.committed.append(checkpoint)
            _check_score(dict(checkpoint.get("metrics") or {}), self.score_attribute)
        elif kind == "restarting":
            failure = event.get("failure") or {}
            print(
                f"trainyard: the attempt failed ({failure.get('kind', 'failure')}"
                f"{', rank ' + str(failure['rank']) if failure.get('rank') is not None else ''}"
                "); restarting",
                file=sys.stderr,
                flush=True,
            )
        elif kind in ("run_succeeded", "run_failed", "run_interrupted"):
            self.end = event


def _print_log_line(line: str, least: int = logging.INFO) -> None:
    """One line of the binary's stderr: its JSON log events as text (those of a level below
    ``least`` left out), anything else as is."""
    try:
        record = json.loads(line)
    except ValueError:
        print(line, file=sys.stderr, flush=True)
        return
    if not isinstance(record, dict):
        print(line, file=sys.stderr, flush=True)
        return
    level = str(record.get("level", "")).lower()
    if logging.getLevelName(level.upper()) in range(logging.NOTSET + 1, least):
        return
    message = record.get("message", "")
    skip = {"timestamp", "level", "message", "target", "span", "spans", "threadName", "threadId"}
    fields = " ".join(f"{k}={v}" for k, v in record.items() if k not in skip)
    prefix = "" if level == "info" else f"{level}: "
    print(
        f"trainyard: {prefix}{message}{' ' + fields if fields else ''}", file=sys.stderr, flush=True
    )


def _checkpoint(result: Optional[Dict[str, Any]]) -> Optional[Checkpoint]:
    return Checkpoint(result["path"]) if result and result.get("path") else None


def _rank_error(fit_dir: str, restart_count: int, rank: int, text: str) -> BaseException:
    """Rank ``rank``'s own exception when it left one that unpickles here, else a
    ``RuntimeError`` with its text (or ``text``, the driver's account)."""
    path = _worker.error_file(fit_dir, restart_count, rank)
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError):
        return RuntimeError(text)
    error: Optional[BaseException] = None
    if record.get("pickled") is not None:
        try:
            error = pickle.loads(record["pickled"])
        except Exception:  # noqa: BLE001 - its class is not importable here: the text is
            error = None
    if not isinstance(error, BaseException):
        error = RuntimeError(f"{record.get('type')}: {record.get('message')}")
    try:
        error.traceback_str = record.get("traceback", "")  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return error


def _failure_ranks(report: Optional[Dict[str, Any]]) -> List[int]:
    """The ranks the final attempt's failure names."""
    if not report or not report.get("failures"):
        return []
    failure = report["failures"][-1]
    if failure.get("rank") is not None:
        return [int(failure["rank"])]
    return [int(r) for r in failure.get("ranks", [])]


def _raise_failed(end: Dict[str, Any], fit_dir: str, restart_count: int) -> None:
    text = str(end.get("error") or "the run failed")
    report = end.get("report")
    ranks = _failure_ranks(report)
    if not ranks:
        raise ControllerError(RuntimeError(text))
    failures = {rank: _rank_error(fit_dir, restart_count, rank, text) for rank in ranks}
    blocks = []
    for rank, error in failures.items():
        trace = getattr(error, "traceback_str", None) or f"{type(error).__name__}: {error}"
        blocks.append(f"[Rank {rank}]\n{trace.rstrip()}")
    raise WorkerGroupError("\n".join(blocks), failures)


def _result(end: Dict[str, Any], fit_dir: str, keep: Optional[int]) -> Result:
    latest = end.get("checkpoint")
    # The driver names the kept checkpoints best first; Ray's Result holds the best
    # ``num_to_keep`` of them worst first.
    best = end.get("best_checkpoints") or []
    if keep is not None:
        best = best[:keep]
    best = best[::-1]
    return_value = None
    try:
        with open(os.path.join(fit_dir, _worker.RETURN), "rb") as f:
            return_value = pickle.load(f)
    except FileNotFoundError:
        pass
    return Result(
        metrics=dict(latest["metrics"]) if latest else None,
        checkpoint=_checkpoint(latest),
        error=None,
        path=end.get("run_dir"),
        best_checkpoints=[(Checkpoint(c["path"]), dict(c.get("metrics") or {})) for c in best],
        return_value=return_value,
    )


def _stop(proc: "subprocess.Popen[bytes]", interrupts: int) -> None:
    """Asks the binary to stop the run (a second time: to kill the workers)."""
    if proc.poll() is None:
        print(
            "trainyard: interrupted: stopping the run"
            if interrupts == 1
            else "trainyard: interrupted again: killing the workers",
            file=sys.stderr,
            flush=True,
        )
        proc.send_signal(signal.SIGINT)


def fit(
    fn: Callable[..., Any],
    config: Optional[Dict[str, Any]],
    *,
    scaling_config: ScalingConfig,
    run_config: RunConfig,
    backend: Optional[str] = None,
    timeout_s: Optional[int] = None,
    resume_from_checkpoint: Optional[Checkpoint] = None,
    runtime: Optional[str] = None,
) -> Result:
    """Runs ``fn`` on every worker through the ``trainyard`` binary (see the module)."""
    runtime = runtime or os.environ.get(RUNTIME_ENV) or "local"
    if runtime not in _RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(_RUNTIMES)}, got {runtime!r}")
    binary = find_trainyard_bin()
    fit_dir = tempfile.mkdtemp(prefix="trainyard-fit-")
    try:
        _prepare(
            fit_dir, fn, config, backend, timeout_s, scaling_config.use_gpu, resume_from_checkpoint
        )
        command = _command(binary, fit_dir, scaling_config, run_config, timeout_s, runtime)
        env = dict(os.environ)
        env.update(run_config._cli_env())
        if runtime == "ray" and not env.get(_RAY_PYTHON_ENV) and sys.executable:
            env[_RAY_PYTHON_ENV] = sys.executable
        return _run(command, fit_dir, run_config, env)
    finally:
        shutil.rmtree(fit_dir, ignore_errors=True)


def _run(command: List[str], fit_dir: str, run_config: RunConfig, env: Dict[str, str]) -> Result:
    proc = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Its own session: a terminal's Ctrl-C reaches this process only, which passes it
        # on, so a notebook's interrupt and a terminal's take the same path.
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    checkpoint_config = run_config.checkpoint_config
    assert checkpoint_config is not None and run_config.logging_config is not None
    events = _Events(checkpoint_config.checkpoint_score_attribute)
    least = run_config.logging_config.level
    stderr_lines: List[str] = []

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            stderr_lines.append(line)
            _print_log_line(line, least)

    pump = threading.Thread(target=pump_stderr, name="trainyard-stderr", daemon=True)
    pump.start()
    interrupts = 0
    try:
        assert proc.stdout is not None
        while True:
            try:
                raw = proc.stdout.readline()
                if not raw:
                    break
                try:
                    event = json.loads(raw)
                except ValueError:
                    print(raw.decode("utf-8", "replace"), end="", flush=True)
                    continue
                if isinstance(event, dict):
                    events.take(event)
            except KeyboardInterrupt:
                interrupts += 1
                _stop(proc, interrupts)
        code = _wait(proc)
    except BaseException:
        _kill(proc)
        raise
    finally:
        pump.join(timeout=_END_LIMIT)
    end = events.end
    if interrupts or code == _EXIT_INTERRUPTED:
        raise KeyboardInterrupt("the run was interrupted and stopped")
    if end is not None and end.get("event") == "run_succeeded":
        return _result(end, fit_dir, checkpoint_config.num_to_keep)
    if end is not None and end.get("event") == "run_failed":
        _raise_failed(end, fit_dir, events.restart_count)
    text = "\n".join(line for line in stderr_lines if line.strip()) or f"exit code {code}"
    if code == _EXIT_BAD_INPUT:
        raise ValueError(f"trainyard refused the run's configuration: {text}")
    raise TrainingFailedError(f"the trainyard driver ended without a result ({code}): {text}")


def _wait(proc: "subprocess.Popen[bytes]") -> int:
    """The binary's exit code, once it has ended (killed past ``_END_LIMIT``)."""
    interrupts = 0
    while True:
        try:
            return proc.wait(timeout=_END_LIMIT)
        except subprocess.TimeoutExpired:
            _kill(proc)
        except KeyboardInterrupt:
            interrupts += 1
            _stop(proc, 2)


def _kill(proc: "subprocess.Popen[bytes]") -> None:
    """Kills the binary and everything in its session that is still there, and reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    try:
        proc.wait(timeout=_END_LIMIT)
    except subprocess.TimeoutExpired:
        pass


__all__: Tuple[str, ...] = ("fit",)
