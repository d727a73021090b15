"""``Checkpoint``: a directory of files handed in with ``report`` or resumed from, as Ray
Train's ``ray.train.Checkpoint``."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional, Union

__all__ = ["Checkpoint"]


class Checkpoint:
    """A directory of files: handed in with ``report``, or resumed from with
    ``get_checkpoint``.

    ``path`` is the directory's absolute path on this machine, or a URI
    (``s3://bucket/key``) kept as given: a folder in remote storage, for
    ``report(..., checkpoint_upload_mode=NO_UPLOAD)``. ``filesystem`` is
    accepted as Ray's is, when it is pyarrow's ``LocalFileSystem`` or
    ``S3FileSystem`` (a ``bucket/key`` path then becomes ``s3://bucket/key``).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], filesystem: Any = None) -> None:
        path = os.fspath(path)
        kind = None if filesystem is None else type(filesystem).__name__
        if kind == "S3FileSystem" and "://" not in path:
            path = "s3://" + path.lstrip("/")
        elif kind not in (None, "LocalFileSystem", "S3FileSystem"):
            raise TypeError(
                f"Checkpoint(filesystem=...) takes pyarrow's LocalFileSystem or S3FileSystem, "
                f"got {kind}: give the path as a local path or an s3:// URI instead"
            )
        self.path = path if "://" in path else os.path.abspath(path)
        self.filesystem = filesystem

    @classmethod
    def from_directory(cls, path: Union[str, "os.PathLike[str]"]) -> "Checkpoint":
        """The checkpoint made of the files under ``path``.

        Nothing is read yet: ``report`` has the agent copy the files, and fails
        if ``path`` is not a directory then.
        """
        return cls(path)

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A context manager yielding a local directory holding the files.

        The checkpoint is local already: this is its own directory; do not
        change what is in it.
        """
        yield self.path

    def to_directory(self, path: Optional[Union[str, "os.PathLike[str]"]] = None) -> str:
        """Copies the files into ``path`` (a new temporary directory when
        ``None``) and returns that directory."""
        import shutil
        import tempfile

        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="checkpoint_")
        shutil.copytree(self.path, dest, dirs_exist_ok=True)
        return dest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        where = "s3" if self.path.startswith("s3://") else "local"
        return f"Checkpoint(filesystem={where}, path={self.path})"
