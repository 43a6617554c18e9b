"""The bench's arithmetic: DynamoDB item sizes and units, percentiles, the fixed/per-run split, the model."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench import calls, model
from bench.stats import percentile, summarize
from duetime.adapters.aws.resources import SHARD_LEASE_PREFIX, WATCH_KEYS_PER_SHARD
from duetime.local.callcount import TableSchema, item_size, read_units, sqs_requests, value_size, write_units


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ({"S": "abc"}, 3),
        ({"S": "é"}, 2),  # UTF-8 bytes
        ({"N": "123"}, 3),  # 3 significant digits -> 2 bytes + 1
        ({"N": "-0.0100"}, 2),  # leading and trailing zeros trimmed: one digit
        ({"N": "1700000000"}, 2),  # trailing zeros trimmed
        ({"BOOL": True}, 1),
        ({"NULL": True}, 1),
        ({"B": b"\x00\x01"}, 2),
        ({"L": [{"S": "ab"}, {"N": "1"}]}, 3 + (1 + 2) + (1 + 2)),
        ({"M": {"k": {"S": "v"}}}, 3 + 1 + 1 + 1),
        ({"SS": ["a", "bc"]}, 3),
    ],
)
def test_value_sizes_follow_dynamodbs_rules(value: dict[str, Any], size: int) -> None:
    assert value_size(value) == size


def test_an_items_size_counts_names_and_values() -> None:
    assert item_size({"job_id": {"S": "j1"}, "n": {"N": "7"}}) == 6 + 2 + 1 + 2
    assert item_size(None) == 0


def test_units_round_up_with_a_minimum() -> None:
    assert [write_units(s) for s in (0, 1, 1024, 1025)] == [1, 1, 1, 2]
    assert write_units(1500, transactional=True) == 4
    assert read_units(0, consistent=False) == 0.5
    assert read_units(4097, consistent=True) == 2.0
    assert [sqs_requests(b) for b in (0, 65536, 65537)] == [1, 1, 2]


SCHEMA = TableSchema(("job_id",), {"due": (("shard", "next_fire_at"), "ALL", ())})


def test_gsi_writes_for_entering_moving_changing_and_leaving_an_index() -> None:
    base = {"job_id": {"S": "j"}, "shard": {"N": "1"}}
    due = {**base, "next_fire_at": {"S": "2026-01-01"}}
    moved = {**base, "next_fire_at": {"S": "2026-01-02"}}
    touched = {**due, "updated_at": {"S": "x"}}
    assert SCHEMA.gsi_writes(None, due) == {"due": [1]}
    assert SCHEMA.gsi_writes(due, moved) == {"due": [1, 1]}
    assert SCHEMA.gsi_writes(due, touched) == {"due": [1]}
    assert SCHEMA.gsi_writes(due, base) == {"due": [1]}
    assert SCHEMA.gsi_writes(base, {**base, "x": {"S": "y"}}) == {}


def test_percentiles_use_the_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert math.isnan(percentile([], 50))
    assert summarize([0.5, 0.1]) == {"p50_s": 0.1, "p95_s": 0.5, "p99_s": 0.5, "max_s": 0.5}


def _rec(t: float, op: str, **kw: Any) -> dict[str, Any]:
    svc = kw.pop("svc", "dynamodb")
    return {"t": t, "svc": svc, "op": op, "ms": 1.0, "thread": kw.pop("thread", "clock"), **kw}


def _iteration(t: float, *, items: int = 0, read_bytes: int = 0) -> list[dict[str, Any]]:
    """One clock iteration on 1 shard: a due query (and when it finds something due, the shard lease taken
    before the claims and released after them), a sweep query per watch key."""
    lease = [_rec(t, "UpdateItem", table="x-jobs", key=f"{SHARD_LEASE_PREFIX}0", wru=1)] if items else []
    return [
        _rec(t, "Query", table="x-jobs", index="due", items=items, read_bytes=read_bytes, rru=0.5),
        *lease,
        *lease,
    ] + [
        _rec(t, "Query", table="x-runs", index="watchdog", items=0, read_bytes=0, rru=0.5)
        for _ in range(WATCH_KEYS_PER_SHARD)
    ]


def test_the_split_books_ticks_sweeps_leases_and_idle_polls_as_fixed_and_the_rest_per_run() -> None:
    # Given an idle window of 2 iterations, and a workload window of 3 iterations, one of which claimed a run
    idle = (
        _iteration(1)
        + _iteration(2)
        + [_rec(2, "ReceiveMessage", svc="sqs", thread="MainThread", messages=0)]
    )
    window = _iteration(10) + _iteration(11, items=1, read_bytes=2048) + _iteration(12)
    window += [
        _rec(11, "PutItem", table="x-runs", key="j1|t", wru=2, gsi={"watchdog": [1]}),
        _rec(11, "UpdateItem", table="x-jobs", key="j1", wru=4, gsi={"due": [1, 1], "by_tenant": [1]}),
        _rec(11, "SendMessage", svc="sqs", queue="x-small", requests=1),
        _rec(12, "ReceiveMessage", svc="sqs", thread="MainThread", messages=0),
    ]
    split = calls.split(idle, window, shards=1)
    # Then the fixed part is 3 x (1 + 4 queries, 0.5 RRU each), the busy tick's 2 lease writes (a lease row
    # the idle window never touched) and the empty poll
    assert (split.ticks, split.sweeps, split.idle_polls) == (3, 3, 1)
    queries = 1 + WATCH_KEYS_PER_SHARD
    assert split.fixed.wru == 2 and split.fixed.rru == pytest.approx(3 * queries * 0.5 - 2048 / 4096 / 2)
    assert dict(split.per_tick.calls) == {"dynamodb Query jobs/due": 1}
    assert dict(split.per_sweep.calls) == {"dynamodb Query runs/watchdog": WATCH_KEYS_PER_SHARD}
    # and per run: the claim's three calls, its units, and the query's bytes (2 KB eventually consistent)
    assert dict(split.variable.calls) == {
        "dynamodb PutItem runs": 1,
        "dynamodb UpdateItem jobs": 1,
        "sqs SendMessage small": 1,
    }
    assert split.variable.wru == 6
    assert split.variable.rru == pytest.approx(2048 / 4096 / 2)
    assert dict(split.variable.gsi_wru) == {"watchdog": 1, "due": 2, "by_tenant": 1}
    assert dict(split.variable.table_wru) == {"runs": 1, "jobs": 1}


def test_the_sweepers_reads_of_overdue_runs_are_priced_at_awss_sweep_rate() -> None:
    # Given a workload window where the (1 s) local sweeper read a long run and its session at each of 60
    # sweeps (a watchdog query returning its key, then a BatchGetItem of its row and its session), and a
    # worker read the same run once (not the clock thread)
    idle = _iteration(1) + _iteration(2)
    window: list[dict[str, Any]] = []
    for second in range(60):
        window += [
            _rec(10 + second, "Query", table="x-runs", index="watchdog", items=1, read_bytes=400, rru=0.5),
            _rec(10 + second, "BatchGetItem", rru=2.0),
        ]
    window.append(_rec(30, "BatchGetItem", thread="session", rru=0.5))
    split = calls.split(idle, window, shards=1, sweep_weight=1 / 60)
    # Then the sweeper's per-run reads count as one sweep's (AWS sweeps once a minute): 2 RRU of rows and
    # sessions and the query's 400 bytes once; the worker's read counts whole
    assert split.variable.rru == pytest.approx(2.0 + 400 / 4096 / 2 + 0.5)
    assert split.variable.calls["dynamodb BatchGetItem"] == pytest.approx(1 + 1)
    # and without the weight, all 60 sweeps' reads
    unweighted = calls.split(idle, window, shards=1)
    assert unweighted.variable.rru == pytest.approx(60 * (2.0 + 400 / 4096 / 2) + 0.5)


def test_the_model_sizes_shards_from_the_hot_gsi_and_the_tick_rate() -> None:
    results = {
        "cost": {
            "per_run": {
                "calls": {"dynamodb UpdateItem runs": 2, "sqs ReceiveMessage small": 1},
                "gsi_wru": {"watchdog": 4.0, "due": 2.0, "by_tenant": 1.0},
                "table_wru": {"runs": 3.0, "jobs": 2.0},
            },
            "dynamodb_wru_per_run": 12.0,
            "dynamodb_rru_per_run": 0.1,
            "lambda_invocations_per_run": 0.5,
            "usd_per_million_runs": 10.0,
        },
        "tick": {
            "claims_per_s": 50.0,
            "calls_per_claim": {
                "dynamodb PutItem runs": 1,
                "dynamodb UpdateItem jobs": 1,
                "sqs SendMessage small": 1,
            },
        },
    }
    p = model.project(results, tick_processes=1)
    # watchdog: 4 WRU per run on one key value -> 250 runs/s per key value -> 48 values for 12,000/s
    assert p["dynamodb"]["gsi_hot_keys"]["watchdog"]["keys_needed_at_peak"] == 48
    assert p["dynamodb"]["peak_wru_per_s"] == 144_000
    # claims: 2 x 6 ms + 10 ms = 22 ms -> 45.5/s per shard -> 264 shards
    assert p["ticks"]["shards_for_peak_claims_aws"] == 264
    assert p["ticks"]["shards"] == 264
    assert p["usd_per_day"] == 1000
    assert "Scale model" in model.render(p)
    # a tick claiming 8 at once: 8 x 45.5/s per shard -> 33 shards, more than the watchdog's 48 key values
    # need (4 per shard: 12) and the due index's 24 (2 WRU per run: 500/s per key, 4 keys per shard: 6)
    results["tick"]["claim_concurrency"] = 8
    p = model.project(results, tick_processes=1)
    assert p["ticks"]["shards_for_peak_claims_aws"] == 33
    assert p["ticks"]["shards_for_gsi_partitions"] == 12
    assert p["ticks"]["due_gsi_bound_claims_per_s_per_shard"] == 2000
    assert p["ticks"]["shards"] == 33
    # claiming 32 at once: 9 shards for the claims, so the watchdog's 12 bind
    results["tick"]["claim_concurrency"] = 32
    assert model.project(results, tick_processes=1)["ticks"]["shards"] == 12


def test_the_model_gives_each_tick_process_a_vcpu_at_the_measured_cpu_per_claim() -> None:
    # Given 5 ms of Duetime CPU per claim measured with 1 process and 6 ms with 2 (the parent's part in it)
    results = {
        "cost": {
            "per_run": {"calls": {}, "gsi_wru": {"watchdog": 2.0, "due": 2.0}, "table_wru": {}},
            "dynamodb_wru_per_run": 5.0,
            "dynamodb_rru_per_run": 0.1,
            "usd_per_million_runs": 10.0,
        },
        "tick": {
            "claims_per_s": 50.0,
            "claim_concurrency": 8,
            "calls_per_claim": {"dynamodb PutItem runs": 1, "dynamodb UpdateItem jobs": 1},
            "runs": [
                {"processes": 1, "cpu_duetime_ms_per_claim": 5.0},
                {"processes": 2, "cpu_duetime_ms_per_claim": 6.0},
            ],
        },
    }
    # Then the figure with the parent's part counts: one process, 1000 / 6 = 166.7 claims/s per shard on its
    # one vCPU, 72 shards for 12,000/s
    one = model.project(results, tick_processes=1)["ticks"]
    assert (one["cpu_bound_claims_per_s_per_shard"], one["shards"]) == (166.7, 72)
    assert one["cpu_ms_per_claim"] == 6.0 and one["cpu_ms_per_claim_measured_with_processes"] == 2
    # and four: 4 x 1000 / 6 = 666.7/s per shard, 18 shards (the watchdog's 6 and the due index's 6 do not bind)
    four = model.project(results, tick_processes=4)["ticks"]
    assert (four["cpu_bound_claims_per_s_per_shard"], four["shards"]) == (666.7, 18)
    assert four["shards_for_gsi_partitions"] == 6
    # and by default the prod stage's (cdk.json: 4)
    assert model.prod_tick_processes() == 4
    assert model.project(results)["ticks"]["tick_processes"] == 4


def test_the_total_with_storage_prices_the_logs_in_s3_standard_and_in_s3_express_one_zone() -> None:
    from bench.cost import _with_storage

    # Given 0.5 log PUTs per run, 4,000 bytes of final log per run and run rows of 900 bytes
    per_run = calls.Tally()
    per_run.s3_puts = 0.5
    raw = {
        "workload": {"long_seconds": 60},
        "by_run": {
            "rows": [{"job": "now-1", "attempts": 1, "wru": 5, "row_bytes": 900}],
            "log_chunk_puts": 0,
            "final_log_puts": 1,
            "final_log_bytes": 4000,
        },
    }
    s3_standard = 0.5 * 0.005 / 1e3
    out = _with_storage(7.0, s3_standard, per_run, raw, runs=1)
    # Then the standard total adds 30 days of the row ($0.25/GB-month) and the log ($0.023/GB-month)
    row = 1000 / 1e9 * 0.25
    assert out["usd_per_million_runs_with_storage"] == round(7.0 + (row + 4000 / 1e9 * 0.023) * 1e6, 2)
    # And express swaps the PUTs ($0.00113 per 1,000), adds the upload ($0.0032/GB) and its storage ($0.11)
    express = out["log_storage_express"]
    express_s3 = 0.5 * 0.00113 / 1e3 + 4000 / 1e9 * 0.0032
    assert express["s3_usd_per_million_runs"] == round(express_s3 * 1e6, 2)
    assert express["usd_per_million_runs_with_storage"] == round(
        7.0 + (express_s3 - s3_standard + row + 4000 / 1e9 * 0.11) * 1e6, 2
    )
    assert express["usd_per_million_runs_with_storage"] < out["usd_per_million_runs_with_storage"]


def test_history_storage_prices_the_hot_row_and_the_archived_bytes_in_each_class() -> None:
    from bench import history

    # Given 4 runs of 900-byte rows, archived as one 1,200-byte data object and 2 index objects of 100 bytes
    raw = {
        "runs": 4,
        "row_bytes": [900, 900, 900, 900],
        "data_objects": [1200],
        "index_objects": [100, 100],
        "data_bytes_uncompressed": 12_000,
        "inline_log_bytes": 4000,
    }
    out = history.price_it(raw)
    hot, archive = out["storage_hot"], out["storage_archive"]
    # Then a hot run costs its row + 100 B at $0.25/GB-month
    assert hot["bytes_per_run"] == 1000
    assert hot["usd_per_million_runs_month"] == round(1000 / 1e9 * 0.25 * 1e6, 4)
    # And an archived run its share of every object, at Standard, IA and Glacier IR prices
    assert archive["bytes_per_run"] == 350
    assert archive["usd_per_million_runs_month"] == {
        "standard": round(350 / 1e9 * 0.023 * 1e6, 4),
        "infrequent_access": round(350 / 1e9 * 0.0125 * 1e6, 4),
        "glacier_instant_retrieval": round(350 / 1e9 * 0.004 * 1e6, 4),
    }
    assert archive["compression_ratio"] == 10.0
    assert archive["puts_per_run"] == 0.75
    # a 1,200-byte object is under 128 KB: lifecycle transitions skip it
    assert archive["data_objects_transition"] is False


def test_the_model_projects_the_hot_table_and_a_year_of_archive() -> None:
    from bench import history

    raw = {
        "runs": 1,
        "row_bytes": [900],
        "data_objects": [300],
        "index_objects": [100],
        "data_bytes_uncompressed": 3000,
        "inline_log_bytes": 0,
    }
    cost = history.price_it(raw)
    out = model.history(cost)
    # 100M runs a day, 99 % kept 14 days and 1 % 90 days: 1.476 billion rows of 1,000 bytes
    assert out["history_hot"]["rows"] == 1_476_000_000
    assert out["history_hot"]["tb"] == 1.48
    assert out["history_hot"]["usd_per_month"] == round(1.476e12 / 1e9 * 0.25)
    # a year: 36.5 billion runs of 400 bytes
    year = out["history_archive_per_year"]
    assert year["tb"] == 14.6
    assert year["usd_per_month_after_a_year_standard"] == round(14.6e12 / 1e9 * 0.023)
    assert year["usd_per_month_after_a_year_tiered"] < year["usd_per_month_after_a_year_standard"]
    # 128 KB of 300-byte lines
    assert year["runs_per_data_object_to_transition"] == math.ceil(128 * 1024 / 300)
    assert model.history({}) == {}
