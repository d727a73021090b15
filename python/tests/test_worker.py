"""Tests of ``trainyard._worker``'s helpers that need no torch (standard library only).

Run with ``cd python && python3 -m unittest discover -s tests``; cargo runs them too
(``crates/agent/tests/it/python.rs``). The worker with torch is tested through the wheel in
``tests/driver``.
"""

from __future__ import annotations

import socket
import threading
import time
import unittest

from trainyard import _worker


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class WaitForStore(unittest.TestCase):
    def test_returns_once_rank_zeros_store_listens(self) -> None:
        port = _free_port()
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

        def listen_later() -> None:
            time.sleep(0.3)
            server.bind(("127.0.0.1", port))
            server.listen()

        listener = threading.Thread(target=listen_later)
        started = time.monotonic()
        listener.start()
        try:
            _worker._wait_for_store("127.0.0.1", port, 30)
            waited = time.monotonic() - started
        finally:
            listener.join()
            server.close()
        self.assertGreaterEqual(waited, 0.3, "it waits for the store to listen")
        # Not torch's back-off: within a few polls of the listen (a second for a busy machine).
        self.assertLess(waited, 1.3)

    def test_a_store_that_never_listens_fails_within_the_timeout(self) -> None:
        port = _free_port()
        started = time.monotonic()
        with self.assertRaises(RuntimeError) as raised:
            _worker._wait_for_store("127.0.0.1", port, 0.3)
        waited = time.monotonic() - started
        self.assertIn(
            f"rank 0's store at 127.0.0.1:{port} did not listen within 0.3 s",
            str(raised.exception),
        )
        self.assertGreaterEqual(waited, 0.3)
        self.assertLess(waited, 3)


if __name__ == "__main__":
    unittest.main()
