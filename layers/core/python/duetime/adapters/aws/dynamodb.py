"""DynamoDB adapter: the only module that talks to the jobs and runs tables.

Every state change is one conditional write (DESIGN.md sections 4 and 5); a failed condition becomes one of
Duetime's own errors here and nowhere else: ``AlreadyClaimedError``, ``StaleClaimError``,
``StartRejectedError``, ``LeaseLostError``.

Items hold instants as fixed-width UTC strings (``timeutil.to_iso``), numbers as DynamoDB numbers.
"""

from __future__ import annotations

import base64
import heapq
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError
from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_random_exponential

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import (
    ACTIVE_INDEX,
    ACTIVE_INDEX_PK,
    CREATED_AT_KEY,
    DEAD_LETTER_INDEX,
    DEAD_LETTER_INDEX_PK,
    DEAD_LETTER_INDEX_SK,
    DUE_INDEX,
    DUE_INDEX_PK,
    DUE_INDEX_SK,
    JOBS_BY_TENANT_INDEX,
    JOBS_PK,
    RUNNING_INDEX,
    RUNNING_INDEX_PK,
    RUNS_PK,
    RUNS_SK,
    RUNS_TTL_ATTRIBUTE,
    SESSION_PREFIX,
    SESSION_SORT_KEY,
    SHARD_LEASE_PREFIX,
    SUBMIT_RATE_PREFIX,
    TENANT_COUNTER_PREFIX,
    TENANT_KEY,
    WATCH_INDEX,
    WATCH_INDEX_PK,
    WATCH_INDEX_SK,
    due_key,
    due_keys,
    shard_of_due_key,
    watch_key,
    watch_keys,
)
from duetime.domain.errors import (
    AlreadyClaimedError,
    ChangedMeanwhileError,
    DuetimeError,
    JobExistsError,
    LeaseLostError,
    PageTokenError,
    PartialBatchError,
    StaleClaimError,
    StartRejectedError,
    ThrottledError,
)
from duetime.domain.lifecycle import AttemptEnd
from duetime.domain.logs import log_key
from duetime.domain.models import (
    SESSION_RETAIN_SECONDS,
    AttemptRecord,
    Job,
    JobSummary,
    Run,
    RunState,
    Session,
    Trigger,
    json_text,
    run_id_for,
)
from duetime.domain.ports import JobAdvance, RunStart
from duetime.domain.retention import RetentionPolicy
from duetime.domain.timeutil import from_iso, to_iso

_ser = TypeSerializer()
#: the largest ``Limit`` of one page of a filtered Query (:meth:`DynamoStore._collect`); DynamoDB also ends a
#: page at 1 MB read
COLLECT_MAX_PAGE = 1000
#: the ``Limit`` of each due-index Query of a tick (:meth:`DynamoStore.query_due`), per due key
DUE_PAGE_SIZE = 500
_de = TypeDeserializer()


def _last_result(state: RetryCallState) -> Any:
    """tenacity: when the tries run out, return the last try's result instead of raising RetryError."""
    return state.outcome.result() if state.outcome is not None else None


class ConditionFailedError(DuetimeError):
    """A conditional update's condition did not hold (generic form, mapped by callers)."""


class _Null:
    """A value stored as DynamoDB's NULL (a None is left out of a map)."""


STORED_NULL = _Null()


