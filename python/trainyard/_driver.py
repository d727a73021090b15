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
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from trainyard import _fit
from trainyard._events import VERSION
from trainyard._find_trainyard import find_trainyard_bin
from trainyard.train._callback import TrainRunContext, UserCallback
from trainyard.train._checkpoint import Checkpoint
from trainyard.train._config import RunConfig, ScalingConfig
from trainyard.train._result import (
    ControllerError,
    Result,
    TrainingFailedError,
    WorkerGroupError,
    _lookup,
    sorted_by_score,
)

if TYPE_CHECKING:  # pragma: no cover
    from trainyard._validate import Validations
    from trainyard.train._validation import ValidationConfig

RUNTIME_ENV = "TRAINYARD_RUNTIME"
_RUNTIMES = ("local", "ray", "slurm")
# The interpreter the Ray runtime drives Ray with; fit() gives it its own unless it is set.
_RAY_PYTHON_ENV = "TRAINYARD_RAY_PYTHON"
# The CPUs the local runtime offers (`trainyard run --num-cpus`), as `ray.init(num_cpus=N)`
# declares the logical CPUs of Ray's local cluster; detected unless it is set.
NUM_CPUS_ENV = "TRAINYARD_NUM_CPUS"

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


def _pickle_into(fit_dir: str, name: str, value: Any, what: str, where: str) -> None:
    """Writes ``value`` cloudpickled to ``FIT_DIR/name``; ``TypeError`` when it cannot be."""
    try:
        data = _dumps(value)
    except Exception as error:
        raise TypeError(f"{what} cannot be pickled for the {where}: {error}") from error
    with open(os.path.join(fit_dir, name), "wb") as f:
        f.write(data)


def _prepare(
    fit_dir: str,
    fn: Callable[..., Any],
    config: Optional[Dict[str, Any]],
    backend: Optional[str],
    timeout_s: Optional[int],
    use_gpu: bool,
    resume_from: Optional[Checkpoint],
    run_config: RunConfig,
    validation: Optional["ValidationConfig"] = None,
) -> None:
    _pickle_into(fit_dir, _fit.LOOP, (fn, config), "the loop function or its config", "workers")
    if validation is not None:
        _pickle_into(fit_dir, _fit.VALIDATION, validation, "the validation function", "process")
    checkpoint_config = run_config.checkpoint_config
    assert checkpoint_config is not None
    spec = {
        "python": list(sys.version_info[:2]),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
        "backend": backend,
        "timeout_s": timeout_s,
        "use_gpu": use_gpu,
        "resume_from": resume_from.path if resume_from is not None else None,
        "validation": validation is not None,
        "in_place": os.environ.get(_fit.IN_PLACE_VAR, "1") != "0",
        "checkpoint_score": {
            "attribute": checkpoint_config.checkpoint_score_attribute,
            "order": checkpoint_config.checkpoint_score_order,
        },
    }
    with open(os.path.join(fit_dir, _fit.SPEC), "w", encoding="utf-8") as f:
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
    num_cpus = os.environ.get(NUM_CPUS_ENV, "").strip()
    if runtime == "local" and num_cpus:
        args += ["--num-cpus", num_cpus]
    args += scaling._cli_args(runtime)
    args += run._cli_args()
    if timeout_s is not None:
        args += ["--torch-timeout", str(timeout_s)]
    warm = _warm_modules()
    if warm:
        args += ["--warm-python", warm]
    return args + ["--", sys.executable, "-m", "trainyard._worker", fit_dir]


WARM_PYTHON_VAR = "TRAINYARD_WARM_PYTHON"


def _warm_modules() -> str:
    """What the workers' warm Python imports before any rank starts (``trainyard run
    --warm-python``): ``$TRAINYARD_WARM_PYTHON`` when set (empty: every rank starts cold),
    else ``torch`` where it is installed. Locally one warm Python serves the run; on Ray and
    Slurm each worker's agent starts its own next to it."""
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
    if attribute and _lookup(metrics, attribute) is None:
        _log.error(
            "Result dict has no key: %s. checkpoint_score_attr must be set to a key in the "
            "result dict. Valid keys are: %s",
            attribute,
            _flat_keys(metrics),
        )


