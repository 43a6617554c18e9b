"""The capacity-mode prices of the scale model: on-demand against provisioned capacity sized three ways, at
100M runs a day with a 12K starts/s peak one minute an hour (``bench/capacity.py``)."""

from __future__ import annotations

import pytest

from bench import capacity


def test_the_load_shape_keeps_the_days_total() -> None:
    shape = capacity.load_shape()
    peak_runs = 24 * 60 * 12_000
    assert shape["base_runs_per_s"] * (86400 - 24 * 60) + peak_runs == pytest.approx(100_000_000)
    assert shape["base_runs_per_s"] == pytest.approx(973.6, abs=0.1)


def test_each_mode_is_priced_from_the_units_per_run() -> None:
    modes = capacity.price_modes(10.0, 1.0)["modes"]
    # on demand: 100M x (10 x $0.625 + 1 x $0.125) per million
    assert modes["on_demand"]["usd_per_day"] == 638
    # the peak's 120,000 WCU and 12,000 RCU all day: 24 h x ($0.00065 x 120,000 + $0.00013 x 12,000)
    assert (modes["provisioned_for_peak"]["wcu"], modes["provisioned_for_peak"]["rcu"]) == (120_000, 12_000)
    assert modes["provisioned_for_peak"]["usd_per_day"] == 1909
    # auto scaling at 70 % of the rest of the day's 973.6 runs/s: 13,909 WCU; a full burst bucket (300 s of
    # 1,390.9 runs/s) covers 417K of one peak's 60 s x 10,609 = 637K excess runs' units
    assert modes["provisioned_autoscaling"]["wcu"] == 13_909
    assert "66%" in modes["provisioned_autoscaling"]["at_peak"]
    # burst-backed: 300 s x P >= 60 s x (12,000 - P): P = 2,000 runs/s of capacity
    assert modes["provisioned_burst_backed"]["wcu"] == 20_000
    # scheduled: the peak 5 minutes an hour, auto scaling the other 55
    scheduled = 300 / 3600 * 12_000 + 3300 / 3600 * 973.6 / 0.7
    assert modes["provisioned_scheduled"]["wcu"] == round(scheduled * 10)


def test_the_ranking_the_readme_recommends_from() -> None:
    priced = capacity.price_modes(10.12, 1.10)
    usd = {name: mode["usd_per_day"] for name, mode in priced["modes"].items()}
    # for a spiky load: only the modes that serve the peak without relying on burst capacity count
    safe = {name: usd[name] for name in ("on_demand", "provisioned_for_peak", "provisioned_scheduled")}
    assert min(safe, key=safe.__getitem__) == "provisioned_scheduled"
    assert usd["provisioned_for_peak"] > usd["on_demand"]
    # for a steady load of the same total, provisioned with auto scaling is well under on-demand
    steady = priced["steady_load_same_total"]
    assert steady["provisioned_autoscaling_usd_per_day"] < 0.5 * steady["on_demand_usd_per_day"]
