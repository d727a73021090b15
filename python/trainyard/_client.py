"""The report connection to the trainyard agent (report protocol 2).

The agent that runs this process names its report socket in
``TRAINYARD_REPORT_ADDR`` (``HOST:PORT``) and its token in
``TRAINYARD_REPORT_TOKEN``. The client connects, sends ``<token> 2`` and a line
end, then one JSON object per line::

    {"metrics": {...}, "checkpoint": "/abs/dir" or null}

(with ``"upload": "ASYNC"`` and ``"delete": true|false`` for an ``ASYNC`` hand-in)
and reads one line back for each::

    {"ok": true, "index": N}
    {"ok": false, "index": N, "error": "..."}

The agent reads the lines in order and answers each in order: a report with a
checkpoint only once the checkpoint's files are persisted (or failed to be),
and only after the report has gone on to the driver; an ``ASYNC`` one once the
agent has taken the files (it persists them in the background and passes the
report on in order); one without a checkpoint once it is counted.

A process keeps one connection. Its lines are written by the callers, in the
order of the calls, and the answers read by a thread of its own: ``send``
waits for its answer, ``send_later`` (what ``train.report(...,
checkpoint_upload_mode=ASYNC)`` calls) does not. The line is on its way to the
agent when ``send_later`` returns (in the socket's buffer: a process killed
right after still has it read and handed in); what one of these reports failed
with is raised by the process's next report or ``flush``, or said on stderr at
exit.

A connection that is refused, or reset before its first answer (the agent
drops connections that have not shown the token when newer ones crowd in;
the reports sent on it were never counted), is tried again with a short
backoff, its reports sent again in order, for up to
``trainyard_report.CONNECT_PATIENCE`` (10 s) in all. A connection closed
without an answer, or one that fails after answering, is an error: the report
may have counted.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Optional

# The protocol-1 module ships beside this package (the agent carries both, the wheel holds
# both) and is standard library only: the variables and the way to connect come from there.
from trainyard_report import (
    _RETRYABLE,
    ADDR_ENV,
    CONNECT_PATIENCE,
    TOKEN_ENV,
    _open_connection,
    _retry,
)

PROTOCOL = 2

# The longest answer the agent sends is far shorter; a longer line is not an answer.
_MAX_ANSWER = 64 * 1024

# How many reports may be sent and not answered yet when ``send_later`` sends one more; the
# next waits for an answer. The agent answers an ``ASYNC`` report once it has room for one
# more checkpoint to persist (two at once per rank), so at most three are on their way.
ASYNC_QUEUED = 1


class ReportError(RuntimeError):
    """The agent could not take a report: its checkpoint was not persisted.

    ``index`` is the checkpoint index the report counted as (``None`` when the
    agent did not count it), ``str(error)`` the agent's reason.
    """

    def __init__(self, message: str, index: Optional[int] = None) -> None:
        super().__init__(message)
        self.index = index


class _Report:
    """A report sent and not answered yet."""

    __slots__ = ("data", "waited", "counted", "answer", "failure", "done")

    def __init__(
        self, data: bytes, waited: bool, counted: Optional[Callable[[int], None]] = None
    ) -> None:
        self.data = data
        # Whether a caller waits for its answer (``send``), or not (``send_later``).
        self.waited = waited
        # Told the index the agent counted it as, when nobody waits for it.
        self.counted = counted
        self.answer: Optional[Dict[str, Any]] = None
        self.failure: Optional[BaseException] = None
        self.done = False


class _Channel:
    """This process's report connection, its reports on their way and the thread that
    reads their answers. Everything here is guarded by ``cond``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.sock: Optional[socket.socket] = None
        # Counts the connections; a reader of an older one stops.
        self.generation = 0
        # Since when the reports on their way wait for a first answer (``None`` once one came):
        # a connection dropped before answering is tried again until CONNECT_PATIENCE.
        self.unanswered_since: Optional[float] = None
        # Sent on the current connection, not answered yet, oldest first.
        self.pending: Deque[_Report] = deque()
        # What a report nobody waits for failed with, not raised yet (the first such).
        self.error: Optional[BaseException] = None


_channel = _Channel()
_atexit_lock = threading.Lock()
_atexit_registered = False


def _forked() -> None:
    # A child forked while a thread of the parent held the lock would wait on it for ever;
    # the parent's connection and reports on their way are the parent's.
    global _channel
    _channel = _Channel()


os.register_at_fork(after_in_child=_forked)


def address() -> Optional[str]:
    """Where reports go, or ``None`` outside trainyard."""
    return os.environ.get(ADDR_ENV) or None


