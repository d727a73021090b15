"""How the report clients (protocol 1 in ``trainyard_report``, protocol 2 in
``trainyard._client``) retry a connection that is refused, or reset before the
agent took it, against a fake agent on a real socket (standard library only).

Run with ``cd python && python3 -m unittest discover -s tests``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
import unittest
from typing import List
from unittest import mock

import trainyard_report
from trainyard import _client

TOKEN = "cd" * 32
# The bound of every wait of these tests, in seconds.
WAIT = 30.0


def reset(conn: socket.socket) -> None:
    """Close ``conn`` with a reset, as the agent's kernel does when it drops a
    connection whose first line it never read."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class EvictingAgent:
    """A report socket that resets its first ``evict`` connections unread, then
    takes one client: records its hello and lines, and answers each line of
    protocol 2 with its index."""

    def __init__(self, evict: int, protocol: int) -> None:
        self.evict = evict
        self.protocol = protocol
        self.connections = 0
        # The client ports of the connections reset, and of the one taken.
        self.seen = threading.Condition()
        self.reset_ports: List[int] = []
        self.served_port = 0
        self.hellos: List[str] = []
        self.lines: List[dict] = []
        self.done = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(WAIT)
        self.addr = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        try:
            for _ in range(self.evict):
                conn, peer = self.server.accept()
                self.connections += 1
                reset(conn)
                with self.seen:
                    self.reset_ports.append(peer[1])
                    self.seen.notify_all()
            conn, peer = self.server.accept()
            self.connections += 1
            with self.seen:
                self.served_port = peer[1]
                self.seen.notify_all()
            conn.settimeout(WAIT)
            with conn, conn.makefile("rb") as lines:
                self.hellos.append(lines.readline().decode().rstrip("\n"))
                for index, line in enumerate(iter(lines.readline, b""), start=1):
                    self.lines.append(json.loads(line))
                    if self.protocol == 2:
                        answer = {"ok": True, "index": index}
                        conn.sendall((json.dumps(answer) + "\n").encode())
        except OSError:
            pass
        finally:
            self.done.set()

    def close(self) -> None:
        self.server.close()


def free_port() -> int:
    """A port nothing listens on (now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def env(addr: str) -> "mock._patch_dict":
    return mock.patch.dict(
        os.environ, {"TRAINYARD_REPORT_ADDR": addr, "TRAINYARD_REPORT_TOKEN": TOKEN}
    )


class RetryTest(unittest.TestCase):
    def setUp(self) -> None:
        trainyard_report.close()
        _client.close()
        self.addCleanup(trainyard_report.close)
        self.addCleanup(_client.close)

    def agent(self, evict: int, protocol: int) -> EvictingAgent:
        agent = EvictingAgent(evict, protocol)
        self.addCleanup(agent.close)
        patch = env(agent.addr)
        patch.start()
        self.addCleanup(patch.stop)
        return agent

    def test_a_protocol_2_report_reset_before_its_answer_is_sent_again_on_a_new_connection(
        self,
    ) -> None:
        agent = self.agent(evict=3, protocol=2)
        self.assertEqual(_client.send({"step": 1}, None), 1)
        self.assertEqual(_client.send({"step": 2}, None), 2)
        self.assertEqual(agent.connections, 4)
        self.assertEqual(agent.hellos, [TOKEN + " 2"])
        self.assertEqual(
            agent.lines,
            [
                {"metrics": {"step": 1}, "checkpoint": None},
                {"metrics": {"step": 2}, "checkpoint": None},
            ],
        )

    def test_async_reports_on_a_connection_reset_before_its_answer_are_sent_again_in_order(
        self,
    ) -> None:
        agent = self.agent(evict=2, protocol=2)
        for step in (1, 2, 3):
            _client.send_later({"step": step}, None, None, None)
        _client.flush()
        self.assertEqual(agent.connections, 3)
        self.assertEqual(agent.hellos, [TOKEN + " 2"])
        self.assertEqual([line["metrics"]["step"] for line in agent.lines], [1, 2, 3])

    def test_a_protocol_1_report_reset_as_it_is_sent_is_sent_again_on_a_new_connection(
        self,
    ) -> None:
        agent = self.agent(evict=2, protocol=1)
        connect = trainyard_report._connect

        def connect_then_wait_for_the_reset(addr: str) -> socket.socket:
            # Protocol 1 reads nothing back: a reset is seen by the next write, here the
            # report's, once it has arrived.
            sock = connect(addr)
            port = sock.getsockname()[1]
            with agent.seen:
                decided = agent.seen.wait_for(
                    lambda: port in agent.reset_ports or port == agent.served_port,
                    timeout=WAIT,
                )
            self.assertTrue(decided)
            return sock

        with mock.patch.object(
            trainyard_report, "_connect", side_effect=connect_then_wait_for_the_reset
        ):
            trainyard_report.report({"step": 1})
        trainyard_report.report({"step": 2})
        trainyard_report.close()
        self.assertTrue(agent.done.wait(WAIT))
        self.assertEqual(agent.connections, 3)
        self.assertEqual(agent.hellos, [TOKEN])
        self.assertEqual(agent.lines, [{"step": 1}, {"step": 2}])

    def test_a_refused_connection_is_tried_again_until_the_agent_listens(self) -> None:
        port = free_port()
        addr = "127.0.0.1:%d" % port
        answered: List[str] = []

        def listen_later() -> None:
            time.sleep(0.5)
            with socket.create_server(("127.0.0.1", port)) as server:
                server.settimeout(WAIT)
                conn, _ = server.accept()
                with conn, conn.makefile("rb") as lines:
                    answered.append(lines.readline().decode().rstrip("\n"))
                    lines.readline()
                    conn.sendall(b'{"ok": true, "index": 7}\n')

        later = threading.Thread(target=listen_later, daemon=True)
        later.start()
        with env(addr):
            self.assertEqual(_client.send({"step": 1}, None), 7)
        later.join(WAIT)
        self.assertEqual(answered, [TOKEN + " 2"])

    def test_retrying_stops_after_the_patience_with_the_last_error(self) -> None:
        addr = "127.0.0.1:%d" % free_port()
        with env(addr), mock.patch.object(trainyard_report, "CONNECT_PATIENCE", 0.5):
            started = time.monotonic()
            with self.assertRaises(ConnectionRefusedError):
                trainyard_report.report({"step": 1})
            with self.assertRaises(ConnectionRefusedError):
                _client.send({"step": 1}, None)
            took = time.monotonic() - started
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 10.0)


if __name__ == "__main__":
    unittest.main()
