"""Run logs in S3: one object per attempt, ``logs/<job_id>/<run_id>/attempt-<n>.log``.

While an attempt runs, its worker streams the output as numbered chunk objects under a prefix of their own
beside the final object, ``logs/<job_id>/<run_id>/attempt-<n>.log.live/<seq:06d>`` (DESIGN.md section 7): a
killed attempt keeps what it printed, and a RUNNING run's log can be read as it grows. At the end the worker
writes the final object (head and tail, as before) and deletes the chunks. A reader takes the final object
when there is one, else the chunks concatenated in order.

The chunks stay under ``logs/`` so that the grants that already cover the final objects (the workers'
PutObject, the API's GetObject and ListBucket) cover them too, and the bucket's expiry applies to both.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from duetime.adapters.aws import clients as aws
from duetime.domain.errors import LogStoreError

#: what follows an attempt's final key in the key prefix of its chunk objects
LIVE_SUFFIX = ".live/"
#: chunks fetched at once when a log is read from its chunks
_PARALLEL_GETS = 8
#: DeleteObjects takes at most this many keys per call
_DELETE_BATCH = 1000


def chunk_prefix(key: str) -> str:
    """The key prefix of the chunk objects streamed for the final object ``key``."""
    return f"{key}{LIVE_SUFFIX}"


def chunk_key(key: str, seq: int) -> str:
    """The key of chunk number ``seq`` (0, 1, ...) of ``key``: zero-padded, so key order is chunk order."""
    return f"{chunk_prefix(key)}{seq:06d}"


class S3Logs:
    """Read and write run logs in ``bucket``."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    @property
    def _s3(self) -> Any:
        return aws.client("s3")

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` (UTF-8 text, possibly truncated by the caller) at ``key``."""
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="text/plain; charset=utf-8")

    def put_chunk(self, key: str, seq: int, data: bytes) -> None:
        """Store the next piece of a running attempt's output as chunk ``seq`` of the log ``key``."""
        self.put(chunk_key(key, seq), data)

    def get(self, key: str) -> bytes | None:
        """The final object at ``key``; else (the attempt is running, or its worker died) its chunks
        concatenated in order; None if neither exists."""
        final = self.get_final(key)
        if final is not None:
            return final
        keys = list(self._chunk_keys(key))
        if not keys:
            return None
        if len(keys) == 1:
            parts = [self.get_final(keys[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(_PARALLEL_GETS, len(keys))) as pool:
                parts = list(pool.map(self.get_final, keys))
        if any(part is None for part in parts):
            # the attempt ended between the listing and the reads: its worker wrote the final object, then
            # deleted the chunks
            final = self.get_final(key)
            if final is not None:
                return final
        return b"".join(part for part in parts if part is not None)

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """Bytes ``offset .. offset + length - 1`` of the object at ``key`` (a ranged GetObject), or None if
        it does not exist. Raises ValueError for a negative offset or length."""
        if offset < 0 or length < 0:
            raise ValueError(f"byte range {offset}+{length} is negative")
        if length == 0:
            return b""
        try:
            out = self._s3.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
            )
        except self._s3.exceptions.NoSuchKey:
            return None
        return bytes(out["Body"].read())

    def delete_chunks(self, key: str, count: int | None = None) -> None:
        """Delete the chunks of ``key``: chunks ``0..count-1`` when the caller knows how many it wrote (no
        listing needed), else every chunk listed under its prefix.

        Raises:
            LogStoreError: S3 refused to delete some of the objects (a failed call raises the SDK's error).
        """
        keys = (
            [chunk_key(key, seq) for seq in range(count)]
            if count is not None
            else list(self._chunk_keys(key))
        )
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            out = self._s3.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            if out.get("Errors"):
                first = out["Errors"][0]
                raise LogStoreError(
                    f"DeleteObjects: {len(out['Errors'])} of {len(batch)} chunks not deleted "
                    f"({first.get('Code', 'DeleteFailed')}: {first.get('Message', '')})"
                )

    def get_final(self, key: str) -> bytes | None:
        """The object at ``key`` only (a final log, or one chunk by its :func:`chunk_key`), or None: one
        GetObject, for a caller that knows no chunks exist (a Lambda task's log)."""
        try:
            return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
        except self._s3.exceptions.NoSuchKey:
            return None

    def _chunk_keys(self, key: str) -> Iterator[str]:
        """The chunk keys of ``key`` in chunk order."""
        prefix = chunk_prefix(key)
        found: list[tuple[int, str]] = []
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                tail = item["Key"][len(prefix) :]
                if tail.isdigit():
                    found.append((int(tail), item["Key"]))
        yield from (k for _, k in sorted(found))
