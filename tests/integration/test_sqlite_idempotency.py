"""Powertools idempotency on the embedded SQLite file (``SqlitePersistenceLayer``), on real files: replay,
payload validation, in-progress records and their expiry, record expiry, and processes racing one key."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyItemNotFoundError,
    IdempotencyValidationError,
)

from duetime.adapters.sqlite.db import Database
from duetime.adapters.sqlite.idempotency import TABLE, SqlitePersistenceLayer
from duetime.adapters.sqlite.store import SqliteStore
from duetime.api import idempotency as api_idempotency
from duetime.domain.errors import ConflictError

# without a Lambda context Powertools warns on every in-progress save that it cannot bound the record
pytestmark = pytest.mark.filterwarnings("ignore:Couldn't determine the remaining time left")

Run = Callable[..., dict[str, Any]]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "duetime.sqlite"


@pytest.fixture
def layer(db_path: Path) -> SqlitePersistenceLayer:
    return SqlitePersistenceLayer(db_path)


class Crash(BaseException):
    """Not an Exception: Powertools does not clear the record (the process 'died' mid-call)."""


class FakeContext:
    """A Lambda context: Powertools bounds the in-progress record by the remaining time."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def make_run(
    layer: SqlitePersistenceLayer,
    *,
    ttl: int = 3600,
    validate: bool = True,
    context: FakeContext | None = None,
) -> Run:
    """The decorated function as ``duetime.api.idempotency`` builds it: key from ``key``, payload ``body``."""
    config = IdempotencyConfig(
        event_key_jmespath="key",
        payload_validation_jmespath="body" if validate else "",
        expires_after_seconds=ttl,
    )
    if context is not None:
        config.register_lambda_context(context)  # type: ignore[arg-type]

    @idempotent_function(data_keyword_argument="request", persistence_store=layer, config=config)  # type: ignore[untyped-decorator]
    def run(*, request: dict[str, Any], handler: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return handler()

    return run  # type: ignore[no-any-return]


def rows(db_path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(
            f"SELECT id, status, expiration, in_progress_expiration, data, validation FROM {TABLE}"
        ).fetchall()


def counting(result: dict[str, Any]) -> tuple[list[int], Callable[[], dict[str, Any]]]:
    calls: list[int] = []

    def handler() -> dict[str, Any]:
        calls.append(1)
        return result

    return calls, handler


# ---- the table -------------------------------------------------------------------------------------------
def test_the_table_lives_in_the_stores_file_beside_its_schema(db_path: Path) -> None:
    SqliteStore(db_path)  # the store's schema first, then the layer
    SqlitePersistenceLayer(db_path)
    SqlitePersistenceLayer(db_path)  # a second open finds the table made
    with sqlite3.connect(db_path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({TABLE})")]
    assert {"jobs", "runs", "queue_messages", TABLE} <= tables
    assert columns == ["id", "status", "expiration", "in_progress_expiration", "data", "validation"]
    assert Database(db_path).schema_version() >= 1  # the layer opened (and migrated) it as the store does


# ---- replay and validation -------------------------------------------------------------------------------
def test_a_second_call_with_the_key_replays_the_first_result_without_running(
    layer: SqlitePersistenceLayer, db_path: Path
) -> None:
    run = make_run(layer)
    calls, handler = counting({"status": 201, "body": {"job_id": "j-1"}})
    request = {"key": "t#POST /jobs#k-1", "body": {"name": "a"}}
    first = run(request=request, handler=handler)
    again = run(request=request, handler=handler)
    assert first == again == {"status": 201, "body": {"job_id": "j-1"}}
    assert calls == [1]
    [(key, status, expiration, in_progress, data, validation)] = rows(db_path)
    assert status == "COMPLETED" and in_progress is None and validation
    assert key.endswith("#" + layer._generate_hash("t#POST /jobs#k-1"))
    assert abs(expiration - (time.time() + 3600)) < 5
    assert data == '{"body": {"job_id": "j-1"}, "status": 201}'

    # another layer on the file (another process of the stack) replays it too
    other_calls, other_handler = counting({"status": 500})
    assert make_run(SqlitePersistenceLayer(db_path))(request=request, handler=other_handler) == first
    assert other_calls == []

    # another key runs
    assert run(request={**request, "key": "t#POST /jobs#k-2"}, handler=handler) == first
    assert calls == [1, 1]


def test_the_same_key_with_another_payload_is_refused_when_validation_is_on(
    layer: SqlitePersistenceLayer,
) -> None:
    run = make_run(layer)
    calls, handler = counting({"ok": True})
    run(request={"key": "k", "body": {"name": "a"}}, handler=handler)
    with pytest.raises(IdempotencyValidationError):
        run(request={"key": "k", "body": {"name": "b"}}, handler=handler)
    assert calls == [1]
    # the same payload still replays
    assert run(request={"key": "k", "body": {"name": "a"}}, handler=handler) == {"ok": True}
    assert calls == [1]


def test_without_validation_another_payload_under_the_key_replays(
    db_path: Path, layer: SqlitePersistenceLayer
) -> None:
    run = make_run(layer, validate=False)
    calls, handler = counting({"ok": 1})
    run(request={"key": "k", "body": {"name": "a"}}, handler=handler)
    assert run(request={"key": "k", "body": {"name": "b"}}, handler=handler) == {"ok": 1}
    assert calls == [1]
    assert rows(db_path)[0][5] is None  # no payload hash stored


def test_a_validation_conflict_on_an_in_progress_record_is_refused_too(layer: SqlitePersistenceLayer) -> None:
    run = make_run(layer)
    seen: list[type[BaseException]] = []

    def handler() -> dict[str, Any]:
        try:
            run(request={"key": "k", "body": "other"}, handler=lambda: {"inner": True})
        except BaseException as exc:
            seen.append(type(exc))
        return {"outer": True}

    assert run(request={"key": "k", "body": "first"}, handler=handler) == {"outer": True}
    assert seen == [IdempotencyValidationError]


def test_a_failed_call_leaves_no_record_so_a_retry_runs(layer: SqlitePersistenceLayer, db_path: Path) -> None:
    run = make_run(layer)

    def failing() -> dict[str, Any]:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run(request={"key": "k", "body": 1}, handler=failing)
    assert rows(db_path) == []
    calls, handler = counting({"second": True})
    assert run(request={"key": "k", "body": 1}, handler=handler) == {"second": True}
    assert calls == [1]


# ---- in progress -----------------------------------------------------------------------------------------
def test_a_call_while_another_is_in_progress_is_refused_then_replays(
    layer: SqlitePersistenceLayer, db_path: Path
) -> None:
    run = make_run(layer)
    started, release = threading.Event(), threading.Event()
    results: list[dict[str, Any]] = []
    request = {"key": "k", "body": {"n": 1}}

    def slow() -> dict[str, Any]:
        started.set()
        assert release.wait(10)
        return {"slow": True}

    worker = threading.Thread(target=lambda: results.append(run(request=request, handler=slow)))
    worker.start()
    try:
        assert started.wait(10)
        assert [r[1] for r in rows(db_path)] == ["INPROGRESS"]
        calls, handler = counting({"fast": True})
        with pytest.raises(IdempotencyAlreadyInProgressError):
            run(request=request, handler=handler)
        assert calls == []
    finally:
        release.set()
        worker.join(10)
    assert results == [{"slow": True}]
    assert run(request=request, handler=handler) == {"slow": True}
    assert calls == []


def test_a_crashed_call_holds_the_key_until_its_in_progress_expiry_then_it_is_taken_over(
    layer: SqlitePersistenceLayer, db_path: Path
) -> None:
    request = {"key": "k", "body": {"n": 1}}

    def crash() -> dict[str, Any]:
        raise Crash

    # without a Lambda context the in-progress record has no in-progress expiry: it holds until it expires
    with pytest.raises(Crash):
        make_run(layer)(request=request, handler=crash)
    assert [(r[1], r[3]) for r in rows(db_path)] == [("INPROGRESS", None)]
    calls, handler = counting({"retry": True})
    with pytest.raises(IdempotencyAlreadyInProgressError):
        make_run(layer)(request={"key": "k", "body": {"n": 1}}, handler=handler)
    assert calls == []

    # with one, the record is bounded by the invocation's remaining time (here 50 ms) and taken over after
    bounded = SqlitePersistenceLayer(db_path)
    request2 = {"key": "k2", "body": {"n": 1}}
    with pytest.raises(Crash):
        make_run(bounded, context=FakeContext(50))(request=request2, handler=crash)
    [in_progress] = [r for r in rows(db_path) if r[0] == bounded._get_hashed_idempotency_key(request2)]
    assert in_progress[1] == "INPROGRESS" and abs(in_progress[3] - (time.time() * 1000 + 50)) < 1000
    with pytest.raises(IdempotencyAlreadyInProgressError):  # still within the 50 ms
        make_run(bounded, context=FakeContext(50))(request=request2, handler=handler)
    time.sleep(0.1)
    assert make_run(bounded, context=FakeContext(30_000))(request=request2, handler=handler) == {
        "retry": True
    }
    assert calls == [1]


# ---- expiry ----------------------------------------------------------------------------------------------
def test_after_the_record_expires_the_function_runs_again(
    layer: SqlitePersistenceLayer, db_path: Path
) -> None:
    run = make_run(layer, ttl=1)
    calls, handler = counting({"n": 1})
    request = {"key": "k", "body": 1}
    run(request=request, handler=handler)
    run(request=request, handler=handler)
    assert calls == [1]
    # expired once the clock's whole seconds pass the stored expiry (Powertools: int(now) > expiration)
    [(key, _, expiration, *_)] = rows(db_path)
    time.sleep(max(0.0, expiration + 1 - time.time()) + 0.05)
    with pytest.raises(IdempotencyItemNotFoundError):  # an expired record reads as absent
        layer._get_record(key)
    run(request=request, handler=handler)
    assert calls == [1, 1]
    assert len(rows(db_path)) == 1


def test_a_put_clears_expired_records_of_other_keys(layer: SqlitePersistenceLayer, db_path: Path) -> None:
    run = make_run(layer)
    _, handler = counting({})
    run(request={"key": "old", "body": 1}, handler=handler)
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"UPDATE {TABLE} SET expiration = ?", (int(time.time()) - 10,))
    run(request={"key": "new", "body": 1}, handler=handler)
    assert [r[0] for r in rows(db_path)] == [layer._get_hashed_idempotency_key({"key": "new"})]


# ---- the API's use of it ---------------------------------------------------------------------------------
def test_the_apis_once_on_the_sqlite_layer_replays_and_refuses_reuse(db_path: Path) -> None:
    persistence = SqlitePersistenceLayer(db_path)
    deps: Any = SimpleNamespace(
        idempotency=lambda: persistence, settings=SimpleNamespace(idempotency_ttl_seconds=3600)
    )
    calls, handler = counting({"status": 201, "headers": {}, "body": {"job_id": "j"}})
    args = {"tenant": "t", "route": "POST /jobs", "deps": deps, "handler": handler}
    first = api_idempotency.once("k-1", body={"name": "a"}, **args)
    assert api_idempotency.once("k-1", body={"name": "a"}, **args) == first
    assert calls == [1]
    with pytest.raises(api_idempotency.IdempotencyKeyReusedError):
        api_idempotency.once("k-1", body={"name": "b"}, **args)
    assert isinstance(api_idempotency.IdempotencyKeyReusedError("x"), ConflictError)
    assert calls == [1]


# ---- processes racing one key ----------------------------------------------------------------------------
def _race(path: str, marker: str, keys: list[str], barrier: Any, results: Any, who: int) -> None:
    """One process: for each key, wait for the others, then call the idempotent function with it."""
    run = make_run(SqlitePersistenceLayer(path))
    outcomes: list[str] = []
    for key in keys:

        def body(key: str = key) -> dict[str, Any]:
            with open(marker, "a") as f:  # O_APPEND: one line per run of the body, whichever process
                f.write(f"{key} {os.getpid()}\n")
            time.sleep(0.2)  # long enough that the others arrive while it is in progress
            return {"key": key, "by": who}

        barrier.wait(timeout=30)
        try:
            outcomes.append(f"result:{run(request={'key': key, 'body': 'same'}, handler=body)['by']}")
        except IdempotencyAlreadyInProgressError:
            outcomes.append("in-progress")
    results.put((who, outcomes))


def test_processes_racing_one_key_run_the_function_once(db_path: Path, tmp_path: Path) -> None:
    SqlitePersistenceLayer(db_path)  # the schema exists before the processes start
    marker = tmp_path / "ran.txt"
    marker.touch()
    keys = [f"race-{i}" for i in range(3)]
    n = 4
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(db_path), str(marker), keys, barrier, results, who))
        for who in range(n)
    ]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    ran = marker.read_text().splitlines()
    assert sorted(line.split()[0] for line in ran) == keys  # each key's body ran exactly once
    for i in range(len(keys)):
        round_ = [got[who][i] for who in range(n)]
        winners = [o for o in round_ if o.startswith("result:")]
        # the winner returned its result; the others were refused while it ran (or replayed it after)
        assert winners and len({o for o in winners}) == 1
        assert all(o in ("in-progress", winners[0]) for o in round_)
    assert {r[1] for r in rows(db_path)} == {"COMPLETED"}
