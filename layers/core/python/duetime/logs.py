"""Run logs in S3: one object per attempt, ``logs/<job_id>/<run_id>/attempt-<n>.log``."""

from __future__ import annotations

from typing import Any

from duetime import aws


def log_key(job_id: str, run_id: str, attempt: int) -> str:
    """The S3 key of one attempt's combined stdout+stderr."""
    return f"logs/{job_id}/{run_id}/attempt-{attempt}.log"


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

    def get(self, key: str) -> bytes | None:
        """The object at ``key``, or None if it does not exist."""
        try:
            return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]
        except self._s3.exceptions.NoSuchKey:
            return None
