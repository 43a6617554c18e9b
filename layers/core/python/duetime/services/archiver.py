"""The archiver: finished runs leaving the hot window go to the run archive (issue 19).

Two drivers, one writer (:func:`write_batch`):

- AWS: DynamoDB's TTL deletes a run row, the runs table's stream carries the deletion (its old image) to the
  archiver Lambda (``functions/archiver``), which keeps the TTL deletions (``userIdentity`` of
  ``dynamodb.amazonaws.com``) and archives their old images (:func:`archive_removed`); a run still among its
  job's last N is put back with its TTL re-armed instead (the keep-last rule, applied lazily).
- The local stack: the clock loop calls :func:`archive_expired`, which selects finished runs past their TTL
  from the embedded store (it has no TTL of its own), re-arms those among their job's last N, writes the rest
  to the archive and only then deletes them from the hot store. A crash between the two leaves the runs in
  both (the next pass writes the same batch key again, and readers drop a run seen twice), never in neither.

The writer stores each partition's data object first and its per-job index entries after it, so an entry
never names an object that is not there; the batch key is deterministic, so a retried batch overwrites.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from duetime.config.observability import logger
from duetime.domain.archive import INLINE_LOG_BYTES, batch_id_of, encode_batch, run_line
from duetime.domain.logs import PACK_PREFIX, log_key
from duetime.domain.models import Run
from duetime.domain.ports import ArchiveStore, RunExpiry
from duetime.services.deps import Deps

#: runs archived per local pass (one batch)
LOCAL_BATCH = 500


def inline_logs(run: Run, deps: Deps) -> dict[int, str]:
    """The final logs of ``run``'s ended attempts that are at most :data:`INLINE_LOG_BYTES` (those go into
    the archive object; a larger one stays in the logs bucket and is read from there)."""
    out: dict[int, str] = {}
    for record in run.attempts:
        size = record.log_bytes
        if size is None or size > INLINE_LOG_BYTES:
            continue
        if size == 0:
            out[record.attempt] = ""
            continue
        data = None
        if record.log_pack is not None and record.log_offset is not None:
            data = deps.logs.get_range(record.log_pack, record.log_offset, size)
        if data is None:
            key = record.log_key or log_key(run.job_id, run.run_id, record.attempt)
            if not key.startswith(PACK_PREFIX):
                data = deps.logs.get(key)
        if data is not None:
            out[record.attempt] = data.decode("utf-8", errors="replace")
    return out


def write_batch(
    runs: Sequence[Run], *, batch: str, archive: ArchiveStore, deps: Deps, now: datetime
) -> list[str]:
    """Write ``runs`` to ``archive`` as batch ``batch`` (its data objects, then their index entries); returns
    the data objects' keys. Writing the same batch again overwrites it."""
    lines = [run_line(run, logs=inline_logs(run, deps), archived_at=now) for run in runs]
    keys = []
    for obj in encode_batch(lines, batch=batch):
        archive.put(obj.key, obj.data)
        for index_key, entry in obj.index:
            archive.put(index_key, entry.to_json())
        keys.append(obj.key)
    return keys


def _newest(store_runs: Sequence[Run]) -> set[datetime]:
    return {r.due_at for r in store_runs}


def archive_expired(
    deps: Deps, expiry: RunExpiry, *, now: datetime | None = None, limit: int = LOCAL_BATCH
) -> int:
    """One local archiver pass: the finished runs past their TTL that are not among their job's last N go
    to the archive and then leave the hot store; those among the last N get their TTL re-armed. Returns
    how many runs were archived (0: nothing was due, or no archive is configured)."""
    if deps.archive is None:
        return 0
    now = now or deps.clock.now()
    policy = deps.settings.retention
    expired = expiry.expired_runs(now, limit=limit)
    if not expired:
        return 0
    kept: dict[str, set[datetime]] = {}
    rearm: list[tuple[str, datetime]] = []
    leaving: list[Run] = []
    for run, _ttl in expired:
        if run.job_id not in kept:
            kept[run.job_id] = _newest(deps.store.list_runs(run.job_id, limit=policy.keep_last))
        if run.due_at in kept[run.job_id]:
            rearm.append((run.job_id, run.due_at))
        else:
            leaving.append(run)
    if rearm:
        expiry.rearm_runs(rearm, expires_at=policy.rearmed(now))
    if leaving:
        batch = batch_id_of([r.run_id for r in leaving])
        write_batch(leaving, batch=batch, archive=deps.archive, deps=deps, now=now)
        expiry.delete_runs([(r.job_id, r.due_at) for r in leaving])
        logger.info("runs archived", extra={"runs": len(leaving), "batch": batch, "rearmed": len(rearm)})
    return len(leaving)


def archive_removed(runs: Sequence[Run], *, batch: str, deps: Deps, now: datetime | None = None) -> list[Run]:
    """The AWS path: ``runs`` are the old images of TTL deletions from the runs table's stream. Those still
    among their job's last N (fewer than N newer runs in the hot store) are put back with a re-armed TTL;
    the rest are written to the archive as batch ``batch`` (the stream batch's first sequence number, so
    a retried batch overwrites). Returns the archived runs.

    Raises:
        whatever the archive or the store raise: the caller reports the batch's records as failed."""
    now = now or deps.clock.now()
    policy = deps.settings.retention
    leaving: list[Run] = []
    for run in runs:
        newer = deps.store.query_runs(run.job_id, limit=max(policy.keep_last, 1), since=run.due_at)[0]
        if len([r for r in newer if r.due_at > run.due_at]) < policy.keep_last:
            put_back = getattr(deps.store, "put_back_run", None)
            if put_back is not None:
                put_back(run, expires_at=policy.rearmed(now))
                continue
        leaving.append(run)
    if leaving and deps.archive is not None:
        write_batch(leaving, batch=batch, archive=deps.archive, deps=deps, now=now)
    return leaving
