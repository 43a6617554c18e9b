"""DynamoDB capacity modes priced at the modelled load: on-demand, and provisioned capacity sized three ways.

The load shape (an assumption, named here; the seeds give the day's total and the peak): 100M runs a day,
with a top-of-the-hour peak of 12K starts/s lasting :data:`PEAK_SECONDS` each hour (cron's ``0 * * * *``
jobs of every tenant at once) and the rest spread evenly. Per run, the write and read units the ``cost``
part measured (all tables and indexes together: provisioned capacity is bought per table and per index, and
what is paid is the sum).

DynamoDB's rules used (Developer Guide, "Read/write capacity mode", "Burst capacity", "Managing throughput
capacity automatically with DynamoDB auto scaling", "Service quotas"; prices in :mod:`bench.prices`):

- On-demand serves at once up to double the table's previous peak, and at once up to its warm throughput
  (settable ahead of a known peak); it is billed per request.
- Provisioned capacity is billed per unit-hour, whatever is used. Auto scaling follows the consumed units
  toward a target utilisation (70 % here) and reacts in minutes: it cannot follow a one-minute peak.
- Burst capacity: up to 300 s of a table's unused provisioned capacity is kept (a bucket of at most 300 s
  times the provisioned rate; the 59 minutes between two hourly peaks fill it) and can be consumed above the
  provisioned rate, but DynamoDB "can also consume burst capacity for background maintenance and other
  tasks without prior notice", and each partition still serves at most 1,000 write units a second: a
  design that needs it to serve its peak can be throttled at the peak.
- Provisioned capacity can be decreased at most 4 times a day plus once in each hour without a decrease
  (27 a day), per table and per index: one scale-down after each hourly peak fits, leaving auto scaling
  about 3 decreases a day of its own. The scheduled window must end by a scheduled action that lowers the
  maximum too (target tracking alone scales in only after about 15 minutes of low use, and at a 15-minute
  window scheduled scaling costs as much as on-demand). Provisioning the peak (121K WCU) needs a raise of
  the account's provisioned-capacity quota (80,000 WCU by default, from AWS's quotas page as remembered).
"""

from __future__ import annotations

from typing import Any

from bench.prices import price

RUNS_PER_DAY = 100_000_000
PEAK_STARTS_PER_S = 12_000
#: the top-of-the-hour peak's length, seconds, once an hour (assumption)
PEAK_SECONDS = 60
#: provisioned capacity held at the peak's level around it by scheduled scaling, seconds an hour
SCHEDULED_PEAK_WINDOW_SECONDS = 300
#: auto scaling's target utilisation (the console's default)
AUTOSCALING_TARGET = 0.7
#: seconds of unused capacity DynamoDB keeps as burst capacity
BURST_SECONDS = 300
HOURS_PER_DAY = 24


def load_shape() -> dict[str, float]:
    """The modelled day: the peak rate and length, and the rate the rest of the day runs at (runs/s)."""
    peak_runs = HOURS_PER_DAY * PEAK_SECONDS * PEAK_STARTS_PER_S
    rest_seconds = 86400 - HOURS_PER_DAY * PEAK_SECONDS
    return {
        "average_runs_per_s": RUNS_PER_DAY / 86400,
        "peak_runs_per_s": PEAK_STARTS_PER_S,
        "peak_seconds_per_hour": PEAK_SECONDS,
        "base_runs_per_s": (RUNS_PER_DAY - peak_runs) / rest_seconds,
    }


def _provisioned_usd_per_day(wcu: float, rcu: float) -> float:
    return wcu * HOURS_PER_DAY * price("dynamodb_wcu_hour") + rcu * HOURS_PER_DAY * price("dynamodb_rcu_hour")


