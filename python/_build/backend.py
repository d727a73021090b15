"""A PEP 517 build backend for this directory, standard library only.

It builds a pure-Python wheel of the ``trainyard`` package and the
``trainyard_report`` module (and an sdist, and an editable wheel for
``pip install -e``), so that installing needs nothing from a package registry.
The name and version come from ``pyproject.toml``'s ``[project]`` table.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "trainyard"
MODULES = ["trainyard_report.py"]
SDIST_FILES = ["pyproject.toml", "README.md", "_build/backend.py"] + MODULES


def _project() -> Dict[str, str]:
    """The plain ``key = "value"`` entries of ``[project]`` in ``pyproject.toml``."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if table is None:
        raise RuntimeError("pyproject.toml has no [project] table")
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"\s*$', table.group(1), re.M))


def _metadata() -> str:
    project = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project.get('description', '')}",
        "License: Apache-2.0",
        f"Requires-Python: {project.get('requires-python', '>=3.8')}",
        "Description-Content-Type: text/markdown",
    ]
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return "\n".join(lines) + "\n\n" + readme


def _package_files() -> List[str]:
    """The wheel's source files, relative to this directory, sorted."""
    files = []
    for root, dirs, names in os.walk(os.path.join(HERE, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                files.append(os.path.relpath(os.path.join(root, name), HERE))
    return sorted(files) + MODULES


def _names() -> Tuple[str, str]:
    project = _project()
    name = re.sub(r"[-_.]+", "_", project["name"]).lower()
    return name, project["version"]


def _dist_info() -> str:
    name, version = _names()
    return f"{name}-{version}.dist-info"


def _write_dist_info(directory: str) -> str:
    dist_info = os.path.join(directory, _dist_info())
    os.makedirs(dist_info, exist_ok=True)
    for name, text in _dist_info_files().items():
        with open(os.path.join(dist_info, name), "w", encoding="utf-8") as f:
            f.write(text)
    return os.path.basename(dist_info)


def _dist_info_files() -> Dict[str, str]:
    return {
        "METADATA": _metadata(),
        "WHEEL": "Wheel-Version: 1.0\nGenerator: trainyard-backend\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
        "top_level.txt": f"{PACKAGE}\n" + "".join(m[:-3] + "\n" for m in MODULES),
    }


def _wheel(wheel_directory: str, contents: Dict[str, bytes]) -> str:
    """Writes a wheel of ``contents`` (archive name -> bytes) with its dist-info."""
    name, version = _names()
    dist_info = _dist_info()
    for meta, text in _dist_info_files().items():
        contents[f"{dist_info}/{meta}"] = text.encode("utf-8")
    record = []
    for arcname, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{arcname},sha256={digest.decode('ascii')},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode("utf-8")
    filename = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(
        os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED
    ) as wheel:
        for arcname, data in contents.items():
            wheel.writestr(zipfile.ZipInfo(arcname, (1980, 1, 1, 0, 0, 0)), data)
    return filename


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Optional[dict] = None
) -> str:
    return _write_dist_info(metadata_directory)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: Optional[dict] = None
) -> str:
    return _write_dist_info(metadata_directory)


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[dict] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    contents = {}
    for path in _package_files():
        with open(os.path.join(HERE, path), "rb") as f:
            contents[path.replace(os.sep, "/")] = f.read()
    return _wheel(wheel_directory, contents)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[dict] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """A wheel that puts this directory on ``sys.path`` (``pip install -e``)."""
    return _wheel(wheel_directory, {f"{PACKAGE}_editable.pth": (HERE + "\n").encode("utf-8")})


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    name, version = _names()
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as sdist:
        for path in SDIST_FILES + _package_files()[: -len(MODULES)]:
            sdist.add(os.path.join(HERE, path), arcname=f"{base}/{path}", recursive=False)
        info = _metadata().encode("utf-8")
        entry = tarfile.TarInfo(f"{base}/PKG-INFO")
        entry.size = len(info)
        sdist.addfile(entry, io.BytesIO(info))
    return filename
