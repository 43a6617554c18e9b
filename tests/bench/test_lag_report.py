"""The lag part's bookkeeping: the result layout per backend, the ratios, the side-by-side table."""

from __future__ import annotations

import os
from typing import Any

from bench import __main__ as cli
from bench import model
from bench.lag import claims_timeline
from bench.stack import pss_kib


def _burst(p99: float, runs_per_s: float, **extra: Any) -> dict[str, Any]:
    return {"p50_s": p99 / 2, "p95_s": p99, "p99_s": p99, "max_s": p99, "runs_per_s": runs_per_s, **extra}


def test_the_ratio_is_the_default_backends_over_apschedulers() -> None:
    lag = {"sqlite": {"1000": _burst(2.0, 400.0)}, "moto": {"1000": _burst(80.0, 12.0)}}
    baseline = {"1000": _burst(1.0, 800.0)}
    assert cli.ratios(lag, baseline) == {"1000": {"p50_s": 2.0, "p99_s": 2.0, "runs_per_s": 0.5}}
    assert cli.ratios({"moto": lag["moto"]}, baseline) == {}


def test_an_older_flat_lag_layout_reads_as_the_moto_backends() -> None:
    flat = {"lag": {"100": _burst(4.0, 25.0)}}
    assert cli.lag_results(flat) == {"moto": flat["lag"]}
    nested = {"lag": {"sqlite": {"100": _burst(1.0, 100.0)}}}
    assert cli.lag_results(nested) == nested["lag"]


def test_the_table_puts_the_schedulers_side_by_side() -> None:
    row = {
        "sqlite": _burst(
            2.0, 400.0, cpu_duetime_s_per_run=0.004, cpu_s_by_role={"local": 1.0}, runs_started=1000
        ),
        "moto": _burst(80.0, 12.0, cpu_moto_s_per_run=0.07, pss_mb=650.0),
        "apscheduler3": _burst(1.0, 800.0, cpu_s_per_run=0.001, completed=True),
    }
    rows = {r[0]: r[1:] for r in cli.lag_rows(row)}
    assert rows["p99 lag s"] == [2.0, 80.0, 1.0]
    assert rows["CPU ms/run (scheduler)"] == [4.0, None, 1.0]
    assert rows["  of which duetime local"] == [1.0, None, None]
    assert rows["CPU ms/run (moto)"] == [None, 70.0, None]
    assert rows["PSS MB at end"] == [None, 650.0, None]
    assert rows["all ran"] == [None, None, "yes"]


def test_the_model_takes_the_moto_backends_bursts() -> None:
    results = {
        "cost": {
            "per_run": {"calls": {}, "gsi_wru": {}, "table_wru": {}},
            "dynamodb_wru_per_run": 1.0,
            "dynamodb_rru_per_run": 0.0,
            "usd_per_million_runs": 1.0,
        },
        "lag": {"sqlite": {"1000": _burst(2.0, 400.0)}, "moto": {"1000": _burst(80.0, 10.0, workers=2)}},
    }
    assert model.project(results)["workers"]["local_service_s_per_run"] == 0.2


def test_claims_are_read_from_the_stacks_timestamped_output() -> None:
    output = [
        "API: http://127.0.0.1:1\n",
        "980.000 tick: shard 0 claimed 9 run(s)\n",  # long before T: another burst's
        "999.500 tick: shard 0 claimed 3 run(s)\n",
        "1001.250 worker[small]: run x attempt 1 -> SUCCEEDED (exit 0)tick: shard 1 claimed 2 run(s)\n",
    ]
    assert claims_timeline(output, 1000.0) == {"claimed": 5, "claims_end_s": 1.25}
    assert claims_timeline([], 1000.0) == {"claimed": 0, "claims_end_s": None}


def test_pss_is_read_for_this_process_and_none_for_no_process() -> None:
    own = pss_kib(os.getpid())
    assert own is None or own > 1000
    assert pss_kib(2**22 + 12345) is None
