"""Tests of a task that parks in the warm Python (``trainyard._warm``: ``park``, and the
server's keeping of a parked task), with a real warm Python and a stand-in for
``trainyard._worker`` that parks after each run: its end is told as it gives it, the
worker's next request is handed to the same process, and a parked process ends as it would
have (its exit handlers run) when the warm Python ends. Standard library only.

Run with ``cd python && python3 -m unittest discover -s tests``; cargo runs them too
(``crates/agent/tests/it/python.rs``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import trainyard
from trainyard import _warm

# Stands in for the loop functions' worker: says which run it is, then parks with the status
# the request's environment names (or exits, with END).
WORKER = """
import atexit
import os
import sys

from trainyard import _warm

atexit.register(lambda: open(os.environ["EXITED"], "w").close())
parking = _warm.park_socket()
runs = 0
while True:
    runs += 1
    print(f"run {runs} pid {os.getpid()} round {os.environ['ROUND']}", flush=True)
    if os.environ.get("END"):
        sys.exit(0)
    _warm.park(*parking, status=int(os.environ["STATUS"]))
"""

TOKEN = "secret-token"


class WarmPython:
    """A warm Python serving from a folder of its own, its package a copy of this one with
    the stand-in worker."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="warm-park-")
        package = os.path.join(self.dir, "pkg", "trainyard")
        os.makedirs(package)
        shutil.copy(os.path.join(os.path.dirname(trainyard.__file__), "_warm.py"), package)
        open(os.path.join(package, "__init__.py"), "w").close()
        with open(os.path.join(package, "_worker.py"), "w") as f:
            f.write(WORKER)
        self.socket = os.path.join(self.dir, "warm.sock")
        self.process = subprocess.Popen(
            [sys.executable, _warm.__file__, self.socket],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.process.stdin is not None
        self.process.stdin.write(f"{TOKEN}\n".encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + 30
        while not os.path.exists(self.socket):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the warm Python did not listen")
            time.sleep(0.01)

    def start(self, **env: str) -> "Task":
        """Asks for the stand-in worker with `env`, as an agent does."""
        out_r, out_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.socket)
        body = json.dumps(
            {
                "token": TOKEN,
                "argv": [sys.executable, "-m", "trainyard._worker", "FIT_DIR"],
                "env": {"PYTHONPATH": os.path.join(self.dir, "pkg"), **env},
                "cwd": self.dir,
                "cgroup": None,
                "cgroup_required": False,
                "address_space": None,
            }
        ).encode()
        socket.send_fds(conn, [struct.pack(">I", len(body))], [null, out_w, out_w])
        conn.sendall(body)
        os.close(null)
        os.close(out_w)
        return Task(conn, out_r)

    def stop(self) -> int:
        """Ends the warm Python as its runtime does (its stdin closed); its exit code."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        assert self.process.stdin is not None
        self.process.stdin.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Task:
    """What an agent holds of a task: its connection and its stdout."""

    def __init__(self, conn: socket.socket, out: int) -> None:
        self.conn = conn
        self.conn.settimeout(30)
        self.lines = conn.makefile("rb")
        self.out = os.fdopen(out, "rb")

    def said(self) -> dict:
        line = self.lines.readline()
        if not line:
            raise AssertionError("the warm Python closed the connection")
        return json.loads(line)

    def printed(self) -> str:
        """All it printed: its stdout closes once it parks or ends."""
        return self.out.read().decode()

    def close(self) -> None:
        self.lines.close()
        self.conn.close()
        self.out.close()


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_until(condition, seconds: float = 10) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class ParkTest(unittest.TestCase):
    def _parked(self, status: int) -> "tuple[Task, int]":
        """A task started, run once and parked with `status`, and its pid."""
        task = self.warm.start(ROUND="1", STATUS=str(status), EXITED=self.exited)
        pid = task.said()["started"]
        self.assertEqual(task.said(), {"status": status, "parked": True})
        return task, pid

    def setUp(self) -> None:
        self.warm = WarmPython()
        self.addCleanup(self.warm.close)
        # Not in the warm Python's folder, which it removes as it ends.
        elsewhere = tempfile.mkdtemp(prefix="warm-park-exits-")
        self.addCleanup(shutil.rmtree, elsewhere, True)
        self.exited = os.path.join(elsewhere, "exited")

    def test_a_parked_task_takes_its_workers_next_request_in_the_same_process(self) -> None:
        first = self.warm.start(ROUND="1", STATUS=str(1 << 8), EXITED=self.exited)
        pid = first.said()["started"]
        self.assertEqual(first.printed(), f"run 1 pid {pid} round 1\n")
        self.assertEqual(first.said(), {"status": 1 << 8, "parked": True})
        first.close()

        again = self.warm.start(ROUND="2", STATUS="15", EXITED=self.exited)
        self.assertEqual(again.said()["started"], pid)
        # The same interpreter, the new request's environment and stdout.
        self.assertEqual(again.printed(), f"run 2 pid {pid} round 2\n")
        self.assertEqual(again.said(), {"status": 15, "parked": True})
        again.close()

        last = self.warm.start(ROUND="3", END="1", EXITED=self.exited)
        self.assertEqual(last.said()["started"], pid)
        self.assertEqual(last.printed(), f"run 3 pid {pid} round 3\n")
        self.assertEqual(last.said(), {"status": 0})
        last.close()

    def test_a_parked_task_runs_its_exit_handlers_as_the_warm_python_ends(self) -> None:
        task, pid = self._parked(1 << 8)
        task.close()
        self.assertEqual(self.warm.stop(), 0)
        self.assertTrue(os.path.exists(self.exited), "its exit handlers did not run")
        self.assertTrue(_wait_until(lambda: _gone(pid)), "the parked process outlived its warm Python")

    def test_a_parked_task_told_to_end_runs_its_exit_handlers_and_is_not_asked_again(
        self,
    ) -> None:
        task, pid = self._parked(3 << 8)
        # What an exiting agent does, at once: SIGTERM, whenever it comes.
        os.kill(pid, 15)
        self.assertTrue(_wait_until(lambda: _gone(pid)), "the parked process did not end")
        self.assertTrue(os.path.exists(self.exited), "its exit handlers did not run")
        task.close()
        # The warm Python starts the next request anew.
        fresh = self.warm.start(ROUND="2", END="1", EXITED=self.exited)
        self.assertNotEqual(fresh.said()["started"], pid)
        fresh.close()

    def test_a_request_that_comes_as_a_parked_task_ends_starts_anew(self) -> None:
        task, pid = self._parked(1 << 8)
        task.close()
        os.kill(pid, 15)
        # Whether it ends before the request comes, or took it before it saw the signal:
        # the request is served, by a new fork or by the parked process.
        fresh = self.warm.start(ROUND="2", END="1", EXITED=self.exited)
        started = fresh.said()["started"]
        run = 2 if started == pid else 1
        self.assertEqual(fresh.printed(), f"run {run} pid {started} round 2\n")
        self.assertEqual(fresh.said(), {"status": 0})
        fresh.close()


if __name__ == "__main__":
    unittest.main()
