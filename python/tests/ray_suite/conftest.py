"""What Ray's own ``conftest.py`` and ``ray/train/tests/util.py`` give Ray Train v2's tests
(neither is in Ray's wheel), for ``cargo xtask ray-tests``: the fixtures the chosen tests use,
``ray.train.tests.util`` (``create_dict_checkpoint``, ``load_dict_checkpoint``), and a record of
each test's outcome, with the tests that used a part of Ray trainyard lacks marked not
applicable.

``RAY_SUITE_AGAINST`` says what runs: ``trainyard`` (``ray`` is the shim of ``shim/ray``) or
``ray`` (Ray itself); ``RAY_SUITE_RESULTS`` names the JSON file the outcomes are written to.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import types
from typing import Any, Dict, Iterator

import pytest

AGAINST = os.environ.get("RAY_SUITE_AGAINST", "trainyard")
_outcomes: Dict[str, Dict[str, str]] = {}


def _install_test_util() -> None:
    """``ray.train.tests.util``: a dict in a checkpoint folder, and back."""
    import cloudpickle

    module = types.ModuleType("ray.train.tests.util")

    @contextlib.contextmanager
    def create_dict_checkpoint(data: Dict[str, Any]) -> Iterator[Any]:
        from ray.train import Checkpoint

        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "data.pkl"), "wb") as f:
                cloudpickle.dump(data, f)
            yield Checkpoint.from_directory(folder)

    def load_dict_checkpoint(checkpoint: Any) -> Dict[str, Any]:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "data.pkl"), "rb") as f:
                return dict(cloudpickle.load(f))

    module.create_dict_checkpoint = create_dict_checkpoint  # type: ignore[attr-defined]
    module.load_dict_checkpoint = load_dict_checkpoint  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module


class _RayTestsFinder:
    """With Ray itself: ``ray.train.tests.*`` and ``ray.tests.*`` (not in Ray's wheel) from
    the Ray source."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery
        import importlib.util

        if not fullname.startswith(("ray.train.tests", "ray.tests")) or fullname == (
            "ray.train.tests.util"
        ):
            return None
        root = os.environ.get("RAY_SUITE_SOURCE", "")
        base = os.path.join(root, *fullname.split("."))
        if os.path.isfile(base + ".py"):
            return importlib.util.spec_from_file_location(fullname, base + ".py")
        return importlib.machinery.ModuleSpec(fullname, None, is_package=True)


def pytest_collection_modifyitems(items: Any) -> None:
    """With Ray itself: the modules ``_RayTestsFinder`` read from the Ray source (Ray's test
    helpers, such as ``lightning_test_utils``) travel to Ray's workers by value, as the
    workers' Ray (the wheel) lacks them and has no such finder."""
    if AGAINST != "ray":
        return
    from ray import cloudpickle

    root = os.environ.get("RAY_SUITE_SOURCE", "")
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if (
            root
            and name.startswith(("ray.train.tests.", "ray.tests."))
            and path.startswith(root + os.sep)
        ):
            cloudpickle.register_pickle_by_value(module)


def _install_ray_start_cluster() -> None:
    """With Ray itself: ``ray.tests.conftest._ray_start_cluster`` (Ray's own ``conftest.py``,
    not in its wheel): a cluster of Ray's ``ray.cluster_utils.Cluster`` that the test adds
    nodes to, shut down after."""
    module = types.ModuleType("ray.tests.conftest")

    @contextlib.contextmanager
    def _ray_start_cluster() -> Iterator[Any]:
        import ray
        from ray.cluster_utils import Cluster

        cluster = Cluster()
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()

    module._ray_start_cluster = _ray_start_cluster  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module


if AGAINST == "ray":
    sys.meta_path.insert(0, _RayTestsFinder())  # type: ignore[arg-type]
    _install_ray_start_cluster()
_install_test_util()


@pytest.fixture()
def ray_start_4_cpus() -> Iterator[None]:
    import ray

    ray.init(num_cpus=4)
    yield
    ray.shutdown()


@pytest.fixture()
def ray_start_4_cpus_2_gpus() -> Iterator[None]:
    import ray

    ray.init(num_cpus=4, num_gpus=2)
    yield
    ray.shutdown()


@pytest.fixture
def shutdown_only() -> Iterator[None]:
    import ray

    yield None
    ray.shutdown()


class _NoS3:
    """The S3 bucket of Ray's ``mock_s3_bucket_uri``: not provided, so a test that uses it
    skips (requesting it costs nothing; the local cases of the same test run)."""

    def __str__(self) -> str:
        pytest.skip("not run here: the suite provides no S3 mock")

    __fspath__ = __str__


@pytest.fixture
def mock_s3_bucket_uri() -> _NoS3:
    return _NoS3()


@pytest.fixture(autouse=True)
def setup_logging() -> Iterator[None]:
    logger = logging.getLogger("ray.train")
    level = logger.getEffectiveLevel()
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


def _not_applicable(text: str) -> bool:
    return "RayInternal" in text or "RayOnly" in text


def _write() -> None:
    """The outcomes so far into ``RAY_SUITE_RESULTS`` (after each test: a run killed for
    its time keeps what it had)."""
    path = os.environ.get("RAY_SUITE_RESULTS")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(_outcomes, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    # Until its reports come: what a test killed for its time is left as.
    _outcomes[nodeid] = {"outcome": "timed out", "reason": "still running at the time limit"}
    _write()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes[report.nodeid]
    try:
        if report.when == "teardown" and report.outcome == "passed":
            if entry["outcome"] == "timed out":
                # Every phase reported, none failed. Not before: a test killed in its
                # call after its setup passed stays timed out.
                entry.update(outcome="passed", reason="")
            return
        _record(entry, report)
    finally:
        _write()


def _record(entry: Dict[str, str], report: pytest.TestReport) -> None:
    # The first phase that did not pass says what the test is.
    if report.outcome == "passed" or entry["outcome"] != "timed out":
        return
    text = str(report.longrepr or "")
    if report.outcome == "skipped":
        reason = text
        if isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2])
        entry.update(outcome="skipped", reason=reason)
    elif _not_applicable(text):
        line = next((ln for ln in text.splitlines() if "RayInternal" in ln), "")
        entry.update(outcome="not applicable", reason=line.strip()[-200:])
    else:
        # The last few lines of the error, not the repr of a test's data.
        last = [ln for ln in text.splitlines() if ln.startswith("E ") and len(ln) < 300][-3:]
        entry.update(outcome="failed", reason=" | ".join(ln[2:].strip() for ln in last)[-400:])


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        text = str(report.longrepr or "")
        outcome = "not applicable" if _not_applicable(text) else "failed"
        last = [ln for ln in text.splitlines() if ln.strip()][-1:]
        _outcomes[report.nodeid + "::(collection)"] = {
            "outcome": outcome,
            "reason": " ".join(last)[-400:],
        }
        _write()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write()