def _failure_of_ranks(failure: Optional[Dict[str, Any]]) -> List[int]:
    """The ranks an attempt's failure names (none for a failure of the run's own)."""
    if not failure:
        return []
    if failure.get("rank") is not None:
        return [int(failure["rank"])]
    return [int(r) for r in failure.get("ranks", [])]


class _Events:
    """What the run's events told, as they came (``trainyard._events`` is the contract): the
    run's output printed, its committed checkpoints, its end; the ``UserCallback``s called;
    the validations asked for; and the fit's ``progress.json`` kept for the workers.

    A report round is complete once every rank of the attempt has made it. When a rank noted
    a checkpoint for it (``trainyard._fit``), the round waits for the next event: the
    checkpoint's commit comes right after the round's last report, or the checkpoint was not
    committed.
    """

    def __init__(
        self,
        fit_dir: Optional[str] = None,
        score_attribute: Optional[str] = None,
        callbacks: Sequence[UserCallback] = (),
        run_context: Optional[TrainRunContext] = None,
        validations: Optional["Validations"] = None,
        stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.fit_dir = fit_dir
        self.score_attribute = score_attribute
        self.callbacks = list(callbacks)
        self.run_context = run_context
        self.validations = validations
        self.stop = stop
        self.restart_count = 0
        self.world_size = 0
        self.run_dir: Optional[str] = None
        self.committed: List[Dict[str, Any]] = []
        self.end: Optional[Dict[str, Any]] = None
        self.callback_error: Optional[BaseException] = None
        # This attempt's rounds not yet complete: step -> rank -> metrics.
        self._rounds: Dict[int, Dict[int, Dict[str, Any]]] = {}
        # Rounds of this attempt a rank handed in a checkpoint with: their commit follows.
        self._with_checkpoint: Set[int] = set()
        self._done = 0
        self._waiting: Optional[Tuple[int, List[Dict[str, Any]]]] = None
        self._warned_version = False
        self._progress_lock = threading.Lock()
        self._handlers: Dict[str, Callable[[Dict[str, Any]], None]] = {
            "run_started": self._run_started,
            "placing": self._quiet,
            "placed": self._quiet,
            "attempt_started": self._attempt_started,
            "task_started": self._quiet,
            "report": self._report,
            "log": self._log,
            "logs_dropped": self._logs_dropped,
            "resuming": self._quiet,
            "checkpoint_committed": self._checkpoint_committed,
            "log_files": self._quiet,
            "stacks": self._quiet,
            "resized": self._quiet,
            "restarting": self._restarting,
            "run_succeeded": self._ended,
            "run_failed": self._run_failed,
            "run_interrupted": self._ended,
        }

    def handled_kinds(self) -> List[str]:
        """Every kind this reader has a handler for."""
        return sorted(self._handlers)

    def take(self, event: Dict[str, Any]) -> None:
        """Takes in one event of the stream."""
        self._check_version(event)
        kind = event.get("event")
        pending, self._waiting = self._waiting, None
        matched = (
            pending is not None
            and kind == "checkpoint_committed"
            and (event.get("checkpoint") or {}).get("index") == pending[0]
        )
        if pending is not None and not matched:
            self._round(pending[0], pending[1], None)
        handler = self._handlers.get(str(kind))
        if handler is not None:
            handler(event)
        if matched and pending is not None:
            self._round(pending[0], pending[1], _checkpoint(event.get("checkpoint")))

    def finish(self) -> None:
        """The stream has ended: a round still waiting for its checkpoint has none."""
        pending, self._waiting = self._waiting, None
        if pending is not None:
            self._round(pending[0], pending[1], None)

    def _check_version(self, event: Dict[str, Any]) -> None:
        version = event.get("v")
        if isinstance(version, int) and version > VERSION and not self._warned_version:
            self._warned_version = True
            warnings.warn(
                f"the trainyard binary writes version {version} of the run's event stream and "
                f"this trainyard package reads version {VERSION}: what is newer is passed over; "
                "install the package and the binary of one release (pip install the same "
                "trainyard wheel)",
                RuntimeWarning,
                stacklevel=2,
            )

    # --- the kinds ---------------------------------------------------------------------------

    def _quiet(self, event: Dict[str, Any]) -> None:
        """Kinds the Python driver shows nothing of (the binary's logs say what matters)."""

    def _run_started(self, event: Dict[str, Any]) -> None:
        self.run_dir = event.get("run_dir")

    def _log(self, event: Dict[str, Any]) -> None:
        stream = sys.stderr if event.get("stream") == "stderr" else sys.stdout
        print(
            f"(rank={event.get('rank')}, pid={event.get('pid')}) {event.get('line', '')}",
            file=stream,
            flush=True,
        )

    def _logs_dropped(self, event: Dict[str, Any]) -> None:
        print(
            f"trainyard: {event.get('count')} lines of rank {event.get('rank')}'s output "
            "were dropped (its log file keeps them)",
            file=sys.stderr,
            flush=True,
        )

    def _attempt_started(self, event: Dict[str, Any]) -> None:
        self.restart_count = int(event.get("restart_count", 0))
        self.world_size = int(event.get("world_size", 0))
        self._rounds = {}
        self._with_checkpoint = set()
        self._done = 0
        self._write_progress()

    def _report(self, event: Dict[str, Any]) -> None:
        if self.world_size <= 0:
            return
        step = int(event.get("step") or 0)
        rank = int(event.get("rank", 0))
        round_ = self._rounds.setdefault(step, {})
        round_[rank] = dict(event.get("metrics") or {})
        if event.get("checkpoint"):
            self._with_checkpoint.add(step)
        if len(round_) < self.world_size:
            return
        del self._rounds[step]
        metrics = [round_[r] for r in sorted(round_)]
        if step in self._with_checkpoint:
            self._with_checkpoint.discard(step)
            self._waiting = (step, metrics)
        else:
            self._round(step, metrics, None)

    def _checkpoint_committed(self, event: Dict[str, Any]) -> None:
        checkpoint = event.get("checkpoint") or {}
        self.committed.append(checkpoint)
        _check_score(dict(checkpoint.get("metrics") or {}), self.score_attribute)
        request = self._validation_asked(int(checkpoint.get("index", -1)))
        if request and self.validations is not None and checkpoint.get("path"):
            self.validations.request(int(checkpoint["index"]), checkpoint["path"], request)

    def _restarting(self, event: Dict[str, Any]) -> None:
        failure = event.get("failure") or {}
        print(
            f"trainyard: the attempt failed ({failure.get('kind', 'failure')}"
            f"{', rank ' + str(failure['rank']) if failure.get('rank') is not None else ''}"
            "); restarting",
            file=sys.stderr,
            flush=True,
        )
        self._failed(int(event.get("restart_count", self.restart_count)), failure)

    def _run_failed(self, event: Dict[str, Any]) -> None:
        self.end = event
        report = event.get("report") or {}
        failures = report.get("failures") or []
        if failures:
            self._failed(self.restart_count, failures[-1])

    def _ended(self, event: Dict[str, Any]) -> None:
        self.end = event

    # --- rounds, callbacks, progress -------------------------------------------------------

    def _validation_asked(self, index: int) -> Any:
        """What the report of checkpoint ``index`` asked to validate: the lowest rank's note
        decides, as Ray takes the first rank's report with a checkpoint."""
        if self.fit_dir is None:
            return False
        for rank in range(max(self.world_size, 1)):
            note = _fit.read_json(_fit.note_file(self.fit_dir, index, rank))
            if note is not None:
                return note.get("validation") or False
        return False

    def _round(self, step: int, metrics: List[Dict[str, Any]], checkpoint: Any) -> None:
        self._done = max(self._done, step)
        self._write_progress()
        self._call("after_report", metrics=metrics, checkpoint=checkpoint)

    def _failed(self, restart_count: int, failure: Dict[str, Any]) -> None:
        ranks = _failure_of_ranks(failure)
        if not ranks:
            return
        cause = failure.get("cause") or failure.get("failure")
        account = f"{failure.get('kind', 'failure')}{f' ({cause})' if cause else ''}"
        exceptions: Dict[int, BaseException] = {}
        for rank in ranks:
            text = f"rank {rank} failed: {account}"
            exceptions[rank] = (
                RuntimeError(text)
                if self.fit_dir is None
                else _rank_error(self.fit_dir, restart_count, rank, text)
            )
        self._call("after_exception", worker_exceptions=exceptions)

    def _call(self, hook: str, **arguments: Any) -> None:
        if self.callback_error is not None:
            return
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(run_context=self.run_context, **arguments)
            except Exception as error:  # noqa: BLE001 - it ends the run, as in Ray
                self.callback_error = error
                print(
                    f"trainyard: {type(callback).__name__}.{hook} raised {error!r}: stopping "
                    "the run",
                    file=sys.stderr,
                    flush=True,
                )
                self.stop()
                return

    def write_progress(self) -> None:
        """Replaces the fit's ``progress.json`` with what is known now."""
        self._write_progress()

    def _write_progress(self) -> None:
        if self.fit_dir is None:
            return
        validations: Dict[str, Any] = {}
        if self.validations is not None:
            for index, (status, metrics) in self.validations.states().items():
                validations[str(index)] = {"status": status, "metrics": metrics}
        progress = {"attempt": self.restart_count, "step": self._done, "validations": validations}
        try:
            data = json.dumps(progress, default=repr).encode()
        except ValueError:
            data = json.dumps({**progress, "validations": {}}).encode()
        with self._progress_lock:
            _fit.write_atomically(os.path.join(self.fit_dir, _fit.PROGRESS), data)


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
    path = _fit.error_file(fit_dir, restart_count, rank)
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


def _raise_failed(end: Dict[str, Any], fit_dir: str, restart_count: int) -> None:
    text = str(end.get("error") or "the run failed")
    failures_seen = (end.get("report") or {}).get("failures") or []
    ranks = _failure_of_ranks(failures_seen[-1] if failures_seen else None)
    if not ranks:
        raise ControllerError(RuntimeError(text))
    failures = {rank: _rank_error(fit_dir, restart_count, rank, text) for rank in ranks}
    blocks = []
    for rank, error in failures.items():
        trace = getattr(error, "traceback_str", None) or f"{type(error).__name__}: {error}"
        blocks.append(f"[Rank {rank}]\n{trace.rstrip()}")
    raise WorkerGroupError("\n".join(blocks), failures)


def _validated(
    checkpoint: Dict[str, Any], validations: Dict[int, Tuple[str, Dict[str, Any]]]
) -> Dict[str, Any]:
    """A checkpoint's metrics, with its validation's merged in once it is validated (as
    Ray's: a validation's metric replaces a reported one of the same name)."""
    metrics = dict(checkpoint.get("metrics") or {})
    status, extra = validations.get(int(checkpoint.get("index", -1)), ("", {}))
    if status == "VALIDATED":
        metrics.update(extra)
    return metrics


def _result(
    end: Dict[str, Any],
    fit_dir: str,
    run_config: RunConfig,
    validations: Optional[Dict[int, Tuple[str, Dict[str, Any]]]] = None,
) -> Result:
    validations = validations or {}
    checkpoint_config = run_config.checkpoint_config
    assert checkpoint_config is not None
    latest = end.get("checkpoint")
    # The driver names the kept checkpoints best first; Ray's Result holds the best
    # ``num_to_keep`` of them worst first.
    best = end.get("best_checkpoints") or []
    if checkpoint_config.num_to_keep is not None:
        best = best[: checkpoint_config.num_to_keep]
    best = best[::-1]
    pairs = [(c, _validated(c, validations)) for c in best]
    if any(c.get("metrics") != m for c, m in pairs):
        # Validation metrics may score: Ray sorts its checkpoints again once one is validated.
        pairs = sorted_by_score(
            sorted(pairs, key=lambda p: int(p[0].get("index", 0))),
            lambda p: p[1],
            checkpoint_config.checkpoint_score_attribute,
            checkpoint_config.checkpoint_score_order,
        )
    return_value = None
    try:
        with open(os.path.join(fit_dir, _fit.RETURN), "rb") as f:
            return_value = pickle.load(f)
    except FileNotFoundError:
        pass
    return Result(
        metrics=_validated(latest, validations) if latest else None,
        checkpoint=_checkpoint(latest),
        error=None,
        path=end.get("run_dir"),
        best_checkpoints=[(Checkpoint(c["path"]), m) for c, m in pairs],
        return_value=return_value,
    )


def _stop(proc: "subprocess.Popen[bytes]", interrupts: int, why: Optional[str] = None) -> None:
    """Asks the binary to stop the run (a second time: to kill the workers)."""
    if proc.poll() is None:
        if why is None:
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
    validation_config: Optional["ValidationConfig"] = None,
    backend_config: Any = None,
) -> Result:
    """Runs ``fn`` on every worker through the ``trainyard`` binary (see the module)."""
    runtime = runtime or os.environ.get(RUNTIME_ENV) or "local"
    if runtime not in _RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(_RUNTIMES)}, got {runtime!r}")
    binary = find_trainyard_bin()
    fit_dir = tempfile.mkdtemp(prefix="trainyard-fit-")
    try:
        _prepare(
            fit_dir,
            fn,
            config,
            backend,
            timeout_s,
            scaling_config.use_gpu,
            resume_from_checkpoint,
            run_config,
            validation_config,
        )
        command = _command(binary, fit_dir, scaling_config, run_config, timeout_s, runtime)
        env = dict(os.environ)
        env.update(run_config._cli_env())
        if runtime == "ray" and not env.get(_RAY_PYTHON_ENV) and sys.executable:
            env[_RAY_PYTHON_ENV] = sys.executable
        context = TrainRunContext(
            run_config=run_config,
            train_loop_config=config,
            scaling_config=scaling_config,
            backend_config=backend_config,
        )
        return _run(command, fit_dir, run_config, env, context, validation_config)
    finally:
        shutil.rmtree(fit_dir, ignore_errors=True)


