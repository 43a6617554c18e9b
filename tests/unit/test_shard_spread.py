"""A shard's spread: its due-index keys (DynamoDB) and the tick's processes setting. Pure, no I/O."""

from __future__ import annotations

from collections import Counter

import pytest

from duetime.adapters.aws.resources import (
    DUE_KEY_BASE,
    DUE_KEYS_PER_SHARD,
    due_key,
    due_keys,
    due_part,
    shard_of_due_key,
)
from duetime.config.settings import SettingsError, settings_from_env
from duetime.services.jobs import shard_of


def test_a_jobs_due_key_is_fixed_among_its_shards_keys_and_names_its_shard() -> None:
    for shard in (0, 5, 1023):
        for job_id in ("job-a", "job-b", "x" * 64):
            key = due_key(shard, job_id)
            assert key == due_key(shard, job_id) and key in due_keys(shard)
            assert shard_of_due_key(key) == shard
    # a legacy row's key is its shard itself, below every due key
    assert [shard_of_due_key(s) for s in (0, 7, 1023)] == [0, 7, 1023]
    assert min(due_keys(0)) == DUE_KEY_BASE > 1023


def test_one_shards_jobs_spread_over_every_due_key_even_when_the_shard_count_divides_the_key_count() -> None:
    # Given the jobs of shard 3 of 16 (16 is a multiple of the key count: CRC-32 mod 4 is the same for all)
    jobs = [f"job-{i:05d}" for i in range(20_000) if shard_of(f"job-{i:05d}", 16) == 3]
    # Then their due keys still spread over all of the shard's keys, about evenly
    counts = Counter(due_part(j) for j in jobs)
    assert set(counts) == set(range(DUE_KEYS_PER_SHARD))
    assert max(counts.values()) < 1.15 * len(jobs) / DUE_KEYS_PER_SHARD


def _env(**more: str) -> dict[str, str]:
    return {
        "DUETIME_JOBS_TABLE": "j",
        "DUETIME_RUNS_TABLE": "r",
        "DUETIME_LOGS_BUCKET": "b",
        "DUETIME_QUEUE_URLS": '{"small": "https://sqs/q"}',
        **more,
    }


def test_tick_processes_defaults_to_one_and_is_bounded_by_a_lambdas_six_vcpus() -> None:
    assert settings_from_env(_env()).tick_processes == 1
    assert settings_from_env(_env(DUETIME_TICK_PROCESSES="4")).tick_processes == 4
    for bad in ("0", "7", "four"):
        with pytest.raises(SettingsError, match="DUETIME_TICK_PROCESSES"):
            settings_from_env(_env(DUETIME_TICK_PROCESSES=bad))
