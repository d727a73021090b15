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

The agent answers a report with a checkpoint only once the checkpoint's
files are persisted (or failed to be), and only after the report has gone on
to the driver; an ``ASYNC`` one once the agent has taken the files (it
persists them in the background and passes the report on in order); one
without a checkpoint once it is counted.

A connection that is refused, or reset before its first answer (the agent
drops connections that have not shown the token when newer ones crowd in;
such a report was never counted), is tried again with a short backoff for up
to ``trainyard_report.CONNECT_PATIENCE`` (10 s) in all. A connection closed
without an answer, or one that fails after answering, is an error: the report
may have counted.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
from typing import Any, Dict, Optional, Tuple

# The protocol-1 module ships beside this package (the agent carries both, the wheel holds
# both) and is standard library only: the variables and the way to connect come from there.
from trainyard_report import ADDR_ENV, TOKEN_ENV, _open_connection, _retry

PROTOCOL = 2

# The longest answer the agent sends is far shorter; a longer line is not an answer.
_MAX_ANSWER = 64 * 1024


class ReportError(RuntimeError):
    """The agent could not take a report: its checkpoint was not persisted.

    ``index`` is the checkpoint index the report counted as (``None`` when the
    agent did not count it), ``str(error)`` the agent's reason.
    """

    def __init__(self, message: str, index: Optional[int] = None) -> None:
        super().__init__(message)
        self.index = index


class _Connection:
    """One open report connection, speaking protocol 2."""

    def __init__(self, addr: str, token: str) -> None:
        self.pid = os.getpid()
        self.sock = _open_connection(addr, f"{token} {PROTOCOL}")
        self.answers = self.sock.makefile("rb")

    def exchange(self, line: bytes) -> Dict[str, Any]:
        """Send one report line and read the agent's answer."""
        self.sock.sendall(line)
        answer = self.answers.readline(_MAX_ANSWER + 1)
        if not answer.endswith(b"\n"):
            raise ConnectionError(
                "the trainyard agent closed the report connection without answering"
            )
        try:
            decoded = json.loads(answer)
        except ValueError as error:
            raise ConnectionError(
                f"the trainyard agent's answer is not JSON: {answer[:200]!r}"
            ) from error
        if not isinstance(decoded, dict) or not isinstance(decoded.get("ok"), bool):
            raise ConnectionError(
                f"the trainyard agent's answer is not understood: {answer[:200]!r}"
            )
        return decoded

    def close(self) -> None:
        try:
            self.answers.close()
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            self.sock.close()


_lock = threading.Lock()
_conn: Optional[_Connection] = None
_atexit_registered = False


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

    Raises ``ReportError`` when the agent says the report failed (its
    checkpoint was not persisted), ``OSError`` when the agent cannot be
    reached (within ``CONNECT_PATIENCE`` seconds, for a new connection),
    ``TypeError``/``ValueError`` when ``metrics`` is not JSON (NaN and
    infinities are not JSON either).
    """
    global _conn, _atexit_registered
    report: Dict[str, Any] = {"metrics": metrics, "checkpoint": checkpoint}
    if upload != "SYNC":
        report["upload"] = upload
    if delete is not None:
        report["delete"] = bool(delete)
    if dir_name is not None:
        report["dir_name"] = dir_name
    line = json.dumps(
        report,
        separators=(",", ":"),
        allow_nan=False,
    )
    data = (line + "\n").encode("utf-8")
    addr = address()
    if addr is None:
        raise RuntimeError(f"{ADDR_ENV} is not set: not running under trainyard")
    with _lock:
        if _conn is not None and _conn.pid != os.getpid():
            # A forked child shares its parent's socket: it must not read its answers.
            _conn = None
        if _conn is None:
            token = os.environ.get(TOKEN_ENV, "")
            if not token:
                raise RuntimeError(f"{ADDR_ENV} is set but {TOKEN_ENV} is not")

            def first() -> Tuple[_Connection, Dict[str, Any]]:
                conn = _Connection(addr, token)
                try:
                    return conn, conn.exchange(data)
                except BaseException:
                    conn.close()
                    raise

            _conn, answer = _retry(first)
            if not _atexit_registered:
                atexit.register(close)
                _atexit_registered = True
        else:
            try:
                answer = _conn.exchange(data)
            except BaseException:
                # The connection is in an unknown state: the next report opens a new one.
                broken, _conn = _conn, None
                broken.close()
                raise
    index = answer.get("index")
    if not answer["ok"]:
        raise ReportError(str(answer.get("error", "the report failed")), index)
    return int(index) if isinstance(index, int) else -1


def close() -> None:
    """Close the report connection (runs at exit); a later report opens a new one."""
    global _conn
    with _lock:
        conn, _conn = _conn, None
    if conn is not None and conn.pid == os.getpid():
        conn.close()
