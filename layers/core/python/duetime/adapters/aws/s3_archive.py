"""The run archive in S3 (:mod:`duetime.domain.archive`: its layout); the bucket's lifecycle moves it
Standard -> Infrequent Access -> Glacier Instant Retrieval (all read by ranged GET at once)."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from duetime.adapters.aws import clients as aws


class S3Archive:
    """:class:`~duetime.domain.ports.ArchiveStore` on ``bucket``."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    @property
    def _s3(self) -> Any:
        return aws.client("s3")

    def put(self, key: str, data: bytes) -> None:
        content = "application/json" if key.endswith(".json") else "application/gzip"
        self._s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType=content)

    def get(self, key: str) -> bytes | None:
        try:
            return bytes(self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        if length <= 0:
            return b""
        try:
            out = self._s3.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "InvalidRange"):
                return None
            raise
        return bytes(out["Body"].read())

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(str(o["Key"]) for o in page.get("Contents", []))
        return sorted(keys)

    def list_dirs(self, prefix: str) -> list[str]:
        dirs: list[str] = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, Delimiter="/"
        )
        for page in pages:
            dirs.extend(str(p["Prefix"]) for p in page.get("CommonPrefixes", []))
        return sorted(dirs)
