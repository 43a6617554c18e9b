"""Shared fixtures: moto in-process with fake credentials, resources from the real definitions, a fixed clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import pytest
from moto import mock_aws

from duetime.adapters.aws import clients as aws
from duetime.adapters.aws.resources import ResourceNames, create_all
from duetime.config.deps import Deps, deps_from_settings
from duetime.config.settings import Settings
from duetime.domain.clock import FixedClock
from duetime.local.stack import LOCAL_AWS_ENV

#: the simulation's markers and its end-of-session summary (seeds run, faults injected by kind)
pytest_plugins = ["tests.sim.report"]

#: A Sunday noon, UTC: the fixed "now" of integration tests.
T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@contextmanager
def moto_env(monkeypatch: pytest.MonkeyPatch, config: dict[str, Any] | None = None) -> Iterator[None]:
    """moto's in-process mock (``config``: moto's options, e.g. executing Step Functions), started before any
    client exists, with fake credentials only and no endpoint or profile from the caller's environment."""
    for key, value in LOCAL_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws(config=config) if config else mock_aws():
        aws.reset_clients()
        yield
    aws.reset_clients()


def make_settings(names: ResourceNames, **overrides: Any) -> Settings:
    """Settings over freshly created resources (inside :func:`moto_env`): the tests' defaults, overridable."""
    urls = create_all(names)
    values: dict[str, Any] = {
        "jobs_table": names.jobs_table,
        "runs_table": names.runs_table,
        "logs_bucket": names.logs_bucket,
        "idempotency_table": names.idempotency_table,
        "queue_urls": urls,
        "shard_count": 2,
        "tick_period_seconds": 60,
        "tick_margin_seconds": 15,
        "lease_seconds": 30,
        "heartbeat_seconds": 10,
        "pending_grace_seconds": 60,
        "kill_grace_seconds": 1,
    }
    return Settings(**(values | overrides))


@pytest.fixture
def aws_mock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto's in-process mock, started before any client exists; fake credentials only."""
    with moto_env(monkeypatch):
        yield


@pytest.fixture
def names() -> ResourceNames:
    return ResourceNames.for_prefix("test")


@pytest.fixture
def settings(aws_mock: None, names: ResourceNames) -> Settings:
    return make_settings(names)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def deps(settings: Settings, clock: FixedClock) -> Deps:
    return deps_from_settings(settings, clock)


@pytest.fixture
def api(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The real ``functions/api/handler.py`` module, its app's services wired to the test's deps (moto + fixed
    clock) through Powertools' ``dependency_overrides``."""
    from duetime.api.dependencies import service_deps
    from duetime.local.lambda_runtime import load_module

    module = load_module("api")
    monkeypatch.setitem(module.app.dependency_overrides, service_deps, lambda: deps)
    return module
