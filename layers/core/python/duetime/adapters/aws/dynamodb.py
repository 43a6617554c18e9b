"""DynamoDB adapter: the only module that talks to the jobs and runs tables.

Every state change is one conditional write (DESIGN.md sections 4 and 5); a failed condition becomes one of
Duetime's own errors here and nowhere else: ``AlreadyClaimedError``, ``StaleClaimError``,
``StartRejectedError``, ``LeaseLostError``.

Items hold instants as fixed-width UTC strings (``timeutil.to_iso``), numbers as DynamoDB numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

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
    SHARD_LEASE_PREFIX,
    SUBMIT_RATE_PREFIX,
    TENANT_COUNTER_PREFIX,
    TENANT_KEY,
    WATCH_INDEX,
    WATCH_INDEX_PK,
    WATCH_INDEX_SK,
)
from duetime.domain.errors import (
    AlreadyClaimedError,
    ConflictError,
    DuetimeError,
    JobExistsError,
    LeaseLostError,
    StaleClaimError,
    StartRejectedError,
    ThrottledError,
)
from duetime.domain.models import Job, Run, RunState
from duetime.domain.timeutil import from_iso, to_iso

_ser = TypeSerializer()
_de = TypeDeserializer()


def _last_result(state: RetryCallState) -> Any:
    """tenacity: when the tries run out, return the last try's result instead of raising RetryError."""
    return state.outcome.result() if state.outcome is not None else None


class ConditionFailedError(DuetimeError):
    """A conditional update's condition did not hold (generic form, mapped by callers)."""


def _to_attr(value: Any) -> Any:
    """Python value -> DynamoDB-serialisable value (datetimes as ISO UTC, floats as Decimal)."""
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


def json_text(value: Any) -> str:
    """Compact JSON text of a user's JSON value (a Lambda payload or result), non-ASCII escaped: whatever
    strings a function returns, the text is valid UTF-8 for DynamoDB."""
    return json.dumps(value, separators=(",", ":"))


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
    return _encode_json_fields(job.model_dump(mode="python"))


def job_from_item(item: Mapping[str, Any]) -> Job:
    data = _decode_json_fields(dict(item))
    data.setdefault("next_fire_at", None)
    data.setdefault("schedule", None)
    return Job.model_validate(data)


def run_to_item(run: Run, *, retention_days: int) -> dict[str, Any]:
    data = _encode_json_fields(run.model_dump(mode="python"))
    if not run.state.terminal and run.watch_at is not None:
        data[WATCH_INDEX_PK] = run.shard
    if not run.state.terminal and (run.overlap.enforced or run.held is not None):
        data[ACTIVE_INDEX_PK] = run.job_id
    if run.dead_lettered:
        data[DEAD_LETTER_INDEX_PK] = run.tenant
    data[RUNS_TTL_ATTRIBUTE] = int((run.due_at + timedelta(days=retention_days)).timestamp())
    return data


#: attributes that exist only to place a run in a sparse index (derived from the run's own fields)
_INDEX_ONLY_ATTRIBUTES = frozenset(
    {WATCH_INDEX_PK, ACTIVE_INDEX_PK, RUNNING_INDEX_PK, DEAD_LETTER_INDEX_PK, RUNS_TTL_ATTRIBUTE}
)


def run_from_item(item: Mapping[str, Any]) -> Run:
    data = {k: v for k, v in item.items() if k not in _INDEX_ONLY_ATTRIBUTES}
    return Run.model_validate(_decode_json_fields(data))


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


