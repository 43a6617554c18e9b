"""The run archive as files under the state directory (``<state_dir>/archive/...``): the S3 adapter's keys
as relative paths (:mod:`duetime.domain.archive`). Each file is written whole to a temporary file beside it
and renamed into place, so a reader sees all of an object or none, and a key written again is replaced."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_TEMP_PREFIX = ".tmp-"


class FileArchive:
    """:class:`~duetime.domain.ports.ArchiveStore` on files under ``directory`` (the state directory)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or "\x00" in key or "\\" in key or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"archive key {key!r} is not a relative path of plain names")
        return self.directory.joinpath(*parts)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        try:
            with self._path(key).open("rb") as f:
                f.seek(offset)
                return f.read(length)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def list_keys(self, prefix: str) -> list[str]:
        base, _, _ = prefix.rpartition("/")
        root = self.directory.joinpath(*base.split("/")) if base else self.directory
        if not root.is_dir():
            return []
        keys = []
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name.startswith(_TEMP_PREFIX):
                    continue
                key = Path(dirpath, name).relative_to(self.directory).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def list_dirs(self, prefix: str) -> list[str]:
        base, _, start = prefix.rpartition("/")
        root = self.directory.joinpath(*base.split("/")) if base else self.directory
        if not root.is_dir():
            return []
        head = f"{base}/" if base else ""
        return sorted(f"{head}{p.name}/" for p in root.iterdir() if p.is_dir() and p.name.startswith(start))
