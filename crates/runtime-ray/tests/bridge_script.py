"""Tests of the bridge script's own logic (src/bridge.py), run by tests/bridge_script.rs.

Ray itself is replaced by a stand-in (`install_fake_ray`): what is tested here is what the
bridge decides (request lines, deadlines, which spawns must not leave an actor, which process
groups an actor may kill), not Ray. The script is loaded from TRAINYARD_BRIDGE_SCRIPT, the copy
compiled into the crate. Every wait is bounded.
"""

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest

SCRIPT = os.environ["TRAINYARD_BRIDGE_SCRIPT"]
BOUND_S = 10.0

# The stand-in for `ray`: a package on disk, so that the script also runs as a process.
FAKE_RAY = {
    "ray/__init__.py": '''
__version__ = "0.0.0-fake"
from . import exceptions, util

def remote(cls):
    return cls

def init(**kwargs):
    pass

def shutdown():
    pass

def nodes():
    return []

class _Context:
    gcs_address = "127.0.0.1:1"

def get_runtime_context():
    return _Context()

def get(ref, timeout=None):
    raise exceptions.GetTimeoutError("the stand-in for ray runs nothing")

def kill(handle):
    pass
''',
    "ray/exceptions.py": '''
class GetTimeoutError(Exception):
    pass

class ActorDiedError(Exception):
    pass

class ActorUnavailableError(Exception):
    pass
''',
    "ray/util/__init__.py": '''
def get_node_ip_address():
    return "127.0.0.1"
''',
    "ray/util/placement_group.py": '''
def placement_group(*args, **kwargs):
    raise RuntimeError("no groups in the stand-in for ray")

def placement_group_table(*args):
    return {}

def remove_placement_group(pg):
    pass
''',
    "ray/util/scheduling_strategies.py": '''
class PlacementGroupSchedulingStrategy:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
''',
}


def write_fake_ray(root):
    for path, text in FAKE_RAY.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


FAKE_ROOT = tempfile.mkdtemp(prefix="trainyard-fake-ray-")
write_fake_ray(FAKE_ROOT)
sys.path.insert(0, FAKE_ROOT)