def _is_condition_failure(exc: ClientError) -> bool:
    return bool(exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException")


class DynamoStore:
    """Jobs and runs in DynamoDB.

    Args:
        jobs_table: physical name of the jobs table.
        runs_table: physical name of the runs table.
        run_retention_days: TTL of run rows, days after their due time.
    """

    def __init__(self, jobs_table: str, runs_table: str, *, run_retention_days: int = 90) -> None:
        self.jobs_table = jobs_table
        self.runs_table = runs_table
        self.run_retention_days = run_retention_days

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
        cond = "#v = :v AND " + (
            "#nf = :nf" if expected_next_fire_at is not None else "attribute_not_exists(#nf)"
        )
        values: dict[str, Any] = {":v": expected_version}
        if expected_next_fire_at is not None:
            values[":nf"] = expected_next_fire_at
        try:
            self._ddb.put_item(
                TableName=self.jobs_table,
                Item=serialize(job_to_item(job)),
                ConditionExpression=cond,
                ExpressionAttributeNames={"#v": "version", "#nf": "next_fire_at"},
                ExpressionAttributeValues=serialize(values),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConflictError(f"job {job.job_id!r} changed meanwhile; read it and try again") from None
            raise

    def list_jobs(
        self,
        tenant: str,
        *,
        limit: int,
        start_key: dict[str, Any] | None = None,
        state: str | None = None,
        name_prefix: str | None = None,
    ) -> tuple[list[Job], dict[str, Any] | None]:
        """The tenant's jobs, newest first, filtered; returns (jobs, key to continue from).

        The ``by_tenant`` index projects only ``state`` and ``name`` (what the filters read), so a claim,
        which only moves ``next_fire_at``, never writes it (one index key per tenant would otherwise take a
        write per run: DynamoDB's 1,000 WCU/s per partition would cap a tenant near 600 claims/s). The page's
        jobs are then read with one strongly consistent ``BatchGetItem``; a job whose state changed since
        the index saw it is checked again against the filters.
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
        entries, next_key = self._collect(
            kwargs, limit, start_key, lambda entry: entry, keys=(JOBS_PK, TENANT_KEY, CREATED_AT_KEY)
        )
        found = self.get_jobs([str(e[JOBS_PK]) for e in entries])
        wanted = [found[e[JOBS_PK]] for e in entries if e[JOBS_PK] in found]
        return [
            j
            for j in wanted
            if j.tenant == tenant
            and (j.state.value == state if state else j.state.value != "DELETED")
            and (not name_prefix or j.name.startswith(name_prefix))
        ], next_key

    def get_jobs(self, job_ids: Sequence[str]) -> dict[str, Job]:
        """The stored jobs among ``job_ids`` (absent ones left out), by id; strongly consistent.

        One ``BatchGetItem`` per 100 ids (its limit); keys DynamoDB leaves unprocessed (throttling) are asked
        again with exponential backoff (AWS's advice for ``UnprocessedKeys``), up to 8 times.

        Raises:
            ThrottledError: keys were still unprocessed after the last try.
        """
        jobs: dict[str, Job] = {}
        unique = list(dict.fromkeys(job_ids))
        for first in range(0, len(unique), 100):
            request: dict[str, Any] = {
                self.jobs_table: {
                    "Keys": [serialize({JOBS_PK: i}) for i in unique[first : first + 100]],
                    "ConsistentRead": True,
                }
            }

            def fetch() -> dict[str, Any]:
                nonlocal request
                out = self._ddb.batch_get_item(RequestItems=request)
                for item in out.get("Responses", {}).get(self.jobs_table, []):
                    job = job_from_item(deserialize(item))
                    jobs[job.job_id] = job
                request = out.get("UnprocessedKeys") or {}
                return request

            left = Retrying(
                stop=stop_after_attempt(8),
                wait=wait_random_exponential(multiplier=0.05, max=2.0),
                retry=retry_if_result(bool),
                retry_error_callback=_last_result,
            )(fetch)
            if left:
                keys = len(left.get(self.jobs_table, {}).get("Keys", []))
                raise ThrottledError(f"{keys} jobs still unprocessed after 8 BatchGetItem tries")
        return jobs

    def _collect(
        self,
        kwargs: dict[str, Any],
        limit: int,
        start_key: dict[str, Any] | None,
        build: Any,
        *,
        keys: tuple[str, ...],
    ) -> tuple[list[Any], dict[str, Any] | None]:
        """Page through a (filtered) Query until ``limit`` items; the continuation key is the last item's."""
        items: list[dict[str, Any]] = []
        if start_key:
            kwargs["ExclusiveStartKey"] = start_key
        while len(items) < limit:
            kwargs["Limit"] = max(limit - len(items), 10)
            out = self._ddb.query(**kwargs)
            items.extend(out.get("Items", []))
            if "LastEvaluatedKey" not in out:
                if len(items) <= limit:
                    return [build(deserialize(i)) for i in items], None
                break
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]
        items = items[:limit]
        last = items[-1]
        return [build(deserialize(i)) for i in items], {k: last[k] for k in keys if k in last}

    def query_runs(
        self,
        job_id: str,
        *,
        limit: int,
        start_key: dict[str, Any] | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        active_only: bool = False,
    ) -> tuple[list[Run], dict[str, Any] | None]:
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
        return self._collect(kwargs, limit, start_key, run_from_item, keys=(RUNS_PK, RUNS_SK))

    def query_due(self, shard: int, until: datetime, *, page_size: int = 500) -> Iterator[Job]:
        """Jobs of ``shard`` whose ``next_fire_at <= until``, oldest first (due GSI; eventually consistent)."""
        kwargs: dict[str, Any] = {
            "TableName": self.jobs_table,
            "IndexName": DUE_INDEX,
            "KeyConditionExpression": "#pk = :shard AND #sk <= :until",
            "ExpressionAttributeNames": {"#pk": DUE_INDEX_PK, "#sk": DUE_INDEX_SK},
            "ExpressionAttributeValues": serialize({":shard": shard, ":until": until}),
            "Limit": page_size,
        }
        while True:
            out = self._ddb.query(**kwargs)
            for item in out.get("Items", []):
                yield job_from_item(deserialize(item))
            if "LastEvaluatedKey" not in out:
                return
            kwargs["ExclusiveStartKey"] = out["LastEvaluatedKey"]

    def advance_job(
        self, job_id: str, *, claimed: datetime, next_fire_at: datetime | None, now: datetime, missed: int = 0
    ) -> None:
        """Move the job's ``next_fire_at`` from ``claimed`` to ``next_fire_at`` (claim step 2).

        ``next_fire_at=None`` removes it (the job leaves the due index) and marks the job COMPLETED.

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
        try:
            self._ddb.update_item(TableName=self.jobs_table, Key=serialize({"job_id": job_id}), **upd.build())
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise StaleClaimError(f"job {job_id!r} was already advanced past {to_iso(claimed)}") from None
            raise

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
                Item=serialize(run_to_item(run, retention_days=self.run_retention_days)),
                ConditionExpression="attribute_not_exists(job_id)",
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise AlreadyClaimedError(f"run {run.run_id} already exists") from None
            raise

    def get_run(self, job_id: str, due_at: datetime) -> Run | None:
        """The run, or None. Strongly consistent."""
        out = self._ddb.get_item(
            TableName=self.runs_table, Key=self._run_key(job_id, due_at), ConsistentRead=True
        )
        return run_from_item(deserialize(out["Item"])) if "Item" in out else None

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

    def query_watch(self, shard: int, until: datetime, *, page_size: int = 200) -> Iterator[Run]:
        """Non-terminal runs of ``shard`` whose ``watch_at <= until`` (watchdog GSI), oldest first."""
        kwargs: dict[str, Any] = {
            "TableName": self.runs_table,
            "IndexName": WATCH_INDEX,
            "KeyConditionExpression": "#pk = :shard AND #sk <= :until",
            "ExpressionAttributeNames": {"#pk": WATCH_INDEX_PK, "#sk": WATCH_INDEX_SK},
            "ExpressionAttributeValues": serialize({":shard": shard, ":until": until}),
            "Limit": page_size,
        }
        while True:
            out = self._ddb.query(**kwargs)
            for item in out.get("Items", []):
                yield run_from_item(deserialize(item))
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
        self, tenant: str, *, limit: int = 20, start_key: dict[str, Any] | None = None
    ) -> tuple[list[Run], dict[str, Any] | None]:
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
            start_key,
            run_from_item,
            keys=(RUNS_PK, RUNS_SK, DEAD_LETTER_INDEX_PK, DEAD_LETTER_INDEX_SK),
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

    def count_submit(self, table: str, tenant: str, minute: datetime, *, limit: int) -> bool:
        """Count one submit in the tenant's current minute (a TTL'd item in ``table``); False over ``limit``."""
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

    def update_run(self, job_id: str, due_at: datetime, update: Update) -> Run:
        """Apply a conditional update to a run and return the run as it now is.

        Raises:
            ConditionFailedError: if the update's condition did not hold.
        """
        try:
            out = self._ddb.update_item(
                TableName=self.runs_table,
                Key=self._run_key(job_id, due_at),
                ReturnValues="ALL_NEW",
                **update.build(),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"condition failed on run {job_id}@{to_iso(due_at)}") from None
            raise
        return run_from_item(deserialize(out["Attributes"]))

    # ---- run transitions (DESIGN.md section 5) -------------------------------------------------------
    def start_run(
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
    ) -> Run:
        """Start ``attempt``: the run becomes RUNNING and its fencing token goes up by one.

        Accepted from PENDING at ``attempt``, or from RETRY_WAIT at ``attempt - 1`` once its ``retry_at`` has
        passed (the retry's delayed wake-up message arrives directly, without waiting for the sweeper).

        Raises:
            StartRejectedError: neither holds: a duplicate, stale or early message. Drop it.
        """
        upd = Update()
        state, att, retry_at = upd.name("state"), upd.name("attempt"), upd.name("retry_at")
        deadline, now_v = upd.name("start_deadline_at"), upd.value("now", now)
        upd.extra_condition = (
            f"(({state} = {upd.value('pending', RunState.PENDING.value)} AND {att} = {upd.value('att', attempt)})"
            f" OR ({state} = {upd.value('retry_wait', RunState.RETRY_WAIT.value)}"
            f" AND {att} = {upd.value('prev_att', attempt - 1)} AND {retry_at} <= {now_v}))"
            # attempt 1 must start by its starting deadline (retries are past it by design)
            f" AND (attribute_not_exists({deadline}) OR {deadline} >= {now_v} OR {att} > {upd.value('one', 1)})"
            # a run held by its job's pause starts only once the resume released it
            f" AND attribute_not_exists({upd.name('held')})"
        )
        upd.sets.update(
            state=RunState.RUNNING.value,
            attempt=attempt,
            lease_owner=owner,
            lease_expires_at=lease_expires_at,
            started_at=now,
            watch_at=watch_at or lease_expires_at,
        )
        if deadline_at is not None:
            upd.sets["deadline_at"] = deadline_at
        if running_tenant is not None:
            upd.sets[RUNNING_INDEX_PK] = running_tenant
        # the previous attempt's outcome stays in `attempts`, not on the run being retried
        upd.removes.extend(["retry_at", "finished_at", "exit_code", "error", "result", "result_truncated"])
        upd.adds["fencing_token"] = 1
        try:
            return self.update_run(job_id, due_at, upd)
        except ConditionFailedError:
            raise StartRejectedError(
                f"run {job_id}@{to_iso(due_at)} attempt {attempt} cannot start (duplicate, stale or early)"
            ) from None

    def heartbeat(
        self,
        job_id: str,
        due_at: datetime,
        *,
        fencing_token: int,
        lease_expires_at: datetime,
        watch_at: datetime | None = None,
    ) -> Run:
        """Extend the lease if ``fencing_token`` is still current and the run RUNNING.

        Raises:
            LeaseLostError: the token is stale or the run is no longer RUNNING; stop the task.
        """
        upd = Update(conditions={"state": RunState.RUNNING.value, "fencing_token": fencing_token})
        upd.sets.update(lease_expires_at=lease_expires_at, watch_at=watch_at or lease_expires_at)
        try:
            return self.update_run(job_id, due_at, upd)
        except ConditionFailedError:
            raise LeaseLostError(f"lease on {job_id}@{to_iso(due_at)} token {fencing_token} lost") from None

    def fenced_transition(self, job_id: str, due_at: datetime, *, fencing_token: int, update: Update) -> Run:
        """Apply ``update`` only if the run is RUNNING under ``fencing_token`` (finish, lease expiry).

        Raises:
            LeaseLostError: the token is stale or the run is not RUNNING; nothing was applied.
        """
        update.conditions.update(state=RunState.RUNNING.value, fencing_token=fencing_token)
        try:
            return self.update_run(job_id, due_at, update)
        except ConditionFailedError:
            raise LeaseLostError(
                f"stale fencing token {fencing_token} on {job_id}@{to_iso(due_at)}"
            ) from None

    def record_event(self, job_id: str, due_at: datetime, event: Mapping[str, Any]) -> None:
        """Append ``event`` to the run's ``events`` history (unconditional but for the run existing)."""
        upd = Update(extra_condition="attribute_exists(job_id)")
        upd.appends["events"] = [dict(event)]
        try:
            self.update_run(job_id, due_at, upd)
        except ConditionFailedError:
            pass


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
        "retry_at",
    )
