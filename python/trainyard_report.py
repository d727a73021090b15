"""Report metrics from a worker process to the trainyard driver.

Dependency-free (standard library only). Typical use in a training script::

    import trainyard_report

    for step in range(steps):
        loss = train_step()
        trainyard_report.report({"step": step, "loss": loss})

Protocol: the driver sets ``TRAINYARD_REPORT_ADDR`` (``HOST:PORT``, TCP) and
``TRAINYARD_REPORT_TOKEN`` (64 hex characters) in the worker's environment.
On the first report this module connects, sends the token followed by ``\\n``,
then every report as one compact JSON object per line. Nothing is read back.
The connection stays open and is shut down for writing, then closed, when the
interpreter exits, so the driver sees EOF after the last line.

A connection that is refused, or reset before the first report on it went
out, is tried again, after 50 ms and then twice as long each time (up to 1 s),
for up to 10 s in all: the agent drops connections that have not shown the
token yet when newer ones crowd in (another user's idle connections, say).
As nothing is read back, a connection dropped just after its first report
went out loses that report, and the next write raises ``OSError``;
``trainyard.train.report`` (protocol 2) waits for each answer and has no such
gap.

Without ``TRAINYARD_REPORT_ADDR`` (e.g. under torchrun) each report is printed
to stderr as ``trainyard_report: {...}`` instead.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, TypeVar

__all__ = ["report", "close", "world_rank", "local_rank", "world_size"]

ADDR_ENV = "TRAINYARD_REPORT_ADDR"
TOKEN_ENV = "TRAINYARD_REPORT_TOKEN"
STDERR_PREFIX = "trainyard_report: "

# How long, in seconds, a report connection is tried in all, and the pauses between tries.
CONNECT_PATIENCE = 10.0
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 1.0

# The agent refused the connection, or dropped it before it read the first line (a newer
# connection took its place): nothing sent on it was taken, and a new one may be tried.
_RETRYABLE = (
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)

_T = TypeVar("_T")

_lock = threading.Lock()
_sock: Optional[socket.socket] = None
_atexit_registered = False


def _parse_addr(addr: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` also accepted) into host and port."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{ADDR_ENV} must be HOST:PORT, got {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _open_connection(addr: str, hello: str) -> socket.socket:
    """Connect to the report socket at ``addr`` and send ``hello``, the first line.

    Both protocols open their connection so (``trainyard._client`` speaks 2);
    this module stays standard library only, with nothing of the package.
    """
    sock = socket.create_connection(_parse_addr(addr))
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(hello.encode("ascii") + b"\n")
    except BaseException:
        sock.close()
        raise
    return sock


def _retry(attempt: Callable[[], _T]) -> _T:
    """Call ``attempt`` until it does not fail with a refused or reset connection.

    Pauses 50 ms after the first failure, twice as long after each next one (at
    most 1 s), and gives up after ``CONNECT_PATIENCE`` seconds in all, raising
    the last failure. Other errors are raised at once.
    """
    deadline = time.monotonic() + CONNECT_PATIENCE
    pause = _FIRST_PAUSE
    while True:
        try:
            return attempt()
        except _RETRYABLE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise
            time.sleep(min(pause, remaining))
            pause = min(2 * pause, _LONGEST_PAUSE)


def _connect(addr: str) -> socket.socket:
    """Open the report connection and send the token line."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise RuntimeError(f"{ADDR_ENV} is set but {TOKEN_ENV} is not")
    return _open_connection(addr, token)


def report(metrics: Mapping[str, Any]) -> None:
    """Send one report (a JSON-serializable mapping) to the trainyard driver.

    The first call connects to ``TRAINYARD_REPORT_ADDR``; later calls reuse
    the connection. Safe to call from several threads. If
    ``TRAINYARD_REPORT_ADDR`` is unset, the JSON is printed to stderr prefixed
    with ``trainyard_report: `` instead.

    Raises ``TypeError``/``ValueError`` if ``metrics`` is not JSON-serializable
    and ``OSError`` if the driver cannot be reached (within ``CONNECT_PATIENCE``
    seconds, for a new connection).
    """
    global _sock, _atexit_registered
    line = json.dumps(metrics, separators=(",", ":"))
    addr = os.environ.get(ADDR_ENV)
    if not addr:
        with _lock:
            # one write() per line, even when stderr is unbuffered
            print(STDERR_PREFIX + line + "\n", end="", file=sys.stderr, flush=True)
        return
    data = (line + "\n").encode("utf-8")

    def first() -> socket.socket:
        sock = _connect(addr)
        try:
            sock.sendall(data)
        except BaseException:
            sock.close()
            raise
        return sock

    with _lock:
        if _sock is not None:
            _sock.sendall(data)
            return
        _sock = _retry(first)
        if not _atexit_registered:
            atexit.register(close)
            _atexit_registered = True


def close() -> None:
    """Shut down and close the report connection (runs automatically at exit).

    A later ``report`` call opens a new connection.
    """
    global _sock
    with _lock:
        sock, _sock = _sock, None
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()


def _env_int(*names: str, default: int) -> int:
    """The first of ``names`` set in the environment, as an int."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip() != "":
            return int(value)
    return default


def world_rank() -> int:
    """Global rank of this worker: ``RANK``, else ``TRAINYARD_WORLD_RANK``, else 0."""
    return _env_int("RANK", "TRAINYARD_WORLD_RANK", default=0)


def local_rank() -> int:
    """Rank on this node: ``LOCAL_RANK``, else ``TRAINYARD_LOCAL_RANK``, else 0."""
    return _env_int("LOCAL_RANK", "TRAINYARD_LOCAL_RANK", default=0)


def world_size() -> int:
    """Number of workers: ``WORLD_SIZE``, else ``TRAINYARD_WORLD_SIZE``, else 1."""
    return _env_int("WORLD_SIZE", "TRAINYARD_WORLD_SIZE", default=1)
