"""Stage configuration: defaults, cdk.json presets, -c overrides and the checks that fail a synth early."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import StageConfig, WorkerTierConfig, stage_from_context

CDK_JSON = Path(__file__).resolve().parents[2] / "cdk.json"

pytestmark = pytest.mark.infra


def context(**values: Any) -> Any:
    return lambda key: values.get(key)


def test_without_context_the_stage_is_dev_with_defaults() -> None:
    config = stage_from_context(context())

    assert config == StageConfig(name="dev")
    assert config.authorizer == "iam"


def test_a_preset_overlays_the_defaults_one_tier_at_a_time() -> None:
    presets = {"prod": {"shard_count": 16, "workers": {"large": {"max_tasks": 7}}}}

    config = stage_from_context(context(stage="prod", stages=presets))

    assert config.shard_count == 16
    assert config.workers["large"].max_tasks == 7
    assert config.workers["large"].cpu == StageConfig().workers["large"].cpu
    assert config.workers["small"] == StageConfig().workers["small"]


def test_a_context_override_beats_the_preset() -> None:
    get = context(stage="prod", stages={"prod": {"shard_count": 16}}, **{"duetime:shard_count": "8"})

    assert stage_from_context(get).shard_count == 8


def test_an_unknown_stage_name_gets_the_defaults_under_its_own_name() -> None:
    config = stage_from_context(context(stage="alice"))

    assert config.name == "alice"
    assert config.shard_count == StageConfig().shard_count


def test_cdk_json_presets_are_valid_stages() -> None:
    ctx = json.loads(CDK_JSON.read_text())["context"]

    for name in ctx["stages"]:
        assert stage_from_context(context(stage=name, stages=ctx["stages"])).name == name


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shard_count": 0}, "shard_count"),
        ({"log_retention_days": 10}, "log_retention_days"),
        ({"authorizer": "jwt"}, "jwt_issuer"),
        ({"name": "has space"}, "name"),
        (
            {"workers": {"small": {"cpu": 256, "memory_mib": 512, "min_tasks": 1, "max_tasks": 1}}},
            "exactly the tiers",
        ),
    ],
)
def test_bad_stage_settings_are_rejected_naming_the_setting(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        StageConfig.model_validate({**StageConfig().model_dump(), **change})


def test_fargate_refuses_sizes_it_cannot_run() -> None:
    with pytest.raises(ValidationError, match="Fargate"):
        WorkerTierConfig(cpu=256, memory_mib=4096, min_tasks=0, max_tasks=1, slots=1)
    with pytest.raises(ValidationError, match="min_tasks"):
        WorkerTierConfig(cpu=256, memory_mib=512, min_tasks=3, max_tasks=1, slots=1)


def test_the_prod_preset_warms_the_hot_tables_and_indexes_for_the_peak() -> None:
    presets = json.loads(CDK_JSON.read_text())["context"]["stages"]
    config = stage_from_context(context(stage="prod", stages=presets))
    writes = {k: v.write_units_per_second for k, v in config.warm_throughput.items()}
    assert writes == {
        "runs": 44_000,
        "runs.watchdog": 28_000,
        "jobs": 20_000,
        "jobs.due": 15_000,
        "jobs.by_tenant": 10_000,
    }
    assert stage_from_context(context(stage="dev", stages=presets)).warm_throughput == {}


@pytest.mark.parametrize(
    ("warm", "message"),
    [
        ({"runz": {"write_units_per_second": 5000}}, "names no table or index"),
        ({"runs.nosuch": {"write_units_per_second": 5000}}, "names no table or index"),
        ({"runs": {"write_units_per_second": 100}}, "greater than or equal to 4000"),
        ({"runs": {"read_units_per_second": 100}}, "greater than or equal to 12000"),
    ],
)
def test_a_warm_throughput_for_no_table_or_below_dynamodbs_floor_fails_the_synth(
    warm: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        StageConfig(warm_throughput=warm)


def test_the_hot_window_is_fractional_with_its_tiers_defaulted() -> None:
    config = StageConfig(retention_days=0.25)

    assert (config.retention_days, config.failed_run_retention_days, config.keep_last_runs) == (0.25, 90, 20)
    assert StageConfig().retention_days == 14


@pytest.mark.parametrize(
    ("lifecycle", "problem"),
    [
        ({"infrequent_access_days": 10}, "greater than or equal to 30"),
        ({"infrequent_access_days": 45, "glacier_instant_retrieval_days": 60}, "at least 30 days after"),
        (
            {"glacier_instant_retrieval_days": 90, "expiration_days": 90},
            "after glacier_instant_retrieval_days",
        ),
    ],
)
def test_a_lifecycle_s3_would_refuse_fails_the_synth(lifecycle: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        StageConfig(archive_lifecycle=lifecycle)


def test_logs_must_outlive_the_longest_hot_tier() -> None:
    with pytest.raises(ValidationError, match="log_lifecycle.expiration_days"):
        StageConfig(failed_run_retention_days=400, log_lifecycle={"expiration_days": 365})

    assert StageConfig(failed_run_retention_days=365).log_lifecycle.expiration_days == 365


def test_a_tick_of_several_processes_gets_a_vcpu_each_up_to_lambdas_six() -> None:
    # 1,769 MB per vCPU; 10,240 MB (6 vCPUs) at most; one process keeps the small function
    assert [StageConfig(tick_processes=p).tick_memory_mb for p in (1, 2, 3, 4)] == [512, 3_538, 5_307, 7_076]
    for bad in (0, 7):
        with pytest.raises(ValidationError):
            StageConfig(tick_processes=bad)
    presets = json.loads(CDK_JSON.read_text())["context"]["stages"]
    assert stage_from_context(context(stage="prod", stages=presets)).tick_processes == 4
