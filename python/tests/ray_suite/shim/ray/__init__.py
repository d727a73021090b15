"""An import shim that runs Ray Train v2's own tests against trainyard: ``ray.train`` and its
public modules are ``trainyard.train``'s; everything else of Ray is absent.

Used only by ``cargo xtask ray-tests`` (``python/tests/ray_suite/run.py``), which puts this
folder first on ``PYTHONPATH``. What maps where:

- ``ray.train``, ``ray.train.torch``, ``ray.train.lightning`` (and its ``_lightning_utils``),
  ``ray.train.huggingface.transformers``, ``ray.train.collective``: trainyard's modules.
- ``ray.train.v2.api.<module>`` (the home modules of Ray's public classes): ``trainyard.train``'s
  names, ``DataParallelTrainer`` being ``TorchTrainer`` (trainyard's one trainer: the same
  workers, with a gloo process group besides).
- ``ray.train.examples.*`` and ``ray.train.tests.*`` (but ``util``): Ray's own files, read
  from the Ray source folder (``RAY_SUITE_SOURCE``) and run through this shim;
  ``ray.train.tests.util``: the suite's own test helpers (``conftest.py``).
- ``ray.cloudpickle``: cloudpickle, the library Ray vendors.
- ``ray.init``/``ray.shutdown``/``ray.is_initialized``: nothing to start (trainyard's local
  runtime needs no cluster); ``ray.init(num_cpus=N)``'s logical CPUs are the local runtime's
  (``TRAINYARD_NUM_CPUS``, ``trainyard run --num-cpus``) until ``ray.shutdown()``.
- A name ``ray.train`` or ``ray.train.torch`` exports in Ray 2.60 and trainyard lacks
  (``UserCallback``, ``get_all_reported_checkpoints``, ...): a :class:`PublicName` that raises
  :class:`MissingFromTrainyard` when used: a test that needs it fails.
- Any other ``ray.*`` name (Ray's internals, Ray Data, Ray Core's tasks and actors): a
  :class:`RayInternal` stand-in that raises :class:`RayOnly` when used. It is never given a
  value: a test that needs it is counted as not applicable, not as passed.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Optional, Sequence

__version__ = "trainyard-shim"

_ALIASES = {
    "ray.train": "trainyard.train",
    "ray.train.torch": "trainyard.train.torch",
    "ray.train.lightning": "trainyard.train.lightning",
    "ray.train.lightning._lightning_utils": "trainyard.train.lightning._lightning_utils",
    "ray.train.huggingface": "trainyard.train.huggingface",
    "ray.train.huggingface.transformers": "trainyard.train.huggingface.transformers",
    "ray.train.collective": "trainyard.train.collective",
}

# The names ``ray.train`` and ``ray.train.torch`` export in Ray 2.60 (read from its wheel): one
# of these that trainyard lacks is a failure; another missing name is Ray's own business.
_PUBLIC = {
    "BackendConfig", "Checkpoint", "CheckpointConfig", "CheckpointConsistencyMode",
    "CheckpointUploadMode", "ControllerError", "DataConfig", "FailureConfig", "LoggingConfig",
    "NCCLHangError", "PreemptionError", "PreemptionInfo", "ReportedCheckpoint",
    "ReportedCheckpointStatus", "Result", "RunConfig", "ScalingConfig", "SyncConfig",
    "TrainContext", "TrainingFailedError", "UserCallback", "ValidationConfig", "ValidationFn",
    "ValidationTaskConfig", "WorkerGroupError", "get_all_reported_checkpoints",
    "get_checkpoint", "get_context", "get_dataset_shard", "get_preemption_info", "report",
    "TorchCheckpoint", "TorchConfig", "TorchTrainer", "accelerate", "backward",
    "enable_reproducibility", "get_device", "get_devices", "prepare_data_loader",
    "prepare_model", "prepare_optimizer",
}  # fmt: skip

# Ray's public classes under other names here.
_RENAMED = {"DataParallelTrainer": ("trainyard.train.torch", "TorchTrainer")}

# Data of Ray's internals that tests set or assert, meaningless to trainyard: the names of
# Ray's environment variables and files, and the v2 switch (trainyard is v2 only). Values
# as in Ray 2.60's ``ray/train/v2/_internal/constants.py``.
_RAY_DATA = {
    "ray.train.v2._internal.constants": {
        "HEALTH_CHECK_INTERVAL_S_ENV_VAR": "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S",
        "CHECKPOINT_MANAGER_SNAPSHOT_FILENAME": "checkpoint_manager_snapshot.json",
        "is_v2_enabled": lambda: True,
    },
}


class RayOnly(RuntimeError):
    """A test used a part of Ray that trainyard does not have (not applicable)."""


class MissingFromTrainyard(RuntimeError):
    """A test used a public name of ``ray.train`` that trainyard lacks (a failure)."""


class RayInternal:
    """What a name of Ray's internals stands for: using it raises ``RayOnly``."""

    _error: type = RayOnly
    _says = "RayInternal: {} is Ray's, not trainyard's"

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise self._error(self._says.format(self._name))

    __call__ = _refuse

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(self)(f"{self._name}.{attr}")

    def __setattr__(self, attr: str, value: Any) -> None:
        self._refuse()

    def __mro_entries__(self, bases: Any) -> Any:
        # `class Mine(ray.train.backend.Backend)`: refused as any other use.
        self._refuse()

    def __reduce__(self) -> Any:
        return (type(self), (self._name,))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name})"


