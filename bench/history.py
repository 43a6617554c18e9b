"""Run history storage (issue 19): what one run costs to keep a month, hot and archived, measured on the
cost workload's own runs.

- **Hot**: each run's row as the runs table holds it at the end (DynamoDB's billed item size, read from
  moto with the bench's uncounted client, plus DynamoDB's 100 bytes of overhead per item), at
  ``dynamodb_storage_gb_month``.
- **Archived**: the same runs written by the archiver's own writer (``services.archiver.write_batch``, with
  each run's small final logs inlined, read from the logs bucket) as one batch into a bucket on the stack's
  moto server, the way the archiver Lambda writes one stream batch; the bytes of every object it wrote
  (data and per-job index) per run, at S3 Standard, Standard-IA and Glacier Instant Retrieval prices, and its
  PUTs per run.

IA and Glacier IR bill every object as at least 128 KB, and lifecycle transitions skip objects under 128 KB
(S3 User Guide, "Transitioning objects using Amazon S3 Lifecycle"): ``data_object_bytes_mean`` says whether
the workload's data object would move at all.
"""

from __future__ import annotations

import gzip
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from bench.prices import price

#: the bench's archive bucket on the stack's moto server (the moto backend archives nothing itself)
ARCHIVE_BUCKET = "duetime-bench-archive"
#: S3 IA and Glacier IR bill an object as at least this many bytes; lifecycle transitions skip smaller ones
MIN_TRANSITION_BYTES = 128 * 1024
#: DynamoDB bills each item's storage with this overhead, bytes
DYNAMODB_ITEM_OVERHEAD = 100


@contextmanager
def _duetime_clients_on(env: dict[str, str]) -> Iterator[None]:
    """Duetime's own cached clients pointed at the stack's moto server (``env``: the stack's environment),
    for the duration; the bench process's environment is restored after."""
    from duetime.adapters.aws import clients as aws

    keys = [k for k in env if k.startswith(("AWS_", "DUETIME_"))]
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: env[k] for k in keys})
    aws.reset_clients()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        aws.reset_clients()


def measure(stack: Any, job_ids: set[str]) -> dict[str, Any]:
    """Rows and archive objects of the runs of ``job_ids`` on the running moto ``stack`` (bench.stack)."""
    from duetime.adapters.aws.dynamodb import deserialize, run_from_item
    from duetime.config.deps import deps_from_settings
    from duetime.config.settings import settings_from_env
    from duetime.domain.archive import DATA_PREFIX, INDEX_PREFIX
    from duetime.local.callcount import item_size
    from duetime.services.archiver import inline_logs, write_batch

    ddb, s3 = stack.client("dynamodb"), stack.client("s3")
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": stack.state["tables"]["runs"]}
    while True:
        page = ddb.scan(**kwargs)
        items += [i for i in page.get("Items", []) if i["job_id"]["S"] in job_ids]
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    row_bytes = [item_size(i) for i in items]
    runs = [run_from_item(deserialize(i)) for i in items]

    s3.create_bucket(Bucket=ARCHIVE_BUCKET)
    with _duetime_clients_on(stack.state["env"]):
        settings = settings_from_env(stack.state["env"]).model_copy(update={"archive_bucket": ARCHIVE_BUCKET})
        deps = deps_from_settings(settings)
        assert deps.archive is not None
        write_batch(runs, batch="bench", archive=deps.archive, deps=deps, now=datetime.now(UTC))
        inline = sum(len(text.encode()) for run in runs for text in inline_logs(run, deps).values())
    data: list[int] = []
    index: list[int] = []
    raw = 0
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=ARCHIVE_BUCKET, Prefix="archive/")
    for page in pages:
        for obj in page.get("Contents", []):
            if obj["Key"].startswith(DATA_PREFIX):
                data.append(int(obj["Size"]))
                body = s3.get_object(Bucket=ARCHIVE_BUCKET, Key=obj["Key"])["Body"].read()
                raw += len(gzip.decompress(body))
            elif obj["Key"].startswith(INDEX_PREFIX):
                index.append(int(obj["Size"]))
    return {
        "runs": len(runs),
        "row_bytes": row_bytes,
        "data_objects": data,
        "index_objects": index,
        "data_bytes_uncompressed": raw,
        "inline_log_bytes": inline,
    }


def price_it(raw: dict[str, Any]) -> dict[str, Any]:
    """``cost.storage_hot`` and ``cost.storage_archive`` from :func:`measure`."""
    runs = max(1, int(raw["runs"]))
    rows = raw["row_bytes"]
    hot_bytes = statistics.mean(rows) + DYNAMODB_ITEM_OVERHEAD if rows else 0.0
    data, index = raw["data_objects"], raw["index_objects"]
    archived = (sum(data) + sum(index)) / runs
    month = {
        "standard": price("s3_storage_gb_month"),
        "infrequent_access": price("s3_ia_storage_gb_month"),
        "glacier_instant_retrieval": price("s3_glacier_ir_storage_gb_month"),
    }
    data_mean = statistics.mean(data) if data else 0.0
    return {
        "storage_hot": {
            "runs": raw["runs"],
            "row_bytes_median": statistics.median(rows) if rows else None,
            "row_bytes_mean": round(statistics.mean(rows), 1) if rows else None,
            "bytes_per_run": round(hot_bytes, 1),
            "usd_per_million_runs_month": round(
                hot_bytes / 1e9 * price("dynamodb_storage_gb_month") * 1e6, 4
            ),
            "note": "each run's row at the end (billed item size) + 100 B of DynamoDB overhead, $0.25/GB-month",
        },
        "storage_archive": {
            "runs": raw["runs"],
            "batches": 1,
            "data_objects": len(data),
            "index_objects": len(index),
            "bytes_per_run": round(archived, 1),
            "data_bytes_per_run": round(sum(data) / runs, 1),
            "index_bytes_per_run": round(sum(index) / runs, 1),
            "uncompressed_bytes_per_run": round(raw["data_bytes_uncompressed"] / runs, 1),
            "inline_log_bytes_per_run": round(raw["inline_log_bytes"] / runs, 1),
            "compression_ratio": round(raw["data_bytes_uncompressed"] / sum(data), 2) if data else None,
            "data_object_bytes_mean": round(data_mean),
            "data_objects_transition": data_mean >= MIN_TRANSITION_BYTES,
            "puts_per_run": round((len(data) + len(index)) / runs, 3),
            "put_usd_per_million_runs": round((len(data) + len(index)) / runs * price("s3_put") * 1e6, 2),
            "usd_per_million_runs_month": {
                name: round(archived / 1e9 * usd * 1e6, 4) for name, usd in month.items()
            },
            "note": (
                "the workload's runs written as one batch by services.archiver.write_batch (gzip JSON Lines, "
                "a member per job, small logs inlined; a per-job index object); the workload's logs are "
                "`yes` output, which compresses far better than real logs"
            ),
        },
    }
