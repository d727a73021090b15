"""Shared set-up of the driver tests: each test's runs keep their folders under its own
temporary directory, and no variable of an outer trainyard run leaks in."""

from __future__ import annotations

import os

import pytest

_LEAKS = (
    "TRAINYARD_REPORT_ADDR",
    "TRAINYARD_REPORT_TOKEN",
    "TRAINYARD_CHECKPOINT",
    "TRAINYARD_RUNTIME",
    "TRAINYARD_NUM_CPUS",
    "TRAINYARD_STORAGE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LEAKS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def storage(tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A storage folder of this test's own."""
    path = tmp_path / "results"
    path.mkdir()
    return os.fspath(path)