def _to_attr(value: Any) -> Any:
    """Python value -> DynamoDB-serialisable value (datetimes as ISO UTC, floats as Decimal; None left out of
    maps, :data:`STORED_NULL` kept as NULL)."""
    if value is STORED_NULL:
        return None
    if isinstance(value, datetime):
        return to_iso(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, Mapping):
        return {str(k): _to_attr(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_to_attr(v) for v in value]
    if hasattr(value, "value") and not isinstance(value, int | str):  # enums that aren't str/int
        return value.value
    return value


def _from_attr(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_attr(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_attr(v) for v in value]
    return value


def serialize(item: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict -> DynamoDB wire format (``{"S": ...}``), dropping ``None`` values."""
    return {k: _ser.serialize(_to_attr(v)) for k, v in item.items() if v is not None}


def deserialize(item: Mapping[str, Any]) -> dict[str, Any]:
    """DynamoDB wire format -> a plain dict (Decimals become int or float)."""
    return {k: _from_attr(_de.deserialize(v)) for k, v in item.items()}


def _encode_json_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A Lambda task's payload and a run's result are stored as JSON text: a DynamoDB map would drop their
    nulls, turn 1.0 into 1 and refuse numbers outside its range."""
    task = data.get("task")
    if isinstance(task, dict) and task.get("kind") == "lambda":
        data["task"] = {**task, "payload": json_text(task.get("payload") or {})}
    if data.get("result") is not None:
        data["result"] = json_text(data["result"])
    return data


def _decode_json_fields(data: dict[str, Any]) -> dict[str, Any]:
    task = data.get("task")
    if isinstance(task, dict) and isinstance(task.get("payload"), str):
        data["task"] = {**task, "payload": json.loads(task["payload"])}
    if isinstance(data.get("result"), str):
        data["result"] = json.loads(data["result"])
    return data


def job_to_item(job: Job) -> dict[str, Any]:
    """The jobs-table item of ``job``: its ``shard`` attribute holds the job's due key
    (:func:`~duetime.adapters.aws.resources.due_key`), the due index's partition key."""
    data = _encode_json_fields(job.model_dump(mode="python"))
    data[DUE_INDEX_PK] = due_key(job.shard, job.job_id)
    return data


def job_from_item(item: Mapping[str, Any]) -> Job:
    """The job of a jobs-table item: its shard read off the stored due key, or off a row written before the
    spread, whose ``shard`` attribute is the shard itself
    (:func:`~duetime.adapters.aws.resources.shard_of_due_key`)."""
    data = _decode_json_fields(dict(item))
    if isinstance(data.get(DUE_INDEX_PK), int | Decimal):
        data[DUE_INDEX_PK] = shard_of_due_key(int(data[DUE_INDEX_PK]))
    data.setdefault("next_fire_at", None)
    data.setdefault("schedule", None)
    return Job.from_stored(data)


#: run attributes left out of the item while they hold these values (the model's structural defaults, which
#: no condition reads and every append starts from with ``if_not_exists``): a run row's bytes are its write
#: units (1 per started KB), and an ended run's row must stay under 1 KB
_OMITTED_WHEN = {
    "result_truncated": False,
    "dead_lettered": False,
    "missed_slots": 0,
    "budget_from_attempt": 1,
    "attempts": [],
    "events": [],
}


def _own_log_key(job_id: str, due_at: datetime, attempt: int) -> str:
    return log_key(job_id, run_id_for(job_id, due_at), attempt)


def stored_log_key(job_id: str, due_at: datetime, attempt: int, key: str | None) -> str | None:
    """The ``log_key`` to store for ``attempt`` of the run ``(job_id, due_at)``: None (left out) when it is
    the attempt's own key (``logs/<job>/<run>/attempt-<n>.log``), which readers derive.

    Left out, not abbreviated: every reader, this version's and the earlier ones (``jobs.get_run_log``), takes
    an attempt without a key to have logged under its own key. It keeps an ended run's row under 1 KB (one
    write unit per write instead of two)."""
    if key is not None and key == _own_log_key(job_id, due_at, attempt):
        return None
    return key


def record_to_attr(job_id: str, due_at: datetime, record: AttemptRecord) -> dict[str, Any]:
    """An attempt record as stored in a run's ``attempts`` list: its own log key left out, no key at all
    stored as an explicit null (which every reader reads as None)."""
    data = record.model_dump(mode="python", exclude_none=True)
    if record.log_key is None:
        data["log_key"] = STORED_NULL
    elif stored_log_key(job_id, due_at, record.attempt, record.log_key) is None:
        del data["log_key"]
    return data


def _with_log_keys(data: dict[str, Any]) -> dict[str, Any]:
    """A stored run's log keys as :func:`stored_log_key` left them out: an attempt record without one
    logged under its own key (one with a null has none), and the run's ``log_key`` is its last attempt's
    when that attempt is the run's current one."""
    job_id, due_at, attempts = data.get("job_id"), data.get("due_at"), data.get("attempts")
    if not isinstance(attempts, list) or not isinstance(job_id, str) or due_at is None:
        return data
    derived = []
    for record in attempts:
        if isinstance(record, dict) and "log_key" not in record:
            number = record.get("attempt")
            if isinstance(number, int | Decimal):
                record = {**record, "log_key": _own_log_key(job_id, from_iso(str(due_at)), int(number))}
        derived.append(record)
    data["attempts"] = derived
    last = derived[-1] if derived and isinstance(derived[-1], dict) else {}
    if "log_key" not in data and last.get("attempt") == data.get("attempt") and last.get("log_key"):
        data["log_key"] = last["log_key"]
    return data


def run_to_item(run: Run, *, retention: RetentionPolicy) -> dict[str, Any]:
    data = _encode_json_fields(run.model_dump(mode="python"))
    data["log_key"] = stored_log_key(run.job_id, run.due_at, run.attempt, run.log_key)
    data["attempts"] = [record_to_attr(run.job_id, run.due_at, r) for r in run.attempts]
    for name, default in _OMITTED_WHEN.items():
        if name in data and data[name] == default:
            del data[name]
    if not run.state.terminal and run.watch_at is not None:
        data[WATCH_INDEX_PK] = watch_key(run.shard, run.run_id)
    if not run.state.terminal and (run.overlap.enforced or run.held is not None):
        data[ACTIVE_INDEX_PK] = run.job_id
    if run.dead_lettered:
        data[DEAD_LETTER_INDEX_PK] = run.tenant
    data[RUNS_TTL_ATTRIBUTE] = int(retention.expires_at(run).timestamp())
    return data


def set_terminal_ttl(update: Update, due_at: datetime, retention: RetentionPolicy) -> Update:
    """Add the run's TTL by its tier to ``update`` when it ends the run (the end writes the row anyway, so
    the tier costs no write unit); an update that leaves the state alone keeps the row's TTL."""
    state = update.sets.get("state")
    if state is None or RUNS_TTL_ATTRIBUTE in update.sets:
        return update
    run_state = RunState(str(state))
    if not run_state.terminal:
        return update
    finished = update.sets.get("finished_at")
    expires = retention.expires_for(
        run_state,
        due_at=due_at,
        finished_at=finished if isinstance(finished, datetime) else None,
        dead_lettered=bool(update.sets.get("dead_lettered")),
    )
    update.sets[RUNS_TTL_ATTRIBUTE] = int(expires.timestamp())
    return update


#: attributes that exist only to place a run in a sparse index (derived from the run's own fields)
_INDEX_ONLY_ATTRIBUTES = frozenset(
    {WATCH_INDEX_PK, ACTIVE_INDEX_PK, RUNNING_INDEX_PK, DEAD_LETTER_INDEX_PK, RUNS_TTL_ATTRIBUTE}
)


def run_from_stream_image(image: Mapping[str, Any]) -> Run:
    """The run of a runs-table stream record's image (``OldImage`` of a TTL deletion; wire format)."""
    return run_from_item(deserialize(dict(image)))


def run_from_item(item: Mapping[str, Any]) -> Run:
    data = {k: v for k, v in item.items() if k not in _INDEX_ONLY_ATTRIBUTES}
    return Run.from_stored(_decode_json_fields(_with_log_keys(data)))


@dataclass
class Update:
    """A conditional UpdateItem, built up field by field.

    ``conditions`` are ``name -> value`` equalities (``None`` value = attribute must not exist); ``extra_condition``
    is raw expression text using placeholders already registered with :meth:`value`.
    """

    sets: dict[str, Any] = field(default_factory=dict)
    removes: list[str] = field(default_factory=list)
    adds: dict[str, int] = field(default_factory=dict)
    appends: dict[str, list[Any]] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    extra_condition: str | None = None
    _names: dict[str, str] = field(default_factory=dict)
    _values: dict[str, Any] = field(default_factory=dict)

    def name(self, attr: str) -> str:
        key = f"#{attr}"
        self._names[key] = attr
        return key

    def value(self, placeholder: str, value: Any) -> str:
        key = f":{placeholder}"
        self._values[key] = value
        return key

    def build(self) -> dict[str, Any]:
        clauses: list[str] = []
        set_parts = [f"{self.name(k)} = {self.value('s_' + k, v)}" for k, v in self.sets.items()]
        for attr, items in self.appends.items():
            empty = self.value("empty_list", [])
            set_parts.append(
                f"{self.name(attr)} = list_append(if_not_exists({self.name(attr)}, {empty}), "
                f"{self.value('a_' + attr, items)})"
            )
        if set_parts:
            clauses.append("SET " + ", ".join(set_parts))
        if self.removes:
            clauses.append("REMOVE " + ", ".join(self.name(a) for a in self.removes))
        if self.adds:
            clauses.append(
                "ADD " + ", ".join(f"{self.name(k)} {self.value('d_' + k, v)}" for k, v in self.adds.items())
            )
        conds = []
        for attr, expected in self.conditions.items():
            if expected is None:
                conds.append(f"attribute_not_exists({self.name(attr)})")
            else:
                conds.append(f"{self.name(attr)} = {self.value('c_' + attr, expected)}")
        if self.extra_condition:
            conds.append(f"({self.extra_condition})")
        request: dict[str, Any] = {
            "UpdateExpression": " ".join(clauses),
            "ExpressionAttributeNames": self._names,
        }
        if self._values:
            request["ExpressionAttributeValues"] = {
                k: _ser.serialize(_to_attr(v)) for k, v in self._values.items()
            }
        if conds:
            request["ConditionExpression"] = " AND ".join(conds)
        return request


def encode_page_token(key: Mapping[str, Any]) -> str:
    """An opaque page token for a query's continuation key: URL-safe base64 of its wire-format JSON."""
    return base64.urlsafe_b64encode(json.dumps(dict(key), sort_keys=True).encode()).decode().rstrip("=")


def decode_page_token(
    token: str | None, *, expected: tuple[str, ...], must_match: Mapping[str, str]
) -> dict[str, Any] | None:
    """The continuation key inside a token from :func:`encode_page_token`: exactly ``expected`` attributes,
    each a string (``{"S": ...}``), and those in ``must_match`` equal to the listing's tenant or job.

    Raises:
        PageTokenError: the token is not one this store issued for this listing.
    """
    if not token:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if not isinstance(key, dict) or set(key) != set(expected):
            raise ValueError("unexpected key")
        for name, value in key.items():
            if not isinstance(value, dict) or set(value) != {"S"} or not isinstance(value["S"], str):
                raise ValueError(f"{name} is not a string")
        for name, wanted in must_match.items():
            if key[name]["S"] != wanted:
                raise ValueError(f"{name} does not match")
        return key
    except (ValueError, TypeError):
        raise PageTokenError() from None


def _is_condition_failure(exc: ClientError) -> bool:
    return bool(exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException")


T = TypeVar("T")


def _each(items: Sequence[T], write: Callable[[T], bool]) -> list[bool]:
    """``write`` of every item, in order; an item whose write raises is None in a PartialBatchError's
    results (the others are still written)."""
    results: list[bool | None] = []
    first: Exception | None = None
    for item in items:
        try:
            results.append(write(item))
        except Exception as exc:  # noqa: BLE001 - reported with the others' outcomes below
            results.append(None)
            first = first or exc
    if first is not None:
        raise PartialBatchError(results, first)
    return [bool(r) for r in results]


def _each_outcome(items: Sequence[T], write: Callable[[T], Run]) -> list[Run | Exception]:
    """``write`` of every item, in order: the run it returned, or the exception it raised."""
    results: list[Run | Exception] = []
    for item in items:
        try:
            results.append(write(item))
        except Exception as exc:  # noqa: BLE001 - each item's outcome, for the caller to act on
            results.append(exc)
    return results


class DynamoStore:
    """Jobs and runs in DynamoDB.

    Args:
        jobs_table: physical name of the jobs table.
        runs_table: physical name of the runs table.
        retention: the hot window's tiers: each run row's TTL (domain/retention.py).
        submits_table: the table with a TTL that holds the per-tenant per-minute submit counters (the
            idempotency table); None: submits are not counted (no per-minute quota).
    """

    def __init__(
        self,
        jobs_table: str,
        runs_table: str,
        *,
        retention: RetentionPolicy | None = None,
        submits_table: str | None = None,
    ) -> None:
        self.jobs_table = jobs_table
        self.runs_table = runs_table
        self.retention = retention or RetentionPolicy()
        self.submits_table = submits_table

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    # ---- jobs ----------------------------------------------------------------------------------------
    def put_new_job(self, job: Job) -> None:
        """Insert ``job``. Raises JobExistsError if its id is taken."""
        try:
            self._ddb.put_item(
                TableName=self.jobs_table,
                Item=serialize(job_to_item(job)),
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise JobExistsError(f"job {job.job_id!r} already exists") from None
            raise

    def get_job(self, job_id: str) -> Job | None:
        """The job, or None if absent. Strongly consistent."""
        out = self._ddb.get_item(
            TableName=self.jobs_table, Key=serialize({"job_id": job_id}), ConsistentRead=True
        )
        return job_from_item(deserialize(out["Item"])) if "Item" in out else None

    def replace_job(self, job: Job, *, expected_version: int, expected_next_fire_at: datetime | None) -> None:
        """Write ``job`` over the stored one if nothing changed it since it was read (optimistic concurrency:
        same ``version`` and same ``next_fire_at``, which a tick may have advanced meanwhile).

        Raises:
            ConflictError: the job changed since it was read; read it again.
        """
        # UpdateItem, not PutItem: attributes this version does not know (a newer version wrote them) stay
        item = job_to_item(job)
        upd = Update(conditions={"version": expected_version, "next_fire_at": expected_next_fire_at})
        for name, value in item.items():
            if name == JOBS_PK:
                continue
            if value is None:
                upd.removes.append(name)
            else:
                upd.sets[name] = value
        try:
            self._ddb.update_item(
                TableName=self.jobs_table, Key=serialize({JOBS_PK: job.job_id}), **upd.build()
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ChangedMeanwhileError(
                    f"job {job.job_id!r} changed meanwhile; read it and try again"
                ) from None
            raise

    def list_jobs(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """The tenant's jobs, newest first, filtered; returns (jobs, the next page's token or None).

        A page of :meth:`list_job_summaries` (the ``by_tenant`` index), then its jobs read with one strongly
        consistent ``BatchGetItem``; a job whose state or name changed since the index saw it is checked
        again against the filters.
        """
        entries, next_key = self.list_job_summaries(
            tenant, limit=limit, page_token=page_token, state=state, name_prefix=name_prefix
        )
        found = self.get_jobs([e.job_id for e in entries])
        wanted = [found[e.job_id] for e in entries if e.job_id in found]
        return [
            j
            for j in wanted
            if j.tenant == tenant
            and (j.state.value == state if state else j.state.value != "DELETED")
            and (not name_prefix or j.name.startswith(name_prefix))
        ], next_key

    def list_job_summaries(
        self,
        tenant: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[JobSummary], str | None]:
        """A page of the tenant's jobs, newest first, filtered, from the ``by_tenant`` index alone (one Query
        when the filters drop little: :meth:`_collect`); returns (summaries, the next page's token or None).

        The index projects only what a listing shows and filters read (``state``, ``name``, ``schedule``,
        ``anchor``), none of which a claim writes: a claim moves ``next_fire_at`` and ``version`` only, so it
        never writes the index (one index key per tenant would otherwise take a write per run: DynamoDB's
        1,000 WCU/s per partition would cap a tenant near 600 claims/s). Eventually consistent.
        """
        filters, names, values = [], {"#t": TENANT_KEY}, {":t": tenant}
        if state:
            filters.append("#st = :st")
            names["#st"], values[":st"] = "state", state
        else:
            filters.append("#st <> :deleted")
            names["#st"], values[":deleted"] = "state", "DELETED"
        if name_prefix:
            filters.append("begins_with(#n, :np)")
            names["#n"], values[":np"] = "name", name_prefix
        kwargs: dict[str, Any] = {
            "TableName": self.jobs_table,
            "IndexName": JOBS_BY_TENANT_INDEX,
            "KeyConditionExpression": "#t = :t",
            "FilterExpression": " AND ".join(filters),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": serialize(values),
            "ScanIndexForward": False,
        }
        return self._collect(
            kwargs,
            limit,
            page_token,
            lambda entry: JobSummary.from_stored(_decode_json_fields(entry)),
            keys=(JOBS_PK, TENANT_KEY, CREATED_AT_KEY),
            scope={TENANT_KEY: tenant},
        )

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The stored jobs among ``job_ids`` (absent ones left out), by id; strongly consistent
        (:meth:`_batch_get`).

        Raises:
            ThrottledError: keys were still unprocessed after the last try.
        """
        unique = list(dict.fromkeys(job_ids))
        items = self._batch_get(self.jobs_table, [serialize({JOBS_PK: i}) for i in unique])
        jobs = [job_from_item(deserialize(item)) for item in items]
        return {job.job_id: job for job in jobs}

    def _batch_get(
        self, table: str, keys: Sequence[dict[str, Any]], *, consistent: bool = True
    ) -> list[dict[str, Any]]:
        """The items (DynamoDB JSON) of ``keys`` in ``table``, absent ones left out, in no particular order;
        strongly consistent unless ``consistent`` is False.

        One ``BatchGetItem`` per 100 keys (its limit); keys DynamoDB leaves unprocessed (throttling) are asked
        again with exponential backoff (AWS's advice for ``UnprocessedKeys``), up to 8 times.

        Raises:
            ThrottledError: keys were still unprocessed after the last try.
        """
        found: list[dict[str, Any]] = []
        for first in range(0, len(keys), 100):
            request: dict[str, Any] = {
                table: {"Keys": list(keys[first : first + 100]), "ConsistentRead": consistent}
            }

            def fetch() -> dict[str, Any]:
                nonlocal request
                out = self._ddb.batch_get_item(RequestItems=request)
                found.extend(out.get("Responses", {}).get(table, []))
                request = out.get("UnprocessedKeys") or {}
                return request

            left = Retrying(
                stop=stop_after_attempt(8),
                wait=wait_random_exponential(multiplier=0.05, max=2.0),
                retry=retry_if_result(bool),
                retry_error_callback=_last_result,
            )(fetch)
            if left:
                count = len(left.get(table, {}).get("Keys", []))
                raise ThrottledError(f"{count} items of {table} still unprocessed after 8 BatchGetItem tries")
        return found

    def _collect(
        self,
        kwargs: dict[str, Any],
        limit: int,
        page_token: str | None,
        build: Any,
        *,
        keys: tuple[str, ...],
        scope: Mapping[str, str],
    ) -> tuple[list[Any], str | None]:
        """Page through a (filtered) Query until ``limit`` items; the next page's token holds the last
        item's key (``keys``) and is only accepted back for the same ``scope`` (the key attributes that
        name the tenant or job of the listing)."""
        items: list[dict[str, Any]] = []
        start_key = decode_page_token(page_token, expected=keys, must_match=scope)
        if start_key:
            kwargs["ExclusiveStartKey"] = start_key
        ask = max(limit, 10)
        while len(items) < limit:
            kwargs["Limit"] = ask
            out = self._ddb.query(**kwargs)
            got = out.get("Items", [])
            items.extend(got)
            # ``Limit`` counts the items read before the filter: when the filter dropped some, the matches
            # are sparser than that, so read larger pages (x4, up to COLLECT_MAX_PAGE) instead of many small
            # ones (reading through 10,000 jobs for a rare match takes 13 Queries, not 400)
            ask = min(ask * 4, COLLECT_MAX_PAGE) if len(got) < ask else max(limit - len(items), 10)
            if "LastEvaluatedKey" not in out:
                if len(items) <= limit:
                    return [build(deserialize(i)) for i in items], None
                break
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]
        items = items[:limit]
        last = items[-1]
        return [build(deserialize(i)) for i in items], encode_page_token(
            {k: last[k] for k in keys if k in last}
        )

    def query_runs(
        self,
        job_id: str,
        *,
        limit: int,
        page_token: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        active_only: bool = False,
    ) -> tuple[list[Run], str | None]:
        """The job's runs, newest due time first, within ``[since, until]`` and of ``state``."""
        key = "job_id = :j"
        values: dict[str, Any] = {":j": job_id}
        names: dict[str, str] = {}
        if since is not None and until is not None:
            key += " AND due_at BETWEEN :since AND :until"
            values.update({":since": since, ":until": until})
        elif since is not None:
            key += " AND due_at >= :since"
            values[":since"] = since
        elif until is not None:
            key += " AND due_at <= :until"
            values[":until"] = until
        kwargs: dict[str, Any] = {
            "TableName": self.runs_table,
            "KeyConditionExpression": key,
            "ScanIndexForward": False,
        }
        filters = []
        if state:
            filters.append("#st = :st")
            names["#st"], values[":st"] = "state", state
        if active_only:
            filters.append(f"attribute_exists({WATCH_INDEX_PK})")
        if filters:
            kwargs["FilterExpression"] = " AND ".join(filters)
        if names:
            kwargs["ExpressionAttributeNames"] = names
        kwargs["ExpressionAttributeValues"] = serialize(values)
        return self._collect(
            kwargs, limit, page_token, run_from_item, keys=(RUNS_PK, RUNS_SK), scope={RUNS_PK: job_id}
        )

    def query_due(
        self, shard: int, until: datetime, *, part: int = 0, parts: int = 1, page_size: int | None = None
    ) -> Iterator[Job]:
        """Jobs of ``shard`` whose ``next_fire_at <= until``, oldest first (due GSI; eventually consistent):
        the shard's due keys (:func:`~duetime.adapters.aws.resources.due_keys`) queried page by page and
        merged by due time, and the legacy key (the shard's own number: rows written before the spread).

        ``part`` of ``parts``: only the keys whose position ``i`` has ``i % parts == part``, the legacy key
        with part 0 (so with ``parts`` above the key count, the parts past it are empty). ``page_size``: the
        ``Limit`` of each Query (None: :data:`DUE_PAGE_SIZE`).

        Raises:
            ValueError: ``part`` is not in ``range(parts)``.
        """
        if not 0 <= part < parts:
            raise ValueError(f"part {part} is not one of {parts} parts")
        keys = [key for i, key in enumerate(due_keys(shard)) if i % parts == part]
        if part == 0:
            keys.append(shard)
        yield from heapq.merge(
            *(self._query_due_key(key, until, page_size or DUE_PAGE_SIZE) for key in keys),
            key=lambda job: job.next_fire_at or until,
        )

    def _query_due_key(self, key: int, until: datetime, page_size: int) -> Iterator[Job]:
        kwargs: dict[str, Any] = {
            "TableName": self.jobs_table,
            "IndexName": DUE_INDEX,
            "KeyConditionExpression": "#pk = :key AND #sk <= :until",
            "ExpressionAttributeNames": {"#pk": DUE_INDEX_PK, "#sk": DUE_INDEX_SK},
            "ExpressionAttributeValues": serialize({":key": key, ":until": until}),
            "Limit": page_size,
        }
        while True:
            out = self._ddb.query(**kwargs)
            for item in out.get("Items", []):
                yield job_from_item(deserialize(item))
            if "LastEvaluatedKey" not in out:
                return
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def advance(
        self,
        job_id: str,
        *,
        claimed: datetime,
        next_fire_at: datetime | None,
        now: datetime,
        missed: int = 0,
        shard: int | None = None,
    ) -> None:
        """Move the job's ``next_fire_at`` from ``claimed`` to ``next_fire_at`` (claim step 2).

        ``next_fire_at=None`` removes it (the job leaves the due index) and marks the job COMPLETED. With the
        job's ``shard``, its due key is written too (the index entry moves anyway, at no extra write unit), so
        a row written before the key spread moves to its own key at its first claim.

        Raises:
            StaleClaimError: if ``next_fire_at`` is no longer ``claimed`` (another tick advanced it).
        """
        upd = Update(conditions={"next_fire_at": claimed})
        upd.sets["updated_at"] = now
        if missed:
            upd.adds["missed_slots"] = missed
        if next_fire_at is None:
            upd.removes.append("next_fire_at")
            upd.sets["state"] = "COMPLETED"
        else:
            upd.sets["next_fire_at"] = next_fire_at
            if shard is not None:
                upd.sets[DUE_INDEX_PK] = due_key(shard, job_id)
        try:
            self._ddb.update_item(TableName=self.jobs_table, Key=serialize({"job_id": job_id}), **upd.build())
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise StaleClaimError(f"job {job_id!r} was already advanced past {to_iso(claimed)}") from None
            raise

    def advance_many(self, advances: Sequence[JobAdvance], *, now: datetime) -> list[bool]:
        """:meth:`advance` of each, in order (one conditional UpdateItem each: DynamoDB has no conditional
        batch write); for each, whether it was applied (False: another claimer moved that job first).

        Raises:
            PartialBatchError: some UpdateItems raised (throttled, unreachable...); every item was tried, and
                its ``results`` say which were applied (None: the failed ones, outcome unknown).
        """

        def one(a: JobAdvance) -> bool:
            try:
                self.advance(
                    a.job_id,
                    claimed=a.claimed,
                    next_fire_at=a.next_fire_at,
                    now=now,
                    missed=a.missed,
                    shard=a.shard,
                )
            except StaleClaimError:
                return False
            return True

        return _each(advances, one)

    def add_missed_slots(self, job_id: str, count: int) -> None:
        """Add ``count`` to the job's ``missed_slots`` (slots catch-up or a pause skipped at start)."""
        upd = Update(extra_condition="attribute_exists(job_id)")
        upd.adds["missed_slots"] = count
        try:
            self._ddb.update_item(TableName=self.jobs_table, Key=serialize({"job_id": job_id}), **upd.build())
        except ClientError as exc:
            if not _is_condition_failure(exc):
                raise

    # ---- runs ----------------------------------------------------------------------------------------
    def _run_key(self, job_id: str, due_at: datetime) -> dict[str, Any]:
        return serialize({"job_id": job_id, "due_at": due_at})

    def put_new_run(self, run: Run) -> None:
        """Insert ``run`` if ``(job_id, due_at)`` is new (claim step 1, [S1] conditional insert).

        Raises:
            AlreadyClaimedError: if the run already exists.
        """
        try:
            self._ddb.put_item(
                TableName=self.runs_table,
                Item=serialize(run_to_item(run, retention=self.retention)),
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise AlreadyClaimedError(f"run {run.run_id} already exists") from None
            raise

    def put_new_runs(self, runs: Sequence[Run]) -> list[bool]:
        """:meth:`put_new_run` of each, in order (one conditional PutItem each); for each, whether it was
        inserted (False: it existed).

        Raises:
            PartialBatchError: some PutItems raised; every run was tried, and its ``results`` say which were
                inserted (None: the failed ones, outcome unknown).
        """

        def one(run: Run) -> bool:
            try:
                self.put_new_run(run)
            except AlreadyClaimedError:
                return False
            return True

        return _each(runs, one)

    def get_run(self, job_id: str, due_at: datetime) -> Run | None:
        """The run, or None. Strongly consistent."""
        out = self._ddb.get_item(
            TableName=self.runs_table, Key=self._run_key(job_id, due_at), ConsistentRead=True
        )
        return run_from_item(deserialize(out["Item"])) if "Item" in out else None

    def get_runs(
        self, keys: Sequence[tuple[str, datetime]], *, consistent: bool = True
    ) -> dict[tuple[str, datetime], Run]:
        """The runs of ``keys`` that exist, keyed as asked: one BatchGetItem per 100 keys (``consistent``:
        strongly consistent, else eventually: half the read units).

        Raises:
            ThrottledError: some keys were still unprocessed after the retries.
        """
        wanted = {(job_id, to_iso(due_at)): (job_id, due_at) for job_id, due_at in keys}
        items = self._batch_get(
            self.runs_table, [self._run_key(j, d) for j, d in wanted.values()], consistent=consistent
        )
        found: dict[tuple[str, datetime], Run] = {}
        for item in items:
            run = run_from_item(deserialize(item))
            key = wanted.get((run.job_id, to_iso(run.due_at)))
            if key is not None:
                found[key] = run
        return found

    def list_runs(self, job_id: str, *, limit: int = 20) -> list[Run]:
        """The job's most recent ``limit`` runs, newest due time first."""
        out = self._ddb.query(
            TableName=self.runs_table,
            KeyConditionExpression="job_id = :j",
            ExpressionAttributeValues=serialize({":j": job_id}),
            ScanIndexForward=False,
            Limit=limit,
        )
        return [run_from_item(deserialize(i)) for i in out.get("Items", [])]

    def query_overdue(self, shard: int, until: datetime, *, page_size: int = 200) -> Iterator[Run]:
        """Non-terminal runs of ``shard`` whose ``watch_at <= until`` (watchdog GSI, then the runs read
        whole), oldest first: the shard's watch keys (:func:`~duetime.adapters.aws.resources.watch_keys`)
        queried page by page and merged by watch time."""
        yield from heapq.merge(
            *(self._query_overdue_key(key, until, page_size) for key in watch_keys(shard)),
            key=lambda run: run.watch_at or until,
        )

    def _query_overdue_key(self, key: int, until: datetime, page_size: int) -> Iterator[Run]:
        kwargs: dict[str, Any] = {
            "TableName": self.runs_table,
            "IndexName": WATCH_INDEX,
            "KeyConditionExpression": "#pk = :key AND #sk <= :until",
            "ExpressionAttributeNames": {"#pk": WATCH_INDEX_PK, "#sk": WATCH_INDEX_SK},
            "ExpressionAttributeValues": serialize({":key": key, ":until": until}),
            "Limit": page_size,
        }
        while True:
            out = self._ddb.query(**kwargs)
            # the index holds keys only (KEYS_ONLY: a write that leaves the watch key costs it nothing): the
            # page's runs are read whole, strongly consistent, and kept in the index's order; one that moved
            # on meanwhile (ended, or watched later) is left out
            entries = out.get("Items", [])
            keys = [{RUNS_PK: e[RUNS_PK], RUNS_SK: e[RUNS_SK]} for e in entries]
            by_key = {
                (str(i[RUNS_PK]["S"]), str(i[RUNS_SK]["S"])): i
                for i in self._batch_get(self.runs_table, keys)
            }
            for entry in entries:
                item = by_key.get((str(entry[RUNS_PK]["S"]), str(entry[RUNS_SK]["S"])))
                if item is None:
                    continue
                run = run_from_item(deserialize(item))
                if not run.state.terminal and run.watch_at is not None and run.watch_at <= until:
                    yield run
            if "LastEvaluatedKey" not in out:
                return
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def query_active(self, job_id: str, *, before: datetime) -> list[datetime]:
        """Due times of the job's non-terminal runs due before ``before`` (active-runs GSI, eventually
        consistent; only runs of jobs with an overlap policy are indexed), oldest first."""
        out = self._ddb.query(
            TableName=self.runs_table,
            IndexName=ACTIVE_INDEX,
            KeyConditionExpression="#pk = :job AND #sk < :before",
            ExpressionAttributeNames={"#pk": ACTIVE_INDEX_PK, "#sk": RUNS_SK},
            ExpressionAttributeValues=serialize({":job": job_id, ":before": before}),
        )
        return [from_iso(deserialize(i)[RUNS_SK]) for i in out.get("Items", [])]

    def query_active_after(self, job_id: str, *, after: datetime, limit: int = 1) -> list[datetime]:
        """Due times of the job's non-terminal runs due after ``after``, oldest first (at most ``limit``)."""
        out = self._ddb.query(
            TableName=self.runs_table,
            IndexName=ACTIVE_INDEX,
            KeyConditionExpression="#pk = :job AND #sk > :after",
            ExpressionAttributeNames={"#pk": ACTIVE_INDEX_PK, "#sk": RUNS_SK},
            ExpressionAttributeValues=serialize({":job": job_id, ":after": after}),
            Limit=limit,
        )
        return [from_iso(deserialize(i)[RUNS_SK]) for i in out.get("Items", [])]

    def query_dead_letters(
        self, tenant: str, *, limit: int = 20, page_token: str | None = None
    ) -> tuple[list[Run], str | None]:
        """The tenant's dead-lettered runs, most recently dead-lettered first (dead-letters GSI); returns
        (runs, key to continue from: None on the last page)."""
        kwargs: dict[str, Any] = {
            "TableName": self.runs_table,
            "IndexName": DEAD_LETTER_INDEX,
            "KeyConditionExpression": "#pk = :tenant",
            "ExpressionAttributeNames": {"#pk": DEAD_LETTER_INDEX_PK},
            "ExpressionAttributeValues": serialize({":tenant": tenant}),
            "ScanIndexForward": False,
        }
        return self._collect(
            kwargs,
            limit,
            page_token,
            run_from_item,
            keys=(RUNS_PK, RUNS_SK, DEAD_LETTER_INDEX_PK, DEAD_LETTER_INDEX_SK),
            scope={DEAD_LETTER_INDEX_PK: tenant},
        )

    def count_running(self, tenant: str) -> int:
        """How many of the tenant's runs are RUNNING (running-runs GSI; eventually consistent)."""
        out = self._ddb.query(
            TableName=self.runs_table,
            IndexName=RUNNING_INDEX,
            KeyConditionExpression="#pk = :t",
            ExpressionAttributeNames={"#pk": RUNNING_INDEX_PK},
            ExpressionAttributeValues=serialize({":t": tenant}),
            Select="COUNT",
        )
        return int(out.get("Count", 0))

    # ---- tenant quotas -------------------------------------------------------------------------------
    def add_active_jobs(self, tenant: str, delta: int, *, limit: int | None = None) -> bool:
        """Add ``delta`` to the tenant's active-jobs counter; with ``limit``, only if it stays within it.

        Returns False when the limit would be exceeded (nothing changed).
        """
        key = serialize({"job_id": f"{TENANT_COUNTER_PREFIX}{tenant}"})
        kwargs: dict[str, Any] = {
            "UpdateExpression": "ADD active_jobs :d",
            "ExpressionAttributeValues": serialize({":d": delta}),
        }
        if limit is not None:
            kwargs["ConditionExpression"] = "attribute_not_exists(active_jobs) OR active_jobs < :limit"
            kwargs["ExpressionAttributeValues"] = serialize({":d": delta, ":limit": limit - delta + 1})
        try:
            self._ddb.update_item(TableName=self.jobs_table, Key=key, **kwargs)
        except ClientError as exc:
            if _is_condition_failure(exc):
                return False
            raise
        return True

    def count_submit(self, tenant: str, minute: datetime, *, limit: int) -> bool:
        """Count one submit in the tenant's current minute (a TTL'd item in the submits table); False over
        ``limit``. Always True without a submits table."""
        table = self.submits_table
        if table is None:
            return True
        key = serialize({"id": f"{SUBMIT_RATE_PREFIX}{tenant}#{to_iso(minute)}"})
        try:
            self._ddb.update_item(
                TableName=table,
                Key=key,
                UpdateExpression="ADD submits :one SET expiration = :exp",
                ConditionExpression="attribute_not_exists(submits) OR submits < :limit",
                ExpressionAttributeValues=serialize(
                    {":one": 1, ":limit": limit, ":exp": int(minute.timestamp()) + 120}
                ),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return False
            raise
        return True

    # ---- worker sessions (items of the runs table under reserved keys) -----------------------------------
    @staticmethod
    def _session_key(session_id: str) -> dict[str, Any]:
        return serialize({RUNS_PK: f"{SESSION_PREFIX}{session_id}", RUNS_SK: SESSION_SORT_KEY})

    @staticmethod
    def _session_ttl(expires_at: datetime) -> int:
        """The item's TTL: a day after the session's end (a worker resumed within it finds it revoked)."""
        return int(expires_at.timestamp()) + SESSION_RETAIN_SECONDS

    @staticmethod
    def _session(item: Mapping[str, Any]) -> Session:
        data = deserialize(item)
        revoked = data.get("revoked_at")
        # a session revoked before it was ever written (its worker never needed it) has only revoked_at
        expires = data.get("lease_expires_at") or revoked
        return Session(
            str(data[RUNS_PK]).removeprefix(SESSION_PREFIX),
            str(data.get("owner") or ""),
            from_iso(str(expires)),
            tuple(str(r) for r in data.get("runs") or ()),
            from_iso(str(revoked)) if revoked is not None else None,
        )

    def renew_session(
        self, session_id: str, *, owner: str, runs: Sequence[str], expires_at: datetime
    ) -> Session | None:
        """Create or renew the session unless it is revoked (one conditional UpdateItem: 1 WRU for a session
        of up to about 10 runs); None if it is revoked."""
        upd = Update()
        upd.extra_condition = f"attribute_not_exists({upd.name('revoked_at')})"
        upd.sets.update(
            {
                "owner": owner,
                "runs": list(runs),
                "lease_expires_at": expires_at,
                RUNS_TTL_ATTRIBUTE: self._session_ttl(expires_at),
            }
        )
        try:
            out = self._ddb.update_item(
                TableName=self.runs_table,
                Key=self._session_key(session_id),
                ReturnValues="ALL_NEW",
                **upd.build(),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return None
            raise
        return self._session(out["Attributes"])

    def get_sessions(self, session_ids: Sequence[str]) -> dict[str, Session]:
        """The sessions of ``session_ids`` that exist (consistent BatchGetItem), by id.

        Raises:
            ThrottledError: some keys were still unprocessed after the retries.
        """
        unique = list(dict.fromkeys(session_ids))
        items = self._batch_get(self.runs_table, [self._session_key(i) for i in unique])
        sessions = [self._session(item) for item in items]
        return {session.session_id: session for session in sessions}

    def revoke_session(self, session_id: str, *, now: datetime) -> bool:
        """Revoked at ``now`` if it expired by then or is absent (one conditional UpdateItem, which leaves a
        revoked item behind; an earlier revocation stays); True if revoked (now or before), False if alive
        (nothing written)."""
        names = {
            "#pk": RUNS_PK,
            "#revoked": "revoked_at",
            "#expires": "lease_expires_at",
            "#ttl": RUNS_TTL_ATTRIBUTE,
        }
        values = serialize({":now": now, ":ttl": self._session_ttl(now)})
        try:
            self._ddb.update_item(
                TableName=self.runs_table,
                Key=self._session_key(session_id),
                UpdateExpression="SET #revoked = if_not_exists(#revoked, :now), #ttl = if_not_exists(#ttl, :ttl)",
                ConditionExpression="attribute_not_exists(#pk) OR attribute_exists(#revoked) OR #expires <= :now",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if not _is_condition_failure(exc):
                raise
            return False
        return True

    # ---- shard leases --------------------------------------------------------------------------------
    def acquire_shard_lease(self, shard: int, *, owner: str, now: datetime, lease_seconds: float) -> bool:
        """Take (or renew) the tick's lease on ``shard`` until ``now + lease_seconds``.

        Returns False if another owner holds an unexpired lease. Correctness never depends on it (claims are
        conditional); it only keeps two ticks from working one shard at once.
        """
        upd = Update()
        exp = upd.name("expires_at")
        upd.extra_condition = (
            f"attribute_not_exists({exp}) OR {exp} <= {upd.value('now', now)}"
            f" OR {upd.name('owner')} = {upd.value('me', owner)}"
        )
        upd.sets.update(owner=owner, expires_at=now + timedelta(seconds=lease_seconds))
        upd.adds["lease_token"] = 1
        try:
            self._ddb.update_item(
                TableName=self.jobs_table,
                Key=serialize({"job_id": f"{SHARD_LEASE_PREFIX}{shard}"}),
                **upd.build(),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return False
            raise
        return True

    def release_shard_lease(self, shard: int, *, owner: str, now: datetime) -> None:
        """End our lease on ``shard`` now (no-op if another owner holds it)."""
        upd = Update(conditions={"owner": owner})
        upd.sets["expires_at"] = now
        try:
            self._ddb.update_item(
                TableName=self.jobs_table,
                Key=serialize({"job_id": f"{SHARD_LEASE_PREFIX}{shard}"}),
                **upd.build(),
            )
        except ClientError as exc:
            if not _is_condition_failure(exc):
                raise

    def _update_run(self, job_id: str, due_at: datetime, update: Update) -> Run:
        """Apply a conditional update to a run and return the run as it now is.

        Raises:
            ConditionFailedError: if the update's condition did not hold.
        """
        try:
            out = self._ddb.update_item(
                TableName=self.runs_table,
                Key=self._run_key(job_id, due_at),
                ReturnValues="ALL_NEW",
                **set_terminal_ttl(update, due_at, self.retention).build(),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"condition failed on run {job_id}@{to_iso(due_at)}") from None
            raise
        return run_from_item(deserialize(out["Attributes"]))

    def _try_update_run(self, job_id: str, due_at: datetime, update: Update) -> Run | None:
        """:meth:`_update_run`, None when its condition did not hold (the run moved on meanwhile)."""
        try:
            return self._update_run(job_id, due_at, update)
        except ConditionFailedError:
            return None

    # ---- run transitions (DESIGN.md section 5) -------------------------------------------------------
    def start(
        self,
        job_id: str,
        due_at: datetime,
        *,
        attempt: int,
        owner: str,
        lease_expires_at: datetime,
        now: datetime,
        deadline_at: datetime | None = None,
        watch_at: datetime | None = None,
        running_tenant: str | None = None,
        session_id: str | None = None,
    ) -> Run:
        """Start ``attempt``: the run becomes RUNNING and its fencing token goes up by one.

        Accepted from PENDING at ``attempt``, or from RETRY_WAIT at ``attempt - 1`` once its ``retry_at`` has
        passed (the retry's delayed wake-up message arrives directly, without waiting for the sweeper).
        ``running_tenant`` puts the run in the running-by-tenant index (set when a RUNNING quota applies).

        Raises:
            StartRejectedError: neither holds: a duplicate, stale or early message. Drop it.
        """
        upd = Update()
        state, att, retry_at = upd.name("state"), upd.name("attempt"), upd.name("retry_at")
        now_v = upd.value("now", now)
        # attempt 1 must start by its starting deadline; retries (the attempt being started, > 1) are past it
        # by design, also when the retry's wake-up starts it straight from RETRY_WAIT
        in_time = ""
        if attempt == 1:
            deadline = upd.name("start_deadline_at")
            in_time = f" AND (attribute_not_exists({deadline}) OR {deadline} >= {now_v})"
        upd.extra_condition = (
            f"(({state} = {upd.value('pending', RunState.PENDING.value)} AND {att} = {upd.value('att', attempt)})"
            f" OR ({state} = {upd.value('retry_wait', RunState.RETRY_WAIT.value)}"
            f" AND {att} = {upd.value('prev_att', attempt - 1)} AND {retry_at} <= {now_v}))"
            f"{in_time}"
            # a run held by its job's pause starts only once the resume released it
            f" AND attribute_not_exists({upd.name('held')})"
        )
        upd.sets.update(
            state=RunState.RUNNING.value,
            attempt=attempt,
            lease_owner=owner,
            lease_expires_at=lease_expires_at,
            started_at=now,
        )
        if watch_at is not None:  # else the watch time stays (a lower bound: the sweeper moves it later)
            upd.sets["watch_at"] = watch_at
        if deadline_at is not None:
            upd.sets["deadline_at"] = deadline_at
        if running_tenant is not None:
            upd.sets[RUNNING_INDEX_PK] = running_tenant
        if session_id is not None:
            upd.sets["session_id"] = session_id
        else:
            upd.removes.append("session_id")
        # the previous attempt's outcome stays in `attempts`, not on the run being retried
        upd.removes.extend(["retry_at", "finished_at", "exit_code", "error", "result", "result_truncated"])
        upd.adds["fencing_token"] = 1
        try:
            return self._update_run(job_id, due_at, upd)
        except ConditionFailedError:
            raise StartRejectedError(
                f"run {job_id}@{to_iso(due_at)} attempt {attempt} cannot start (duplicate, stale or early)"
            ) from None

    def start_many(self, starts: Sequence[RunStart]) -> list[Run | Exception]:
        """:meth:`start` of each of ``starts``, one conditional UpdateItem each (DynamoDB has no conditional
        batch update): for each, in order, the run as now stored or the error its start raised
        (StartRejectedError, or a fault of that request: whether it was applied is unknown)."""
        return _each_outcome(
            starts,
            lambda s: self.start(
                s.job_id,
                s.due_at,
                attempt=s.attempt,
                owner=s.owner,
                lease_expires_at=s.lease_expires_at,
                now=s.now,
                deadline_at=s.deadline_at,
                watch_at=s.watch_at,
                running_tenant=s.running_tenant,
                session_id=s.session_id,
            ),
        )

    def rewatch_running(
        self, job_id: str, due_at: datetime, *, fencing_token: int, watch_at: datetime
    ) -> Run | None:
        """Move a RUNNING run's watch time to ``watch_at`` while it runs under ``fencing_token`` (the sweeper,
        finding its lease and deadline still ahead); None if it moved on."""
        upd = Update(conditions={"state": RunState.RUNNING.value, "fencing_token": fencing_token})
        upd.sets["watch_at"] = watch_at
        return self._try_update_run(job_id, due_at, upd)

    def _end_attempt_update(self, end: AttemptEnd) -> Update:
        """The conditional UpdateItem that applies ``end`` (also the timeout handler's fence)."""
        upd = Update(conditions={"state": RunState.RUNNING.value, "fencing_token": end.expected_token})
        upd.appends["attempts"] = [record_to_attr(end.job_id, end.due_at, end.record)]
        upd.sets["finished_at"] = end.finished_at
        key = stored_log_key(end.job_id, end.due_at, end.record.attempt, end.log_key)
        for attr, value in (("exit_code", end.exit_code), ("error", end.error), ("log_key", key)):
            if value is None:
                upd.removes.append(attr)
            else:
                upd.sets[attr] = value
        if end.timeout_action is not None:
            upd.sets["timeout_action"] = end.timeout_action
        if end.timeout_outcome is not None:
            upd.sets["timeout_outcome"] = end.timeout_outcome
        upd.sets["state"] = end.state.value
        if end.state is RunState.RETRY_WAIT:
            upd.sets.update(retry_at=end.retry_at, watch_at=end.watch_at)
            if end.max_attempts is not None:
                upd.sets["max_attempts"] = end.max_attempts
            upd.removes.extend(
                ["lease_owner", "lease_expires_at", "session_id", "deadline_at", RUNNING_INDEX_PK]
            )
        else:
            if end.dead_lettered:
                upd.sets.update(
                    dead_lettered=True, dead_lettered_at=end.finished_at, dead_letter_tenant=end.tenant
                )
            upd.removes.extend(terminal_removals())
        if end.result_json is not None:
            upd.sets["result"] = end.result_json  # stored as JSON text
        if end.result_truncated:
            upd.sets["result_truncated"] = True
        if end.bump_token:
            upd.adds["fencing_token"] = 1
        if end.timeout_execution is not None:
            upd.sets["timeout_execution"] = end.timeout_execution
        if end.lease_expired_by is not None:
            upd.extra_condition = (
                f"{upd.name('lease_expires_at')} <= {upd.value('lease_by', end.lease_expired_by)}"
            )
        return upd

    def end_attempt(self, end: AttemptEnd) -> Run:
        """Apply ``end`` in one conditional write under ``end.expected_token``.

        Raises:
            LeaseLostError: the token is stale, the run is not RUNNING, or (``end.lease_expired_by``) its
                lease had not ended by then; nothing was applied.
        """
        try:
            return self._update_run(end.job_id, end.due_at, self._end_attempt_update(end))
        except ConditionFailedError:
            raise LeaseLostError(
                f"stale fencing token {end.expected_token} on {end.job_id}@{to_iso(end.due_at)}"
            ) from None

    def end_attempts(self, ends: Sequence[AttemptEnd]) -> list[Run | Exception]:
        """:meth:`end_attempt` of each of ``ends``, one conditional UpdateItem each: for each, in order, the
        run as now stored or the error its end raised (LeaseLostError, or a fault of that request)."""
        return _each_outcome(ends, self.end_attempt)

    def start_and_end(
        self, starts: Sequence[RunStart], ends: Sequence[AttemptEnd]
    ) -> tuple[list[Run | Exception], list[Run | Exception]]:
        """:meth:`end_attempts` of ``ends``, then :meth:`start_many` of ``starts`` (one request each)."""
        ended = self.end_attempts(ends)
        return self.start_many(starts), ended

    def end_attempt_request(self, end: AttemptEnd) -> dict[str, Any]:
        """``end`` as UpdateItem parameters (TableName, Key, expressions): the timeout handler's fence step,
        which Step Functions applies through its direct DynamoDB integration."""
        return {
            "TableName": self.runs_table,
            "Key": self._run_key(end.job_id, end.due_at),
            **set_terminal_ttl(self._end_attempt_update(end), end.due_at, self.retention).build(),
        }

    def put_new_run_request(self, run: Run) -> dict[str, Any]:
        """:meth:`put_new_run` as PutItem parameters (the timeout handler's triggered run)."""
        return {
            "TableName": self.runs_table,
            "Item": serialize(run_to_item(run, retention=self.retention)),
            "ConditionExpression": "attribute_not_exists(job_id)",
        }

    def put_back_run(self, run: Run, *, expires_at: datetime) -> bool:
        """Put a run the TTL deleted back with the TTL ``expires_at`` (the keep-last-N rule, applied by the
        archiver); False if a row of its key exists again."""
        item = run_to_item(run, retention=self.retention)
        item[RUNS_TTL_ATTRIBUTE] = int(expires_at.timestamp())
        try:
            self._ddb.put_item(
                TableName=self.runs_table,
                Item=serialize(item),
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                return False
            raise
        return True

    def skip_pending(
        self, job_id: str, due_at: datetime, *, attempt: int, reason: str, now: datetime
    ) -> Run | None:
        """PENDING at ``attempt`` -> SKIPPED with ``reason`` as its error; None if the run moved on."""
        upd = Update(conditions={"state": RunState.PENDING.value, "attempt": attempt})
        upd.sets.update(state=RunState.SKIPPED.value, finished_at=now, error=reason)
        upd.removes.extend(terminal_removals())
        upd.appends["events"] = [{"at": now, "kind": "skipped", "detail": {"reason": reason}}]
        return self._try_update_run(job_id, due_at, upd)

    def hold(
        self, job_id: str, due_at: datetime, *, reason: str, now: datetime, recheck_at: datetime
    ) -> Run | None:
        """A PENDING first attempt -> held by ``reason``: it joins the active-runs index (a resume finds it)
        and is watched again at ``recheck_at``. None if the run moved on or is held already."""
        upd = Update(conditions={"state": RunState.PENDING.value, "attempt": 1, "held": None})
        upd.sets.update(held=reason, watch_at=recheck_at)
        upd.sets[ACTIVE_INDEX_PK] = job_id
        upd.appends["events"] = [{"at": now, "kind": "held", "detail": {"reason": reason}}]
        return self._try_update_run(job_id, due_at, upd)

    def release_held(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """``run``, still PENDING at its attempt and held as read -> no longer held, watched at ``watch_at``
        (it stays in the active-runs index only for an overlap policy). None if it moved on."""
        upd = Update(conditions={"state": RunState.PENDING.value, "attempt": run.attempt, "held": run.held})
        upd.sets["watch_at"] = watch_at
        upd.removes.append("held")
        if not run.overlap.enforced:
            upd.removes.append(ACTIVE_INDEX_PK)
        upd.appends["events"] = [{"at": now, "kind": "released", "detail": {"reason": "resumed"}}]
        return self._try_update_run(run.job_id, run.due_at, upd)

    def defer_pending(
        self,
        job_id: str,
        due_at: datetime,
        *,
        attempt: int,
        watch_at: datetime,
        held: str | None = None,
        seen_watch_at: datetime | None = None,
    ) -> Run | None:
        """Move a PENDING run's watch time to ``watch_at`` if it is still PENDING at ``attempt``, held by
        ``held`` (None: not held), and (given ``seen_watch_at``) still watched at that time."""
        conditions: dict[str, Any] = {"state": RunState.PENDING.value, "attempt": attempt, "held": held}
        if seen_watch_at is not None:
            conditions["watch_at"] = seen_watch_at
        upd = Update(conditions=conditions)
        upd.sets["watch_at"] = watch_at
        return self._try_update_run(job_id, due_at, upd)

    def release_retry(
        self, job_id: str, due_at: datetime, *, attempt: int, now: datetime, watch_at: datetime
    ) -> Run | None:
        """RETRY_WAIT at ``attempt`` -> PENDING at ``attempt + 1`` (the sweeper's backstop for a retry whose
        wake-up did not start it). None if it moved on."""
        upd = Update(conditions={"state": RunState.RETRY_WAIT.value, "attempt": attempt})
        upd.sets.update(state=RunState.PENDING.value, attempt=attempt + 1, watch_at=watch_at)
        upd.removes.append("retry_at")
        return self._try_update_run(job_id, due_at, upd)

    def cancel(
        self, run: Run, *, reason: str, now: datetime, record: AttemptRecord | None = None
    ) -> Run | None:
        """``run`` -> CANCELLED if it is still in the state and under the fencing token read; the token is
        raised so a running worker's session finds it at its next beat. None if it moved on."""
        upd = Update(conditions={"state": run.state.value, "fencing_token": run.fencing_token})
        upd.sets.update(state=RunState.CANCELLED.value, finished_at=now, error=reason)
        upd.adds["fencing_token"] = 1
        upd.removes.extend(terminal_removals())
        upd.appends["events"] = [{"at": now, "kind": "cancelled", "detail": {"reason": reason}}]
        if record is not None:
            upd.appends["attempts"] = [record_to_attr(run.job_id, run.due_at, record)]
        return self._try_update_run(run.job_id, run.due_at, upd)

    def redrive(self, run: Run, *, now: datetime, watch_at: datetime) -> Run | None:
        """A run that failed for good -> PENDING at ``attempt + 1`` with a fresh budget of its job's
        ``max_attempts``; it leaves the dead-letter index and rejoins the watchdog (and, for an overlap
        policy, the active-runs) index. None if it is no longer in the state and attempt read."""
        upd = Update(conditions={"state": run.state.value, "attempt": run.attempt})
        upd.sets.update(
            state=RunState.PENDING.value,
            attempt=run.attempt + 1,
            max_attempts=run.attempt + run.retry.max_attempts,
            budget_from_attempt=run.attempt + 1,
            dead_lettered=False,
            trigger=Trigger.RETRY.value,
            watch_at=watch_at,
        )
        upd.sets[WATCH_INDEX_PK] = watch_key(run.shard, run.run_id)
        if run.overlap.enforced:
            upd.sets[ACTIVE_INDEX_PK] = run.job_id
        upd.removes.extend(
            [
                "dead_lettered_at",
                DEAD_LETTER_INDEX_PK,
                "finished_at",
                "exit_code",
                "error",
                "timeout_action",
                "timeout_outcome",
            ]
        )
        upd.appends["events"] = [{"at": now, "kind": "redriven", "detail": {"attempt": run.attempt + 1}}]
        return self._try_update_run(run.job_id, run.due_at, upd)

    def record_event(self, job_id: str, due_at: datetime, event: Mapping[str, Any]) -> None:
        """Append ``event`` to the run's ``events`` history (unconditional but for the run existing)."""
        upd = Update(extra_condition="attribute_exists(job_id)")
        upd.appends["events"] = [dict(event)]
        self._try_update_run(job_id, due_at, upd)


def terminal_removals() -> Sequence[str]:
    """Attributes a run drops when it becomes terminal (it leaves the watchdog GSI, the lease ends)."""
    return (
        WATCH_INDEX_PK,
        WATCH_INDEX_SK,
        ACTIVE_INDEX_PK,
        RUNNING_INDEX_PK,
        "held",
        "lease_owner",
        "lease_expires_at",
        "session_id",
        "retry_at",
    )