def _run(
    command: List[str],
    fit_dir: str,
    run_config: RunConfig,
    env: Dict[str, str],
    context: Optional[TrainRunContext] = None,
    validation_config: Optional["ValidationConfig"] = None,
) -> Result:
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
    validations: Optional["Validations"] = None
    events = _Events(
        fit_dir,
        checkpoint_config.checkpoint_score_attribute,
        callbacks=run_config.callbacks or [],
        run_context=context,
        stop=lambda: _stop(proc, 1, "a callback raised"),
    )
    if validation_config is not None:
        from trainyard._validate import Validations

        validations = Validations(
            fit_dir, validation_config.task_config.timeout_s, events.write_progress
        )
        events.validations = validations
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
    succeeded = False
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
        events.finish()
        code = _wait(proc)
        end = events.end
        succeeded = (
            not interrupts
            and events.callback_error is None
            and end is not None
            and end.get("event") == "run_succeeded"
        )
        if validations is not None:
            # Ray's trainer returns once every validation has ended.
            validations.finish(wait=succeeded)
    except BaseException:
        _kill(proc)
        if validations is not None:
            validations.finish(wait=False)
        raise
    finally:
        pump.join(timeout=_END_LIMIT)
    if events.callback_error is not None:
        raise ControllerError(events.callback_error)
    if interrupts or code == _EXIT_INTERRUPTED:
        raise KeyboardInterrupt("the run was interrupted and stopped")
    if succeeded and end is not None:
        states = validations.states() if validations is not None else {}
        return _result(end, fit_dir, run_config, states)
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
