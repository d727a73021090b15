"""Tests of the ranks' wait for rank 0's store (``trainyard._warm``: ``wait_for_store`` and
the hook on torch's ``env://`` rendezvous that the warm Python's forked ranks and the loop
functions' worker use), standard library only: stand-ins for torch's modules.

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

AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


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


def _env(**values: str) -> dict:
    """``os.environ`` with ``values`` and without torchrun's agent store."""
    env = {k: v for k, v in os.environ.items() if k != AGENT_STORE}
    env.update(values)
    return env


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
        with self.assertRaises(TimeoutError) as raised:
            _warm.wait_for_store("127.0.0.1", port, 0.3, TimeoutError)
        waited = time.monotonic() - started
        self.assertIn(
            f"rank 0's store at 127.0.0.1:{port} did not listen within 0.3 s",
            str(raised.exception),
        )
        self.assertGreaterEqual(waited, 0.3)
        self.assertLess(waited, 3)


class StoreNetworkError(RuntimeError):
    """Stands in for torch's ``DistNetworkError``."""


class EnvRendezvous(unittest.TestCase):
    """``join_once_the_store_listens`` on stand-ins for torch's modules."""

    def setUp(self) -> None:
        self.calls: list = []

        def env_handler(url, timeout=datetime.timedelta(seconds=1800), **kwargs):
            self.calls.append((url, timeout, kwargs, time.monotonic()))
            yield ("store", 1, 2)

        self.handlers = {"env": env_handler, "tcp": object()}
        rendezvous = types.ModuleType("torch.distributed.rendezvous")
        rendezvous._rendezvous_handlers = self.handlers
        distributed = types.ModuleType("torch.distributed")
        distributed.DistNetworkError = StoreNetworkError
        self.modules = {
            "torch.distributed.rendezvous": rendezvous,
            "torch.distributed": distributed,
        }
        patch = mock.patch.dict(sys.modules, self.modules)
        patch.start()
        self.addCleanup(patch.stop)
        _warm.join_once_the_store_listens()

    def test_a_rank_other_than_0_reaches_torchs_handler_once_the_store_listens(self) -> None:
        port = _free_port()
        started = time.monotonic()
        listener, server = _listen_later(port, 0.3)
        try:
            # The rank torch puts in the URL counts, not $RANK.
            env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0")
            with mock.patch.dict(os.environ, env, clear=True):
                joined = self.handlers["env"](
                    "env://?rank=1&world_size=2", timeout=datetime.timedelta(seconds=30)
                )
                self.assertEqual(next(joined), ("store", 1, 2))
        finally:
            listener.join()
            server.close()
        [(url, timeout, kwargs, called)] = self.calls
        self.assertEqual(url, "env://?rank=1&world_size=2")
        self.assertEqual(timeout, datetime.timedelta(seconds=30))
        self.assertEqual(kwargs, {})
        self.assertGreaterEqual(called - started, 0.3, "torch's handler runs once it listens")

    def test_rank_0_and_an_agents_store_go_straight_to_torchs_handler(self) -> None:
        nothing_listens = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        short = datetime.timedelta(seconds=0.2)
        with mock.patch.dict(os.environ, _env(**nothing_listens, RANK="1"), clear=True):
            next(self.handlers["env"]("env://?rank=0&world_size=2", short))
        with mock.patch.dict(os.environ, _env(**nothing_listens, RANK="0"), clear=True):
            next(self.handlers["env"]("env://", short))
        agent_store = _env(**nothing_listens, RANK="1", **{AGENT_STORE: "True"})
        with mock.patch.dict(os.environ, agent_store, clear=True):
            next(self.handlers["env"]("env://", short))
        self.assertEqual(len(self.calls), 3)

    def test_a_store_that_never_listens_fails_as_torch_fails_to_reach_it(self) -> None:
        env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="1")
        with mock.patch.dict(os.environ, env, clear=True), self.assertRaises(StoreNetworkError):
            next(self.handlers["env"]("env://", datetime.timedelta(seconds=0.2)))
        self.assertEqual(self.calls, [])

    def test_the_handler_is_wrapped_once(self) -> None:
        wrapped = self.handlers["env"]
        _warm.join_once_the_store_listens()
        self.assertIs(self.handlers["env"], wrapped)

    def test_without_torchs_rendezvous_nothing_changes(self) -> None:
        bare = types.ModuleType("torch.distributed.rendezvous")
        for module in (None, bare):
            with mock.patch.dict(sys.modules, {"torch.distributed.rendezvous": module}):
                _warm.join_once_the_store_listens()
        self.assertFalse(hasattr(bare, "_rendezvous_handlers"))


if __name__ == "__main__":
    unittest.main()