def send(
    metrics: Dict[str, Any],
    checkpoint: Optional[str],
    upload: str = "SYNC",
    delete: Optional[bool] = None,
    dir_name: Optional[str] = None,
) -> int:
    """Send one report and wait for the agent's answer; its checkpoint index.

    With ``upload="ASYNC"`` the agent answers once it has taken the checkpoint's
    directory (renamed away when ``delete`` is true, the default then; its files
    hard-linked otherwise), and persists it in the background. With
    ``upload="NO_UPLOAD"`` the checkpoint is a folder in the run folder (a path
    or URI) that is registered where it is. ``dir_name`` names the folder of the
    run folder a ``SYNC`` or ``ASYNC`` checkpoint is copied to (else the index's
    own, ``checkpoint_000003``).

    Reports sent with ``send_later`` go first: it waits for their answers, and
    raises what one of them failed with instead of sending this one (as ``flush``).

    Raises ``ReportError`` when the agent says the report failed (its
    checkpoint was not persisted), ``OSError`` when the agent cannot be
    reached (within ``CONNECT_PATIENCE`` seconds, for a new connection),
    ``TypeError``/``ValueError`` when ``metrics`` is not JSON (NaN and
    infinities are not JSON either).
    """
    data = _encode(metrics, checkpoint, upload, delete, dir_name)
    report = _Report(data, waited=True)
    channel = _channel
    with channel.cond:
        _drain(channel)
        _send(channel, report)
        while not report.done:
            channel.cond.wait()
    if report.failure is not None:
        raise report.failure
    answer = report.answer or {}
    index = answer.get("index")
    if not answer.get("ok"):
        raise ReportError(str(answer.get("error", "the report failed")), index)
    return int(index) if isinstance(index, int) else -1


def send_later(
    metrics: Dict[str, Any],
    checkpoint: Optional[str],
    delete: Optional[bool],
    dir_name: Optional[str],
    counted: Optional[Callable[[int], None]] = None,
) -> None:
    """Send one ``ASYNC`` report without waiting for its answer.

    The line is written to the connection before this returns; the agent takes the
    checkpoint's directory when it reads it (so the directory must not change until
    then: write each checkpoint to a new one); ``counted`` is told the index the agent
    counted it as, from the thread that reads the answers. Waits first while ``ASYNC_QUEUED``
    reports are unanswered. Raises what an earlier report nobody waited for failed with
    (``ReportError``, ``OSError``; this one is then not sent), ``OSError`` when the agent
    cannot be reached, ``TypeError``/``ValueError`` when ``metrics`` is not JSON.
    """
    data = _encode(metrics, checkpoint, "ASYNC", delete, dir_name)
    channel = _channel
    with channel.cond:
        _raise_error(channel)
        while len(channel.pending) >= ASYNC_QUEUED:
            channel.cond.wait()
            _raise_error(channel)
        _send(channel, _Report(data, waited=False, counted=counted))


def flush() -> None:
    """Wait until every report of this process has its answer; raise what the first
    report nobody waited for failed with since the last raise (``ReportError`` with the
    agent's reason, ``OSError`` when the connection broke before it was answered)."""
    channel = _channel
    with channel.cond:
        _drain(channel)


def close() -> None:
    """Close the report connection (runs at exit; reports on their way are answered first,
    and what they failed with is said on stderr); a later report opens a new one."""
    channel = _channel
    try:
        flush()
    except Exception as error:  # noqa: BLE001 - said: nothing is left to raise it to
        print(f"trainyard: {error}", file=sys.stderr, flush=True)
    _hang_up(channel)


def abandon() -> None:
    """Drop the report connection and the reports on their way without waiting for their
    answers: a rank whose attempt was stopped leaves them to the agent, which takes what it
    has read as it would a killed rank's. A later report opens a new connection."""
    global _channel
    _hang_up(_channel)
    _channel = _Channel()


def _hang_up(channel: _Channel) -> None:
    """Closes the channel's connection; its reader stops."""
    with channel.cond:
        sock, channel.sock = channel.sock, None
        channel.generation += 1
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def _encode(
    metrics: Dict[str, Any],
    checkpoint: Optional[str],
    upload: str,
    delete: Optional[bool],
    dir_name: Optional[str],
) -> bytes:
    if address() is None:
        raise RuntimeError(f"{ADDR_ENV} is not set: not running under trainyard")
    report: Dict[str, Any] = {"metrics": metrics, "checkpoint": checkpoint}
    if upload != "SYNC":
        report["upload"] = upload
    if delete is not None:
        report["delete"] = bool(delete)
    if dir_name is not None:
        report["dir_name"] = dir_name
    line = json.dumps(report, separators=(",", ":"), allow_nan=False)
    return (line + "\n").encode("utf-8")


def _drain(channel: _Channel) -> None:
    # Called with channel.cond held.
    while channel.pending:
        channel.cond.wait()
    _raise_error(channel)


def _raise_error(channel: _Channel) -> None:
    # Called with channel.cond held.
    error, channel.error = channel.error, None
    if error is not None:
        raise error


def _send(channel: _Channel, report: _Report) -> None:
    """Write ``report`` on the connection (opened if need be) and count it on its way.
    Called with ``channel.cond`` held."""
    if channel.sock is None:
        _connect(channel)
    assert channel.sock is not None
    try:
        channel.sock.sendall(report.data)
    except _RETRYABLE:
        if channel.unanswered_since is None:
            # It answered before: the reports on their way may have counted.
            _broken(channel, ConnectionError("the trainyard agent closed the report connection"))
            raise
        # Dropped before it took anything: the reports on their way go again, this one too.
        channel.pending.append(report)
        _reconnect(channel)
        return
    except BaseException as error:
        _broken(channel, error)
        raise
    channel.pending.append(report)


