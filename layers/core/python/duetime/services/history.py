"""A job's run history across the hot store and the run archive: one listing, one token (issue 19).

``GET /jobs/{id}/runs`` pages newest due time first over both. The page token is a cursor, the due time
(epoch ms) below which the next page starts, and the job it belongs to: each page reads the hot store's
runs due before the cursor and the archive's (day by day, through the job's index: never a tenant's whole
partition), merges them and drops a run seen in both (kept hot and archived after a crash between the
archive's write and the hot delete: the hot row wins). Filters (state, since, until) apply to both.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from duetime.domain.archive import (
    IndexEntry,
    day_index_prefix,
    day_of,
    decode_member,
    job_index_prefix,
    run_of_line,
)
from duetime.domain.errors import PageTokenError
from duetime.domain.models import Run
from duetime.domain.ports import ArchiveStore
from duetime.domain.timeutil import from_epoch_ms, to_epoch_ms
from duetime.services.deps import Deps

#: far in the future: the first page's cursor
_NO_CURSOR = 1 << 50
#: 9999-12-31T23:59:59Z, the last instant a datetime holds
_LAST_MS = 253_402_300_799_000


@dataclass(frozen=True)
class HistoryRun:
    """A run of the history, and whether it came from the archive (with the final logs archived with it)."""

    run: Run
    archived: bool = False
    logs: Mapping[str, str] = field(default_factory=dict)


def encode_token(job_id: str, before_ms: int) -> str:
    body = json.dumps({"j": job_id, "b": before_ms}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(body).decode().rstrip("=")


def decode_token(token: str | None, job_id: str) -> int:
    """The cursor of ``token`` (a due time, epoch ms; the first page's without one).

    Raises:
        PageTokenError: malformed, or issued for another job's listing.
    """
    if not token:
        return _NO_CURSOR
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(data, dict) or data.get("j") != job_id or not isinstance(data.get("b"), int):
            raise ValueError("another listing")
        return int(data["b"])
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise PageTokenError() from None


def _lines(archive: ArchiveStore, entry: IndexEntry) -> list[dict[str, Any]]:
    data = archive.get_range(entry.key, entry.offset, entry.length)
    return decode_member(data) if data else []


def _day_entries(archive: ArchiveStore, tenant: str, job_id: str, day: str) -> list[IndexEntry]:
    out = []
    for key in archive.list_keys(day_index_prefix(tenant, job_id, day)):
        data = archive.get(key)
        if data:
            out.append(IndexEntry.from_json(data))
    return out


def archived_run(archive: ArchiveStore, tenant: str, job_id: str, due_at: datetime) -> HistoryRun | None:
    """The archived run of ``(job_id, due_at)``, found through its due day's index entries, or None."""
    ms = to_epoch_ms(due_at)
    for entry in _day_entries(archive, tenant, job_id, day_of(due_at)):
        if any(due == ms for due, _ in entry.runs):
            for line in _lines(archive, entry):
                run = run_of_line(line)
                if run.due_at == due_at and run.tenant == tenant:
                    return HistoryRun(run, archived=True, logs=dict(line.get("logs") or {}))
    return None


def archived_page(
    archive: ArchiveStore,
    tenant: str,
    job_id: str,
    *,
    before_ms: int,
    limit: int,
    state: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[HistoryRun]:
    """Up to ``limit`` archived runs due before ``before_ms`` (and in ``[since, until]``, of ``state``),
    newest first. Days are read newest first and a day is read whole, so the order is exact."""
    top = min(before_ms - 1, to_epoch_ms(until) if until else _NO_CURSOR)
    low = to_epoch_ms(since) if since else -_NO_CURSOR
    top_day = day_of(from_epoch_ms(min(top, _LAST_MS)))
    low_day = day_of(from_epoch_ms(max(low, 0)))
    days = [d.rstrip("/").rpartition("dt=")[2] for d in archive.list_dirs(job_index_prefix(tenant, job_id))]
    found: dict[int, HistoryRun] = {}
    for day in sorted((d for d in days if low_day <= d <= top_day), reverse=True):
        for entry in _day_entries(archive, tenant, job_id, day):
            wanted = {due for due, st in entry.runs if low <= due <= top and (state is None or st == state)}
            if not wanted:
                continue
            for line in _lines(archive, entry):
                run = run_of_line(line)
                ms = to_epoch_ms(run.due_at)
                if ms in wanted and run.tenant == tenant:
                    found[ms] = HistoryRun(run, archived=True, logs=dict(line.get("logs") or {}))
        if len(found) >= limit:
            break
    return [found[ms] for ms in sorted(found, reverse=True)[:limit]]


def list_history(
    job_id: str,
    *,
    tenant: str,
    deps: Deps,
    limit: int = 20,
    next_token: str | None = None,
    state: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[list[HistoryRun], str | None]:
    """One page of the job's runs, newest due time first, across the hot store and the archive, and the
    next page's token (None on the last page). The caller has checked the job is the tenant's."""
    before = decode_token(next_token, job_id)
    hot_until = from_epoch_ms(before - 1) if before != _NO_CURSOR else None
    if until is not None and (hot_until is None or until < hot_until):
        hot_until = until
    hot, hot_more = deps.store.query_runs(job_id, limit=limit, state=state, since=since, until=hot_until)
    merged: dict[int, HistoryRun] = {to_epoch_ms(r.due_at): HistoryRun(r) for r in hot}
    archived: list[HistoryRun] = []
    if deps.archive is not None:
        archived = archived_page(
            deps.archive,
            tenant,
            job_id,
            before_ms=before,
            limit=limit + 1,
            state=state,
            since=since,
            until=until,
        )
        for item in archived:
            merged.setdefault(to_epoch_ms(item.run.due_at), item)
    ordered = [merged[ms] for ms in sorted(merged, reverse=True)]
    page = ordered[:limit]
    more = hot_more is not None or len(ordered) > limit
    token = encode_token(job_id, to_epoch_ms(page[-1].run.due_at)) if page and more else None
    return page, token


def find_run(job_id: str, due_at: datetime, *, tenant: str, deps: Deps) -> HistoryRun | None:
    """The run of ``(job_id, due_at)``: the hot store's, else the archive's; None if neither has it (or it is
    another tenant's)."""
    run = deps.store.get_run(job_id, due_at)
    if run is not None:
        return HistoryRun(run) if run.tenant == tenant else None
    if deps.archive is None:
        return None
    return archived_run(deps.archive, tenant, job_id, due_at)


__all__ = ["HistoryRun", "archived_page", "archived_run", "find_run", "list_history"]
