"""The run archive's layout and line format (issue 19; pure, no I/O).

Runs leaving the hot window are written in batches, one object per batch per partition:

- data: ``archive/runs/tenant=<T>/dt=<YYYY-MM-DD>/<batch>.jsonl.gz``, gzip-compressed JSON Lines, one line per
  run (the whole run with its attempts and events, ``run_id``, ``job_id``, ``tenant``, ``archived_at`` and
  ``logs``: the final logs under :data:`INLINE_LOG_BYTES` by attempt, since S3's lifecycle transitions skip
  objects under 128 KB; larger logs stay in the logs bucket and move by its lifecycle rule). ``dt`` is the
  run's due day (UTC). The object is one gzip member per job (concatenated members are one valid gzip
  stream, which Athena reads as one file), so one job's runs are read with one ranged GET.
- per-job index: ``archive/index/tenant=<T>/job=<J>/dt=<D>/<batch>.json``, one small object per batch per job
  per day naming the data object, the byte range of the job's member and each run's due time and state. A
  job's archived runs are listed day by day (a delimiter listing of the job's days, then the day's entries)
  without reading a tenant's partition; a run is found by id from its due day alone (the run id names its
  job and due time).

Why an index object and not a per-job data prefix: Athena's partition projection is over tenant and day (the
issue's queries cut across a tenant's jobs), and a prefix per job would make a batch of N jobs N data objects
of a few hundred bytes each; the index costs the same PUTs, keeps the data in few large objects for Athena and
the lifecycle rules, and its entries are never scanned by Athena (outside the table's location).

A batch's key is deterministic (the stream batch's first sequence number on AWS; a hash of its run ids on the
local stack), so a batch written again overwrites itself; readers also drop a run seen twice (kept hot and
archived, after a crash between the archive's write and the hot delete).
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from duetime.domain.models import Run
from duetime.domain.timeutil import to_epoch_ms

DATA_PREFIX = "archive/runs/"
INDEX_PREFIX = "archive/index/"
#: final logs up to this size are written into the archive object (S3 lifecycle transitions skip objects
#: under 128 KB, so small logs would stay in S3 Standard until they expire)
INLINE_LOG_BYTES = 128 * 1024


def day_of(instant: datetime) -> str:
    """The partition day of ``instant`` (UTC): ``YYYY-MM-DD``."""
    return instant.date().isoformat()


def data_key(tenant: str, day: str, batch: str) -> str:
    """``archive/runs/tenant=<T>/dt=<D>/<batch>.jsonl.gz``."""
    return f"{DATA_PREFIX}tenant={tenant}/dt={day}/{batch}.jsonl.gz"


def job_index_prefix(tenant: str, job_id: str) -> str:
    """The key prefix of one job's index: ``archive/index/tenant=<T>/job=<J>/``."""
    return f"{INDEX_PREFIX}tenant={tenant}/job={job_id}/"


def day_index_prefix(tenant: str, job_id: str, day: str) -> str:
    """``archive/index/tenant=<T>/job=<J>/dt=<D>/``."""
    return f"{job_index_prefix(tenant, job_id)}dt={day}/"


def index_key(tenant: str, job_id: str, day: str, batch: str) -> str:
    return f"{day_index_prefix(tenant, job_id, day)}{batch}.json"


def batch_id_of(run_ids: Sequence[str]) -> str:
    """A local batch's key: a hash of its run ids (the same runs archived again overwrite their object)."""
    return hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:32]


def run_line(run: Run, *, logs: Mapping[int, str], archived_at: datetime) -> dict[str, Any]:
    """One archive line: the whole run, its id, when it was archived and its inline logs by attempt."""
    line = run.model_dump(mode="json")
    line["run_id"] = run.run_id
    line["archived_at"] = archived_at.isoformat()
    line["logs"] = {str(k): v for k, v in sorted(logs.items())}
    return line


def run_of_line(line: Mapping[str, Any]) -> Run:
    """The run of an archive line (read leniently, as every stored row)."""
    return Run.from_stored({k: v for k, v in line.items() if k not in ("run_id", "archived_at", "logs")})


@dataclass(frozen=True)
class IndexEntry:
    """One job's runs in one archive object: the object, its member's byte range, ``(due ms, state)`` each."""

    key: str
    offset: int
    length: int
    runs: tuple[tuple[int, str], ...]

    def to_json(self) -> bytes:
        body = {
            "key": self.key,
            "offset": self.offset,
            "length": self.length,
            "runs": [list(r) for r in self.runs],
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> IndexEntry:
        body = json.loads(data)
        return cls(
            key=str(body["key"]),
            offset=int(body["offset"]),
            length=int(body["length"]),
            runs=tuple((int(ms), str(state)) for ms, state in body["runs"]),
        )


@dataclass(frozen=True)
class ArchiveObject:
    """One partition's object of a batch, and the index entries of its jobs."""

    key: str
    data: bytes
    index: tuple[tuple[str, IndexEntry], ...]


def encode_batch(lines: Sequence[Mapping[str, Any]], *, batch: str) -> list[ArchiveObject]:
    """The objects of one batch of archive lines: one per (tenant, due day), one gzip member per job in it
    (jobs and runs in a stable order, so the same batch encodes to the same bytes)."""
    partitions: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = {}
    for line in lines:
        day = str(line["due_at"])[:10]
        partitions.setdefault((str(line["tenant"]), day), {}).setdefault(str(line["job_id"]), []).append(line)
    out: list[ArchiveObject] = []
    for (tenant, day), jobs in sorted(partitions.items()):
        key = data_key(tenant, day, batch)
        data = bytearray()
        index: list[tuple[str, IndexEntry]] = []
        for job_id, job_lines in sorted(jobs.items()):
            job_lines = sorted(job_lines, key=lambda ln: str(ln["run_id"]))
            text = "".join(json.dumps(ln, separators=(",", ":"), sort_keys=True) + "\n" for ln in job_lines)
            member = gzip.compress(text.encode(), mtime=0)
            runs = tuple((_due_ms(ln), str(ln["state"])) for ln in job_lines)
            entry = IndexEntry(key=key, offset=len(data), length=len(member), runs=runs)
            index.append((index_key(tenant, job_id, day, batch), entry))
            data.extend(member)
        out.append(ArchiveObject(key=key, data=bytes(data), index=tuple(index)))
    return out


def decode_member(data: bytes) -> list[dict[str, Any]]:
    """The lines of one job's gzip member (or of a whole object: its members concatenated)."""
    return [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line]


def _due_ms(line: Mapping[str, Any]) -> int:
    return to_epoch_ms(datetime.fromisoformat(str(line["due_at"])))
