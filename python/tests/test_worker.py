"""Tests of the ranks' wait for rank 0's store (``trainyard._warm.wait_for_store``), which the
worker of loop functions and the warm Python's forked ranks use (standard library only: a
stand-in for torch's rendezvous module).

Run with ``cd python && python3 -m unittest discover -s tests``; cargo runs them too
(``crates/agent/tests/it/python.rs``). The worker with torch is tested through the wheel in
``tests/driver``.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
import types
import unittest
from unittest import mock

from trainyard import _warm


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listen_later(port: int, delay: float) -> tuple[threading.Thread, socket.socket]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen() -> None:
        time.sleep(delay)
        server.bind(("127.0.0.1", port))
        server.listen()

    thread = threading.Thread(target=listen)
    thread.start()
    return thread, server


class WaitForStore(unittest.TestCase):
    def test_returns_once_rank_zeros_store_listens(self) -> None:
        port = _free_port()
        started = time.monotonic()
        listener, server = _listen_later(port, 0.3)
        try:
            _warm.wait_for_store("127.0.0.1", port, 30)
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
            _warm.wait_for_store("127.0.0.1", port, 0.3)
        waited = time.monotonic() - started
        self.assertIn(
            f"rank 0's store at 127.0.0.1:{port} did not listen within 0.3 s",
            str(raised.exception),
        )
        self.assertGreaterEqual(waited, 0.3)
        self.assertLess(waited, 3)


class ForkedRanksRendezvous(unittest.TestCase):
    """The warm Python's hook on torch's ``env://`` handler, on a stand-in module."""

    def hooked(self) -> tuple[dict, list]:
        calls: list = []

        def env_handler(url, timeout=datetime.timedelta(seconds=1800), **kwargs):
            calls.append((url, timeout, kwargs, time.monotonic()))
            return iter([("store", 0, 2)])

        handlers = {"env": env_handler, "tcp": object()}
        module = types.ModuleType("torch.distributed.rendezvous")
        module._rendezvous_handlers = handlers
        with mock.patch.dict(sys.modules, {"torch.distributed.rendezvous": module}):
            _warm._join_once_the_store_listens()
        return handlers, calls

    def test_a_rank_other_than_0_reaches_the_handler_once_the_store_listens(self) -> None:
        handlers, calls = self.hooked()
        port = _free_port()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}
        started = time.monotonic()
        listener, server = _listen_later(port, 0.3)
        try:
            with mock.patch.dict(os.environ, env):
                # The rank torch passes in the URL counts, not $RANK.
                result = handlers["env"](
                    "env://?rank=1&world_size=2", timeout=datetime.timedelta(seconds=30)
                )
        finally:
            listener.join()
            server.close()
        self.assertEqual(next(result), ("store", 0, 2))
        [(url, timeout, kwargs, called)] = calls
        self.assertEqual(url, "env://?rank=1&world_size=2")
        self.assertEqual(timeout, datetime.timedelta(seconds=30))
        self.assertEqual(kwargs, {})
        self.assertGreaterEqual(called - started, 0.3, "the handler runs once the store listens")

    def test_rank_0_and_an_agents_store_go_straight_to_the_handler(self) -> None:
        handlers, calls = self.hooked()
        nothing_listens = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        with mock.patch.dict(os.environ, {**nothing_listens, "RANK": "0"}):
            handlers["env"]("env://", datetime.timedelta(seconds=0.2))
        agent_store = {**nothing_listens, "RANK": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
        with mock.patch.dict(os.environ, agent_store):
            handlers["env"]("env://", datetime.timedelta(seconds=0.2))
        self.assertEqual(len(calls), 2)

    def test_without_torch_nothing_is_hooked(self) -> None:
        with mock.patch.dict(sys.modules, {"torch.distributed.rendezvous": None}):
            _warm._join_once_the_store_listens()


if __name__ == "__main__":
    unittest.main()
