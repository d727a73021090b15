"""Tests of the ``trainyard`` package on its own (standard library only).

Run with ``cd python && python3 -m unittest discover -s tests``; cargo runs
them too (``crates/agent/tests/it/python.rs``). The agent's side of the protocol is
tested through real agents in ``crates/runtime-local/tests/python_train.rs``;
here a fake agent answers.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tempfile
import threading
import unittest
import warnings
from contextlib import redirect_stderr
from typing import List, Optional
from unittest import mock

from trainyard import _client, train

TOKEN = "ab" * 32
TRAINYARD_VARS = [
    "TRAINYARD_WORLD_RANK",
    "TRAINYARD_LOCAL_RANK",
    "TRAINYARD_WORLD_SIZE",
    "TRAINYARD_LOCAL_WORLD_SIZE",
    "TRAINYARD_NODE_RANK",
    "TRAINYARD_RUN_NAME",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TRAINYARD_CHECKPOINT",
    "TRAINYARD_REPORT_ADDR",
    "TRAINYARD_REPORT_TOKEN",
    "TRAINYARD_RUN_DIR",
]


def clean_env(**values: str) -> "mock._patch_dict":
    """The environment without any variable trainyard reads, plus ``values``."""
    env = {k: v for k, v in os.environ.items() if k not in TRAINYARD_VARS}
    env.update(values)
    return mock.patch.dict(os.environ, env, clear=True)


class FakeAgent:
    """A report socket that records what it is sent and answers from a script.

    ``answers`` holds one entry per report line: a dict to send back, or
    ``None`` to close the connection without answering.
    """

    def __init__(
        self, answers: List[Optional[dict]], hold: Optional[threading.Event] = None
    ) -> None:
        self.answers = list(answers)
        # Set: each answer waits for it.
        self.hold = hold
        self.hellos: List[str] = []
        self.lines: List[dict] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while self.answers:
            conn, _ = self.server.accept()
            with conn, conn.makefile("rb") as lines:
                self.hellos.append(lines.readline().decode().rstrip("\n"))
                while self.answers:
                    line = lines.readline()
                    if not line:
                        break
                    self.lines.append(json.loads(line))
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    if self.hold is not None:
                        self.hold.wait(30)
                    conn.sendall((json.dumps(answer) + "\n").encode())

    def close(self) -> None:
        self.server.close()


class ReportTest(unittest.TestCase):
    def tearDown(self) -> None:
        _client.close()

    def agent(
        self, answers: List[Optional[dict]], hold: Optional[threading.Event] = None
    ) -> FakeAgent:
        agent = FakeAgent(answers, hold)
        self.addCleanup(agent.close)
        patch = clean_env(TRAINYARD_REPORT_ADDR=agent.addr, TRAINYARD_REPORT_TOKEN=TOKEN)
        patch.start()
        self.addCleanup(patch.stop)
        return agent

    def test_a_report_with_a_checkpoint_speaks_protocol_2_and_waits_for_the_answer(self) -> None:
        agent = self.agent([{"ok": True, "index": 1}, {"ok": True, "index": 2}])
        with tempfile.TemporaryDirectory() as d:
            self.assertIsNone(
                train.report({"step": 1}, checkpoint=train.Checkpoint.from_directory(d))
            )
            train.report({"step": 2})
            self.assertEqual(agent.hellos, [TOKEN + " 2"])
            self.assertEqual(
                agent.lines,
                [
                    {"metrics": {"step": 1}, "checkpoint": os.path.abspath(d)},
                    {"metrics": {"step": 2}, "checkpoint": None},
                ],
            )

    def test_a_failed_checkpoint_raises_the_agents_reason(self) -> None:
        self.agent([{"ok": False, "index": 3, "error": "disk full"}, {"ok": True, "index": 4}])
        checkpoint = train.Checkpoint.from_directory("/somewhere")
        with self.assertRaises(train.ReportError) as raised:
            train.report({"step": 1}, checkpoint=checkpoint)
        self.assertEqual(str(raised.exception), "disk full")
        self.assertEqual(raised.exception.index, 3)
        train.report({"step": 2})

    def test_an_async_report_returns_before_its_answer_and_the_next_waits_for_it(self) -> None:
        hold = threading.Event()
        self.addCleanup(hold.set)
        agent = self.agent([{"ok": True, "index": 1}, {"ok": True, "index": 2}], hold)
        asynchronous = train.CheckpointUploadMode.ASYNC
        d = tempfile.mkdtemp()
        self.addCleanup(os.rmdir, d)
        train.report(
            {"step": 1},
            checkpoint=train.Checkpoint.from_directory(d),
            checkpoint_upload_mode=asynchronous,
        )
        second = threading.Thread(
            target=train.report,
            args=({"step": 2},),
            kwargs={"checkpoint_upload_mode": asynchronous},
        )
        second.start()
        second.join(0.5)
        self.assertTrue(second.is_alive(), "one report on its way: the next waits for its answer")
        self.assertEqual(len(agent.lines), 1)
        self.assertEqual(
            agent.lines[0],
            {
                "metrics": {"step": 1},
                "checkpoint": os.path.abspath(d),
                "upload": "ASYNC",
            },
        )
        hold.set()
        second.join(30)
        self.assertFalse(second.is_alive())
        _client.flush()
        self.assertEqual([line["metrics"]["step"] for line in agent.lines], [1, 2])

    def test_an_async_report_that_failed_is_raised_by_the_next_report_which_is_not_sent(
        self,
    ) -> None:
        agent = self.agent(
            [{"ok": False, "index": 1, "error": "disk full"}, {"ok": True, "index": 2}]
        )
        train.report(
            {"step": 1},
            checkpoint=train.Checkpoint.from_directory("/somewhere"),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
        )
        with self.assertRaises(train.ReportError) as raised:
            train.report({"step": 2})
        self.assertEqual(
            str(raised.exception), "an ASYNC report (checkpoint index 1) failed: disk full"
        )
        self.assertEqual(raised.exception.index, 1)
        self.assertEqual(len(agent.lines), 1)
        train.report({"step": 3})
        self.assertEqual([line["metrics"]["step"] for line in agent.lines], [1, 3])

    def test_an_async_failure_nobody_raised_is_said_at_exit(self) -> None:
        self.agent([{"ok": False, "index": 1, "error": "disk full"}])
        train.report(
            {"step": 1},
            checkpoint=train.Checkpoint.from_directory("/somewhere"),
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
        )
        said = io.StringIO()
        with redirect_stderr(said):
            _client.close()
        self.assertIn("an ASYNC report (checkpoint index 1) failed: disk full", said.getvalue())

    def test_an_agent_that_hangs_up_without_answering_is_an_error_and_the_next_report_reconnects(
        self,
    ) -> None:
        agent = self.agent([None, {"ok": True, "index": 2}])
        with self.assertRaises(ConnectionError):
            train.report({"step": 1})
        train.report({"step": 2})
        self.assertEqual(agent.hellos, [TOKEN + " 2", TOKEN + " 2"])

    def test_a_no_upload_report_names_its_folder_in_storage_and_deletes_nothing(self) -> None:
        agent = self.agent([{"ok": True, "index": 1}, {"ok": True, "index": 2}])
        with tempfile.TemporaryDirectory() as d:
            for checkpoint in (d, "s3://bucket/runs/a/dcp/step_1"):
                train.report(
                    {"step": 1},
                    checkpoint=train.Checkpoint(checkpoint),
                    checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
                    delete_local_checkpoint_after_upload=True,
                )
            self.assertTrue(os.path.isdir(d))
        self.assertEqual(
            agent.lines,
            [
                {"metrics": {"step": 1}, "checkpoint": d, "upload": "NO_UPLOAD"},
                {
                    "metrics": {"step": 1},
                    "checkpoint": "s3://bucket/runs/a/dcp/step_1",
                    "upload": "NO_UPLOAD",
                },
            ],
        )

    def test_metrics_that_are_not_json_raise_before_anything_is_sent(self) -> None:
        agent = self.agent([{"ok": True, "index": 1}])
        with self.assertRaises(ValueError):
            train.report({"loss": float("nan")})
        with self.assertRaises(TypeError):
            train.report([1, 2])  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            train.report({"step": 1}, checkpoint="/a/dir")  # type: ignore[arg-type]
        train.report({"step": 1})
        self.assertEqual(agent.lines, [{"metrics": {"step": 1}, "checkpoint": None}])


class OutsideTrainyardTest(unittest.TestCase):
    def test_a_report_is_printed_and_a_checkpoint_ignored_with_a_warning(self) -> None:
        stderr = io.StringIO()
        with clean_env(), redirect_stderr(stderr), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            train.report({"step": 1})
            train.report({"step": 2}, checkpoint=train.Checkpoint.from_directory("/ckpt"))
        self.assertEqual(
            stderr.getvalue(),
            'trainyard_report: {"step":1}\ntrainyard_report: {"step":2}\n',
        )
        self.assertEqual(len(seen), 1)
        self.assertIs(seen[0].category, RuntimeWarning)
        self.assertIn("/ckpt", str(seen[0].message))


class CheckpointTest(unittest.TestCase):
    def test_a_checkpoint_is_its_absolute_directory(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            here = os.getcwd()
            os.chdir(d)
            try:
                checkpoint = train.Checkpoint.from_directory("state")
                self.assertEqual(checkpoint.path, os.path.join(os.getcwd(), "state"))
            finally:
                os.chdir(here)
            self.assertEqual(checkpoint, train.Checkpoint(checkpoint.path))
            with checkpoint.as_directory() as local:
                self.assertEqual(local, checkpoint.path)

    def test_a_filesystem_is_taken_as_rays_is(self) -> None:
        class S3FileSystem:
            pass

        class LocalFileSystem:
            pass

        class GcsFileSystem:
            pass

        self.assertEqual(
            train.Checkpoint("bucket/runs/a/dcp", filesystem=S3FileSystem()).path,
            "s3://bucket/runs/a/dcp",
        )
        self.assertEqual(train.Checkpoint("/x/y", filesystem=LocalFileSystem()).path, "/x/y")
        self.assertEqual(train.Checkpoint("s3://b/k").path, "s3://b/k")
        with self.assertRaises(TypeError) as raised:
            train.Checkpoint("bucket/x", filesystem=GcsFileSystem())
        self.assertIn("GcsFileSystem", str(raised.exception))

    def test_to_directory_copies_the_files(self) -> None:
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            os.mkdir(os.path.join(src, "sub"))
            with open(os.path.join(src, "sub", "w"), "w") as f:
                f.write("weights")
            out = train.Checkpoint.from_directory(src).to_directory(dst)
            self.assertEqual(out, dst)
            with open(os.path.join(dst, "sub", "w")) as f:
                self.assertEqual(f.read(), "weights")

    def test_get_checkpoint_reads_trainyard_checkpoint(self) -> None:
        with clean_env():
            self.assertIsNone(train.get_checkpoint())
        with clean_env(TRAINYARD_CHECKPOINT=""):
            self.assertIsNone(train.get_checkpoint())
        with clean_env(TRAINYARD_CHECKPOINT="/runs/a/checkpoint_000002"):
            self.assertEqual(
                train.get_checkpoint(), train.Checkpoint("/runs/a/checkpoint_000002")
            )


class StorageTest(unittest.TestCase):
    def test_checkpoint_paths_are_folders_of_the_run_folder(self) -> None:
        for run_dir in ("/runs/mnist", "s3://bucket/runs/mnist/"):
            with clean_env(TRAINYARD_RUN_DIR=run_dir):
                storage = train.get_context().get_storage()
                self.assertEqual(storage.experiment_fs_path, run_dir)
                self.assertEqual(
                    storage.build_checkpoint_path_from_name("dcp/step_3/"),
                    run_dir.rstrip("/") + "/dcp/step_3",
                )
                for bad in ("", "..", "a/../../b", "/", "logs/x", "checkpoint_000003"):
                    with self.assertRaises(ValueError):
                        storage.build_checkpoint_path_from_name(bad)
        with clean_env():
            with self.assertRaises(RuntimeError):
                train.get_context().get_storage().build_checkpoint_path_from_name("a")


class ContextTest(unittest.TestCase):
    def values(self) -> list:
        ctx = train.get_context()
        return [
            ctx.get_world_rank(),
            ctx.get_local_rank(),
            ctx.get_world_size(),
            ctx.get_local_world_size(),
            ctx.get_node_rank(),
            ctx.get_experiment_name(),
        ]

    def test_trainyards_variables_come_first_then_torchruns_then_defaults(self) -> None:
        torchrun = dict(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2",
                        GROUP_RANK="1")
        with clean_env():
            self.assertEqual(self.values(), [0, 0, 1, 1, 0, None])
        with clean_env(**torchrun):
            self.assertEqual(self.values(), [3, 1, 4, 2, 1, None])
        with clean_env(TRAINYARD_WORLD_RANK="5", TRAINYARD_LOCAL_RANK="0",
                       TRAINYARD_WORLD_SIZE="8", TRAINYARD_LOCAL_WORLD_SIZE="4",
                       TRAINYARD_NODE_RANK="1", TRAINYARD_RUN_NAME="mnist", **torchrun):
            self.assertEqual(self.values(), [5, 0, 8, 4, 1, "mnist"])

    def test_a_variable_that_is_not_a_number_is_named(self) -> None:
        with clean_env(TRAINYARD_WORLD_RANK="two"):
            with self.assertRaisesRegex(ValueError, "TRAINYARD_WORLD_RANK"):
                train.get_context().get_world_rank()


if __name__ == "__main__":
    unittest.main()