def load_bridge():
    """The script as a module (its `main` does not run)."""
    spec = importlib.util.spec_from_file_location("trainyard_bridge", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bridge = load_bridge()


def ms(seconds_from_now):
    return int((time.time() + seconds_from_now) * 1000)


class RequestLines(unittest.TestCase):
    def test_a_line_that_is_not_json_is_rejected_with_its_id_when_one_can_be_read(self):
        req, reply = bridge.parse_request('{"id": 41, "op": "spawn", "name": ')
        self.assertIsNone(req)
        self.assertEqual(reply["id"], 41)
        self.assertEqual(reply["error"]["kind"], "protocol")
        self.assertIn("not JSON", reply["error"]["message"])
        req, reply = bridge.parse_request("garbage")
        self.assertEqual((req, reply["id"], reply["error"]["kind"]), (None, None, "protocol"))

    def test_json_that_is_not_a_request_object_is_rejected_with_a_null_id(self):
        for line, named in (("[1, 2]", "list"), ('"spawn"', "str"), ("7", "int")):
            req, reply = bridge.parse_request(line)
            self.assertIsNone(req, line)
            self.assertEqual(reply["id"], None, line)
            self.assertIn(f"a JSON {named}, not an object", reply["error"]["message"])
        for bad in ('"7"', "-1", "true", "null"):
            req, reply = bridge.parse_request(f'{{"id": {bad}, "op": "ping"}}')
            self.assertIsNone(req, bad)
            self.assertEqual(reply["id"], None)
            self.assertIn("id is", reply["error"]["message"])
        req, reply = bridge.parse_request('{"id": 3, "op": "ping"}')
        self.assertEqual((req, reply), ({"id": 3, "op": "ping"}, None))


class Deadlines(unittest.TestCase):
    def setUp(self):
        self.sent = []
        self.ran = []
        self.saved_emit = bridge.emit
        bridge.emit = self.sent.append
        bridge.OPS["probe"] = lambda req: self.ran.append(req["id"]) or {}

    def tearDown(self):
        bridge.emit = self.saved_emit
        del bridge.OPS["probe"]

    def test_work_whose_deadline_passed_is_refused_without_running(self):
        bridge.handle({"id": 1, "op": "probe", "deadline_ms": ms(-1)})
        self.assertEqual(self.ran, [])
        self.assertEqual(self.sent[0]["id"], 1)
        self.assertEqual(self.sent[0]["error"]["kind"], "deadline")
        self.assertIn("probe is past its deadline", self.sent[0]["error"]["message"])

    def test_work_within_its_deadline_or_without_one_runs(self):
        bridge.handle({"id": 2, "op": "probe", "deadline_ms": ms(30)})
        bridge.handle({"id": 3, "op": "probe"})
        self.assertEqual(self.ran, [2, 3])
        self.assertEqual(self.sent, [{"id": 2, "ok": {}}, {"id": 3, "ok": {}}])

    def test_a_deadline_that_is_not_a_number_is_a_protocol_error_naming_it(self):
        bridge.handle({"id": 4, "op": "probe", "deadline_ms": "soon"})
        self.assertEqual(self.ran, [])
        error = self.sent[0]["error"]
        self.assertEqual(error["kind"], "protocol")
        self.assertIn("deadline_ms is 'soon'", error["message"])

    def test_a_blocking_wait_is_cut_short_by_the_deadline(self):
        left = bridge.bounded({"deadline_ms": ms(5)}, "spawn", 120.0)
        self.assertLessEqual(left, 5.0 - bridge.DEADLINE_MARGIN_S)
        self.assertGreater(left, 3.0)
        self.assertEqual(bridge.bounded({}, "spawn", 120.0), 120.0)

    def test_control_calls_do_not_queue_behind_spawns(self):
        self.assertTrue(
            {"kill", "signal", "remove_pg", "shutdown", "ping", "actors"} <= bridge.CONTROL_OPS
        )
        self.assertNotIn("spawn", bridge.CONTROL_OPS)
        self.assertNotIn("wait_pg", bridge.CONTROL_OPS)


class FakeClock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def time(self):
        return self.now

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Spawns(unittest.TestCase):
    """op_spawn against a stand-in actor class and a clock the test moves."""

    def setUp(self):
        self.clock = FakeClock()
        self.killed = []
        self.made = []
        self.waits = []
        test = self

        class Handle:
            class start:
                @staticmethod
                def remote(*args):
                    return "start-ref"

        class Actor:
            @staticmethod
            def options(**options):
                class Made:
                    @staticmethod
                    def remote():
                        handle = Handle()
                        test.made.append(handle)
                        return handle

                return Made

        self.saved = (bridge.time, bridge.TrainyardActor, bridge.ray.get, bridge.ray.kill, bridge.watch_actor)
        bridge.time = self.clock
        bridge.TrainyardActor = Actor
        bridge.ray.kill = self.killed.append
        bridge.watch_actor = lambda name, handle: None

    def tearDown(self):
        bridge.time, bridge.TrainyardActor, bridge.ray.get, bridge.ray.kill, bridge.watch_actor = self.saved
        with bridge.STATE.lock:
            bridge.STATE.actors.clear()

    def request(self, name, deadline_in):
        return {
            "id": 9,
            "op": "spawn",
            "name": name,
            "program": "agent",
            "timeout_s": 120,
            "deadline_ms": int((self.clock.now + deadline_in) * 1000),
        }

    def starts_after(self, seconds):
        def get(ref, timeout=None):
            self.waits.append(timeout)
            self.clock.now += seconds
            return {"pid": 1}

        bridge.ray.get = get

    def test_a_spawn_that_completes_past_its_deadline_kills_its_actor(self):
        self.starts_after(8.0)
        with self.assertRaises(bridge.OpError) as raised:
            bridge.op_spawn(self.request("late", deadline_in=5.0))
        self.assertEqual(raised.exception.kind, "deadline")
        self.assertEqual(self.killed, self.made)
        self.assertEqual(len(self.made), 1)
        self.assertNotIn("late", bridge.STATE.actors)
        self.assertLessEqual(self.waits[0], 5.0 - bridge.DEADLINE_MARGIN_S, "Ray's wait is bounded")

    def test_a_spawn_whose_deadline_passed_before_it_began_makes_no_actor(self):
        self.starts_after(0.0)
        with self.assertRaises(bridge.OpError) as raised:
            bridge.op_spawn(self.request("queued", deadline_in=-1.0))
        self.assertEqual(raised.exception.kind, "deadline")
        self.assertEqual((self.made, self.killed, self.waits), ([], [], []))

    def test_a_spawn_in_time_keeps_its_actor(self):
        self.starts_after(1.0)
        self.assertEqual(bridge.op_spawn(self.request("on-time", deadline_in=5.0)), {"pid": 1})
        self.assertEqual(self.killed, [])
        self.assertEqual(bridge.STATE.actors["on-time"]["state"], "alive")

    def test_a_spawn_after_shutdown_began_kills_its_actor(self):
        self.starts_after(0.0)
        bridge.STATE.closing = True
        try:
            with self.assertRaises(bridge.OpError) as raised:
                bridge.op_spawn(self.request("closing", deadline_in=5.0))
        finally:
            bridge.STATE.closing = False
        self.assertEqual(raised.exception.kind, "closing")
        self.assertEqual(self.killed, self.made)


# The agent stand-in: starts one task in a process group of its own, prints its pid, waits.
AGENT = r"""
import os, subprocess, sys, time
task = subprocess.Popen(["sleep", "600"], preexec_fn=os.setpgrp)
print(task.pid, flush=True)
time.sleep(600)
"""


def running(proc):
    return proc.poll() is None


def wait_until(check, what):
    deadline = time.monotonic() + BOUND_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S} s: {what}")
        time.sleep(0.02)