def _connect(channel: _Channel) -> None:
    """Open a connection and start reading its answers. Called with ``channel.cond`` held."""
    addr = address()
    token = os.environ.get(TOKEN_ENV, "")
    if addr is None:
        raise RuntimeError(f"{ADDR_ENV} is not set: not running under trainyard")
    if not token:
        raise RuntimeError(f"{ADDR_ENV} is set but {TOKEN_ENV} is not")
    sock = _retry(lambda: _open_connection(addr, f"{token} {PROTOCOL}"))
    channel.sock = sock
    channel.generation += 1
    if channel.unanswered_since is None:
        channel.unanswered_since = time.monotonic()
    threading.Thread(
        target=_read_answers,
        args=(channel, sock, channel.generation),
        name="trainyard-report-answers",
        daemon=True,
    ).start()
    _close_at_exit()


def _reconnect(channel: _Channel) -> None:
    """The connection was dropped before it answered anything: nothing sent on it was
    counted. Opens a new one and sends the reports on their way again, in order, while
    ``CONNECT_PATIENCE`` lasts. Called with ``channel.cond`` held."""
    while True:
        started = channel.unanswered_since or time.monotonic()
        old, channel.sock = channel.sock, None
        if old is not None:
            old.close()
        if time.monotonic() - started > CONNECT_PATIENCE:
            failure = ConnectionResetError(
                "the trainyard agent dropped the report connection before answering, "
                f"for {CONNECT_PATIENCE:.0f} s"
            )
            _broken(channel, failure)
            return
        try:
            _connect(channel)
            assert channel.sock is not None
            for report in channel.pending:
                channel.sock.sendall(report.data)
            return
        except _RETRYABLE:
            time.sleep(0.05)
        except BaseException as error:  # noqa: BLE001 - given to the reports on their way
            _broken(channel, error)
            return


def _broken(channel: _Channel, failure: BaseException) -> None:
    """The connection is done with: every report on its way fails with ``failure`` (a
    waiting caller gets it; else it is kept for the next report). Called with
    ``channel.cond`` held."""
    sock, channel.sock = channel.sock, None
    channel.generation += 1
    channel.unanswered_since = None
    if sock is not None:
        sock.close()
    for report in channel.pending:
        report.failure = failure
        report.done = True
        if not report.waited and channel.error is None:
            channel.error = failure
    channel.pending.clear()
    channel.cond.notify_all()


def _read_answers(channel: _Channel, sock: socket.socket, generation: int) -> None:
    """Reads the answers of one connection, in order, until it closes or is replaced."""
    answers = sock.makefile("rb")
    try:
        while True:
            reset = False
            try:
                line = answers.readline(_MAX_ANSWER + 1)
            except OSError as error:
                line, reset = b"", isinstance(error, _RETRYABLE)
            with channel.cond:
                if channel.generation != generation:
                    return
                if not _answered(channel, line, reset):
                    return
    except BaseException as error:  # noqa: BLE001 - given to the reports on their way
        with channel.cond:
            if channel.generation == generation:
                _broken(channel, error)
    finally:
        answers.close()


def _answered(channel: _Channel, line: bytes, reset: bool) -> bool:
    """Takes one line read from the connection (``reset``: it was reset instead); whether to
    read on. Called with ``channel.cond`` held."""
    if not line.endswith(b"\n"):
        if not channel.pending:
            # Closed with nothing on its way (the agent ends): the next report reconnects.
            sock, channel.sock = channel.sock, None
            channel.generation += 1
            if sock is not None:
                sock.close()
            return False
        if reset and channel.unanswered_since is not None:
            # Dropped before the agent took it: nothing sent on it counted.
            _reconnect(channel)
        else:
            _broken(
                channel,
                ConnectionError(
                    "the trainyard agent closed the report connection without answering"
                ),
            )
        return False
    try:
        decoded = json.loads(line)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict) or not isinstance(decoded.get("ok"), bool) or not channel.pending:
        _broken(
            channel,
            ConnectionError(f"the trainyard agent's answer is not understood: {line[:200]!r}"),
        )
        return False
    channel.unanswered_since = None
    report = channel.pending.popleft()
    index = decoded.get("index")
    if report.waited:
        report.answer = decoded
        report.done = True
    elif report.counted is not None and isinstance(index, int):
        report.counted(index)
    if not report.waited and not decoded["ok"] and channel.error is None:
        why = decoded.get("error", "the report failed")
        channel.error = ReportError(
            f"an ASYNC report (checkpoint index {index}) failed: {why}", index
        )
    channel.cond.notify_all()
    return True


def _close_at_exit() -> None:
    global _atexit_registered
    with _atexit_lock:
        if not _atexit_registered:
            atexit.register(close)
            _atexit_registered = True