class PublicName(RayInternal):
    """A public name of ``ray.train`` that trainyard lacks: using it raises
    ``MissingFromTrainyard``, which counts as a failure, not as not applicable."""

    _error = MissingFromTrainyard
    _says = "{} is public in Ray Train 2.60 and missing from trainyard"


class _ByName(types.ModuleType):
    """A module of this shim: pickled by its name (a loop function that uses ``ray.train``
    travels to the workers, where the shim is on the path too)."""

    def __reduce__(self) -> Any:
        return (importlib.import_module, (self.__name__,))


class _RayInternalModule(_ByName):
    """A module of Ray's that trainyard lacks: every name in it is a ``RayInternal``, but for
    the data of ``_RAY_DATA``."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        data = _RAY_DATA.get(self.__name__, {})
        if attr in data:
            return data[attr]
        return RayInternal(f"{self.__name__}.{attr}")


class _Proxy(_ByName):
    """A public module of Ray's: the names of trainyard's modules ``_targets`` (the first
    that has it), or a ``RayInternal`` for a name none has."""

    _targets: Sequence[str] = ()

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_targets":
            raise AttributeError(attr)
        if attr in _RENAMED:
            module, name = _RENAMED[attr]
            return getattr(importlib.import_module(module), name)
        for module in self._targets:
            value = getattr(importlib.import_module(module), attr, None)
            if value is not None:
                return value
        stand_in = PublicName if attr in _PUBLIC else RayInternal
        return stand_in(f"{self.__name__}.{attr}")


def _proxy(targets: Sequence[str]) -> Any:
    def make(name: str) -> types.ModuleType:
        module = _package(_Proxy, name)
        module._targets = tuple(targets)  # type: ignore[attr-defined]
        return module

    return make


def _source_file(name: str) -> Optional[str]:
    """Ray's own file for module ``name`` under ``RAY_SUITE_SOURCE``, if it is there."""
    root = os.environ.get("RAY_SUITE_SOURCE")
    if not root:
        return None
    base = os.path.join(root, *name.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, make: Any) -> None:
        self._make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self._make(spec.name)
        return module  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _package(cls: type, name: str) -> types.ModuleType:
    module = cls(name)
    module.__path__ = []  # type: ignore[attr-defined]
    return module


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith("ray."):
            return None
        if fullname == "ray.cloudpickle":
            return importlib.util.spec_from_loader(
                fullname, _Loader(lambda _name: importlib.import_module("cloudpickle"))
            )
        if fullname in _ALIASES:
            return importlib.util.spec_from_loader(
                fullname, _Loader(_proxy([_ALIASES[fullname]])), is_package=True
            )
        if fullname == "ray.train.tests.util" or fullname.startswith(
            ("ray.train.examples", "ray.train.tests")
        ):
            if fullname == "ray.train.tests.util":
                return None  # the suite's conftest puts its own in sys.modules
            source = _source_file(fullname)
            if source is not None:
                return importlib.util.spec_from_file_location(
                    fullname,
                    source,
                    submodule_search_locations=[os.path.dirname(source)]
                    if source.endswith("__init__.py")
                    else None,
                )
            return importlib.util.spec_from_loader(
                fullname, _Loader(lambda name: _package(types.ModuleType, name))
            )
        if fullname in ("ray.train.v2", "ray.train.v2.api") or fullname.startswith(
            "ray.train.v2.api."
        ):
            return importlib.util.spec_from_loader(
                fullname,
                _Loader(_proxy(["trainyard.train", "trainyard.train.torch"])),
                is_package=True,
            )
        return importlib.util.spec_from_loader(
            fullname, _Loader(lambda name: _package(_RayInternalModule, name)), is_package=True
        )


sys.meta_path.insert(0, _Finder())

_started = False


# `ray.init(num_cpus=N)` declares the logical CPUs of Ray's local cluster; trainyard's local
# runtime takes the same from this variable (`trainyard run --num-cpus`).
_NUM_CPUS_ENV = "TRAINYARD_NUM_CPUS"
_num_cpus_before: Optional[str] = None


def init(*args: Any, num_cpus: Optional[float] = None, **kwargs: Any) -> Any:
    """Nothing to start: trainyard's local runtime needs no cluster. ``num_cpus`` becomes
    the CPUs the local runtime offers, as it is Ray's local cluster's."""
    global _started, _num_cpus_before
    if num_cpus is not None and not _started:
        _num_cpus_before = os.environ.get(_NUM_CPUS_ENV)
        os.environ[_NUM_CPUS_ENV] = str(num_cpus)
    _started = True
    return None


def shutdown(*args: Any, **kwargs: Any) -> None:
    global _started, _num_cpus_before
    if _started:
        if _num_cpus_before is None:
            os.environ.pop(_NUM_CPUS_ENV, None)
        else:
            os.environ[_NUM_CPUS_ENV] = _num_cpus_before
        _num_cpus_before = None
    _started = False


def is_initialized() -> bool:
    return _started


def __getattr__(attr: str) -> Any:
    if attr.startswith("__"):
        raise AttributeError(attr)
    if attr in ("train", "cloudpickle"):
        # `from ray import train` before `ray.train` was imported: the submodule.
        return importlib.import_module(f"ray.{attr}")
    return RayInternal(f"ray.{attr}")