def gone(pid):
    fields = bridge._proc_stat(pid)
    return fields is None or fields[0] in ("Z", "X")


class Signals(unittest.TestCase):
    """The actor's signal method, on real processes: it kills only the agent it started and
    that agent's own task groups."""

    def setUp(self):
        self.procs = []

    def tearDown(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=BOUND_S)
            if proc.stdout is not None:
                proc.stdout.close()

    def spawn(self, args, **kwargs):
        proc = subprocess.Popen(args, **kwargs)
        self.procs.append(proc)
        return proc

    def actor(self):
        """An actor hosting an agent stand-in, and that agent's task pid."""
        actor = bridge.TrainyardActor()
        actor.proc = self.spawn([sys.executable, "-c", AGENT], stdout=subprocess.PIPE)
        actor.agent_start = bridge._start_time(actor.proc.pid)
        result = queue.Queue()
        threading.Thread(target=lambda: result.put(actor.proc.stdout.readline()), daemon=True).start()
        task = int(result.get(timeout=BOUND_S))
        return actor, task

    def test_sigkill_kills_the_agents_task_group_and_the_agent(self):
        actor, task = self.actor()
        self.assertTrue(actor._is_agents_task_group(task))
        self.assertTrue(actor.signal(signal.SIGKILL, task))
        wait_until(lambda: gone(task), "the task is killed")
        self.assertEqual(actor.proc.wait(timeout=BOUND_S), -signal.SIGKILL)

    def test_a_group_that_is_not_the_agents_task_is_left_alone(self):
        actor, task = self.actor()
        foreign = self.spawn(["sleep", "600"], preexec_fn=os.setpgrp)
        for group in (foreign.pid, os.getpgid(0), 1, 0):
            self.assertFalse(actor._is_agents_task_group(group), group)
        self.assertTrue(actor.signal(signal.SIGKILL, foreign.pid), "the agent is signalled")
        self.assertEqual(actor.proc.wait(timeout=BOUND_S), -signal.SIGKILL)
        self.assertTrue(running(foreign), "another process group survives")
        os.killpg(task, signal.SIGKILL)

    def test_an_agent_pid_with_another_start_time_is_not_signalled(self):
        actor, task = self.actor()
        actor.agent_start -= 1  # as if the pid now named a process started later
        self.assertFalse(actor.signal(signal.SIGTERM, None))
        self.assertFalse(actor.signal(signal.SIGKILL, task))
        self.assertTrue(running(actor.proc), "the process behind the pid is left alone")
        self.assertFalse(gone(task))
        os.killpg(task, signal.SIGKILL)


class BridgeProcess(unittest.TestCase):
    """The script as a process, on the stand-in for `ray`: request lines in, replies out."""

    def test_every_request_line_gets_a_reply(self):
        env = dict(os.environ, PYTHONPATH=FAKE_ROOT, PYTHONUNBUFFERED="1")
        env.pop("TRAINYARD_BRIDGE_PARENT", None)
        proc = subprocess.Popen(
            [sys.executable, "-u", SCRIPT],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(json.loads(line))

        threading.Thread(target=pump, daemon=True).start()
        try:
            self.assertEqual(lines.get(timeout=BOUND_S)["event"], "ready")
            sent = [
                ('{"id": 41, "op": "ping", ', 41, "protocol"),
                ("[1, 2, 3]", None, "protocol"),
                (json.dumps({"id": 42, "op": "ping", "deadline_ms": 1}), 42, "deadline"),
                (json.dumps({"id": 43, "op": "ping", "deadline_ms": ms(30)}), 43, None),
            ]
            for line, _, _ in sent:
                proc.stdin.write(line + "\n")
            proc.stdin.flush()
            replies = [lines.get(timeout=BOUND_S) for _ in sent]
            replies.sort(key=lambda r: -1 if r["id"] is None else r["id"])
            expected = sorted(sent, key=lambda s: -1 if s[1] is None else s[1])
            for reply, (line, rid, kind) in zip(replies, expected):
                self.assertEqual(reply["id"], rid, line)
                if kind is None:
                    self.assertEqual(reply["ok"], {}, line)
                else:
                    self.assertEqual(reply["error"]["kind"], kind, line)
            proc.stdin.close()
            self.assertEqual(proc.wait(timeout=BOUND_S), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=BOUND_S)
            proc.stdout.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