def price_modes(wru_per_run: float, rru_per_run: float) -> dict[str, Any]:
    """USD per day of DynamoDB throughput (storage apart) in each capacity mode at the modelled load.

    Args:
        wru_per_run, rru_per_run: write and read units per run (the cost part's, all tables and indexes).

    Returns:
        ``{"load": ..., "modes": {name: {"usd_per_day", "wcu", "rcu", "at_peak", "note"}}, "recommended"}``:
        ``wcu``/``rcu`` the provisioned units (average over the day for scheduled scaling; None on-demand).
    """
    shape = load_shape()
    peak, base, avg = shape["peak_runs_per_s"], shape["base_runs_per_s"], shape["average_runs_per_s"]
    on_demand = RUNS_PER_DAY * (wru_per_run * price("dynamodb_wru") + rru_per_run * price("dynamodb_rru"))
    modes: dict[str, dict[str, Any]] = {
        "on_demand": {
            "usd_per_day": round(on_demand),
            "wcu": None,
            "rcu": None,
            "at_peak": "served, up to the table's warm throughput (set it to the peak ahead: the CDK prod stage does)",
            "note": "per request; no capacity to plan",
        }
    }
    # provisioned for the peak all day: never throttled, mostly idle
    wcu, rcu = peak * wru_per_run, peak * rru_per_run
    modes["provisioned_for_peak"] = {
        "usd_per_day": round(_provisioned_usd_per_day(wcu, rcu)),
        "wcu": round(wcu),
        "rcu": round(rcu),
        "at_peak": "served",
        "note": "the peak's capacity all day",
    }
    # auto scaling on the rest of the day; the peak left to burst capacity. The hour between peaks fills the
    # bucket to its cap, 300 s x P, which must cover one peak's excess, 60 s x (peak - P): P = 60 peak / 360
    # (an unsound design: burst capacity is not guaranteed)
    units_per_run_s = PEAK_SECONDS * peak / (PEAK_SECONDS + BURST_SECONDS)
    autoscaled = base / AUTOSCALING_TARGET
    covered = min(1.0, BURST_SECONDS * autoscaled / (PEAK_SECONDS * (peak - autoscaled)))
    modes["provisioned_autoscaling"] = {
        "usd_per_day": round(_provisioned_usd_per_day(autoscaled * wru_per_run, autoscaled * rru_per_run)),
        "wcu": round(autoscaled * wru_per_run),
        "rcu": round(autoscaled * rru_per_run),
        "at_peak": f"throttled: burst capacity covers at most {covered:.0%} of the peak's excess",
        "note": f"auto scaling at {AUTOSCALING_TARGET:.0%} of the rest of the day's rate; too slow for a 1-minute peak",
    }
    modes["provisioned_burst_backed"] = {
        "usd_per_day": round(
            _provisioned_usd_per_day(units_per_run_s * wru_per_run, units_per_run_s * rru_per_run)
        ),
        "wcu": round(units_per_run_s * wru_per_run),
        "rcu": round(units_per_run_s * rru_per_run),
        "at_peak": "served only while DynamoDB leaves the burst capacity unused (not guaranteed)",
        "note": f"provisioned so that a full bucket ({BURST_SECONDS} s of capacity) covers one peak's excess",
    }
    # scheduled scaling: the peak's capacity for a window around each top of the hour, auto scaling's the rest
    window = SCHEDULED_PEAK_WINDOW_SECONDS / 3600
    mean_runs_s = window * peak + (1 - window) * autoscaled
    modes["provisioned_scheduled"] = {
        "usd_per_day": round(_provisioned_usd_per_day(mean_runs_s * wru_per_run, mean_runs_s * rru_per_run)),
        "wcu": round(mean_runs_s * wru_per_run),
        "rcu": round(mean_runs_s * rru_per_run),
        "at_peak": "served, if the scale-up is in place before the peak (warm throughput at the peak's level)",
        "note": (
            f"the peak's capacity {SCHEDULED_PEAK_WINDOW_SECONDS // 60} minutes around each top of the hour "
            "(one scale-down an hour: within DynamoDB's 27 a day), auto scaling the rest"
        ),
    }
    # a steady load of the same total, for the comparison the README's recommendation rests on
    steady = avg / AUTOSCALING_TARGET
    steady_usd = _provisioned_usd_per_day(steady * wru_per_run, steady * rru_per_run)
    return {
        "load": {k: round(v, 1) for k, v in shape.items()},
        "units_per_run": {"wru": wru_per_run, "rru": rru_per_run},
        "modes": modes,
        "steady_load_same_total": {
            "on_demand_usd_per_day": round(on_demand),
            "provisioned_autoscaling_usd_per_day": round(steady_usd),
        },
        "recommended": {
            "spiky, peaks at unknown times": "on_demand (warm throughput set to the expected peak)",
            "spiky, peaks at known times (top of the hour)": "provisioned_scheduled",
            "steady (peak under twice the average)": "provisioned with auto scaling",
        },
    }
