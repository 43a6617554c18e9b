"""Run logs as files: one file per attempt under a directory, streamed in numbered chunk files meanwhile.

The layout is the S3 adapter's, keys become paths: the final log ``logs/<job>/<run>/attempt-<n>.log`` and,
while the attempt runs, its chunks ``logs/<job>/<run>/attempt-<n>.log.live/<seq:06d>`` (zero-padded: name
order is chunk order). Every file is written whole to a temporary file beside it and renamed into place
(``os.replace``), so a reader sees either nothing or the whole file. A reader takes the final file when
there is one, else the chunks concatenated in order.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from duetime.domain.errors import LogStoreError

#: what follows an attempt's final key in the key prefix of its chunks (as the S3 adapter's)
LIVE_SUFFIX = ".live/"
#: names of files being written (never a chunk: chunks are all digits)
_TEMP_PREFIX = ".tmp-"


def chunk_prefix(key: str) -> str:
    """The key prefix of the chunks streamed for the final log ``key``."""
    return f"{key}{LIVE_SUFFIX}"


def chunk_key(key: str, seq: int) -> str:
    """The key of chunk number ``seq`` (0, 1, ...) of ``key``."""
    return f"{chunk_prefix(key)}{seq:06d}"


class FileLogs:
    """Read and write run logs under ``directory`` (:class:`~duetime.domain.ports.LogStore`).

    Keys are relative paths of ``/``-separated parts; a key that is absolute, empty, has an empty, ``.`` or
    ``..`` part, a backslash or a NUL, raises ValueError (no key names a file outside the directory).
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """The file of ``key``.

        Raises:
            ValueError: ``key`` is not a safe relative key.
        """
        parts = key.split("/")
        if (
            not key
            or "\x00" in key
            or "\\" in key
            or any(part in ("", ".", "..") for part in parts)
            or any(part.startswith(_TEMP_PREFIX) for part in parts)
        ):
            raise ValueError(f"log key {key!r} is not a relative path of plain names")
        path = self.directory.joinpath(*parts)
        if not path.resolve().is_relative_to(self.directory):  # a symlink inside pointing out
            raise ValueError(f"log key {key!r} leads outside {self.directory}")
        return path

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass
            raise

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def put(self, key: str, data: bytes) -> None:
        """Store the final log ``data`` at ``key`` (replacing any earlier one whole)."""
        self._write(self.path(key), data)

    def put_chunk(self, key: str, seq: int, data: bytes) -> None:
        """Store chunk ``seq`` (0, 1, ...) of the running attempt's log ``key``."""
        if seq < 0:
            raise ValueError(f"chunk number {seq} < 0")
        self._write(self.path(chunk_key(key, seq)), data)

    def get_final(self, key: str) -> bytes | None:
        """The file at ``key`` only (a final log, or one chunk by its :func:`chunk_key`), or None."""
        return self._read(self.path(key))

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """Bytes ``offset .. offset + length - 1`` of the file at ``key``, or None if there is none. Raises
        ValueError for a negative offset or length, or an unsafe key."""
        if offset < 0 or length < 0:
            raise ValueError(f"byte range {offset}+{length} is negative")
        try:
            with self.path(key).open("rb") as f:
                f.seek(offset)
                return f.read(length)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get(self, key: str) -> bytes | None:
        """The final log at ``key``; else its chunks concatenated in order; else None."""
        final = self.get_final(key)
        if final is not None:
            return final
        paths = self._chunk_paths(key)
        if not paths:
            return None
        parts = [self._read(p) for p in paths]
        if any(part is None for part in parts):
            # the attempt ended between the listing and the reads: the final file came, the chunks went
            final = self.get_final(key)
            if final is not None:
                return final
        return b"".join(part for part in parts if part is not None)

    def delete_chunks(self, key: str, count: int | None = None) -> None:
        """Delete chunks ``0..count-1`` of ``key`` (every chunk when ``count`` is None), then their
        directory if it is empty.

        Raises:
            LogStoreError: some chunks could not be deleted.
        """
        paths = (
            [self.path(chunk_key(key, seq)) for seq in range(count)]
            if count is not None
            else self._chunk_paths(key)
        )
        failed: list[str] = []
        for path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{path.name}: {exc.strerror or exc}")
        if failed:
            raise LogStoreError(f"{len(failed)} of {len(paths)} chunks not deleted ({failed[0]})")
        try:
            self.path(chunk_prefix(key).rstrip("/")).rmdir()
        except OSError:
            pass  # not empty (a chunk beyond count), or absent

    def _chunk_paths(self, key: str) -> list[Path]:
        """The chunk files of ``key``, in chunk order."""
        folder = self.path(chunk_prefix(key).rstrip("/"))
        try:
            names = os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [folder / name for name in sorted((n for n in names if n.isdigit()), key=int)]
