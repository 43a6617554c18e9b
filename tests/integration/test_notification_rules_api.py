"""Notification rules over the HTTP API (the real handler on the embedded adapters): job fields, tenant
defaults, write-only secrets and their rotation, and the 400s naming the field."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from duetime.config.deps import Deps, sqlite_deps
from duetime.config.settings import Settings
from duetime.domain.clock import FixedClock
from tests.conftest import T0
from tests.helpers import call

SECRET = "0123456789abcdef"
HOOK = {"on": ["failed"], "webhook": {"url": "https://hooks.example.com/duetime", "secret": SECRET}}
JOB = {
    "name": "n",
    "task": {"kind": "container", "command": ["true"]},
    "schedule": {"expression": "rate(1 hour)"},
}


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


def _deps(tmp_path: Path, clock: FixedClock, **settings: Any) -> Deps:
    return sqlite_deps(Settings(state_dir=str(tmp_path / "state"), **settings), clock)


@pytest.fixture
def deps(tmp_path: Path, clock: FixedClock) -> Deps:
    return _deps(tmp_path, clock)


@pytest.fixture
def api(deps: Deps, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    from duetime.api.dependencies import service_deps
    from duetime.local.lambda_runtime import load_module

    module = load_module("api")
    monkeypatch.setitem(module.app.dependency_overrides, service_deps, lambda: deps)
    return module


def test_a_jobs_rules_and_fields_are_stored_and_its_secret_is_never_answered(
    api: ModuleType, deps: Deps
) -> None:
    # Given a job with the notification fields and a webhook rule
    body = {
        **JOB,
        "late_after_seconds": 30,
        "expected_duration_seconds": 600,
        "notifications": [
            HOOK,
            {"on": ["dead_lettered"], "email": ["ops@example.com"], "remind_every_seconds": 3600},
        ],
        "inherit_tenant_notifications": False,
        "mute_until": "2026-11-30T00:00:00Z",
    }
    status, job, _ = call(api, "POST", "/jobs", body)
    assert status == 201, job
    # Then the answer shows the rules with the secret as "set", and the fields as sent
    assert job["notifications"][0] == {
        "on": ["failed"],
        "webhook": {"url": "https://hooks.example.com/duetime", "secret": "set"},
    }
    assert job["notifications"][1]["email"] == ["ops@example.com"]
    assert (job["late_after_seconds"], job["expected_duration_seconds"]) == (30, 600)
    assert (job["inherit_tenant_notifications"], job["mute_until"]) == (False, "2026-11-30T00:00:00.000Z")
    # And no answer ever holds the secret, though the store has it
    _, got, _ = call(api, "GET", f"/jobs/{job['job_id']}")
    _, listing, _ = call(api, "GET", "/jobs")
    assert SECRET not in str(got) and SECRET not in str(listing) and SECRET not in str(job)
    stored = deps.store.get_job(job["job_id"])
    assert stored is not None and stored.notifications[0].webhook is not None
    assert stored.notifications[0].webhook.secret == SECRET


def test_a_patch_sending_set_keeps_the_secret_and_a_new_one_rotates_it(
    api: ModuleType, deps: Deps, clock: FixedClock
) -> None:
    _, job, _ = call(api, "POST", "/jobs", {**JOB, "notifications": [HOOK]})
    job_id = job["job_id"]
    # When the rules read back are sent again ("secret": "set") with another event
    shown = job["notifications"][0]
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job_id}", {"notifications": [{**shown, "on": ["failed", "recovered"]}]}
    )
    assert status == 200, patched
    # Then the stored secret is kept
    stored = deps.store.get_job(job_id)
    assert stored is not None and stored.notifications[0].webhook is not None
    assert stored.notifications[0].webhook.secret == SECRET
    assert stored.notifications[0].on == ["failed", "recovered"]
    # When a new secret is sent for the same URL
    clock.advance(60)
    new = {"on": ["failed"], "webhook": {"url": HOOK["webhook"]["url"], "secret": "fedcba9876543210"}}
    status, patched, _ = call(api, "PATCH", f"/jobs/{job_id}", {"notifications": [new]})
    assert status == 200, patched
    # Then both sign deliveries for 24 h (the answer shows the rotation, never either secret)
    hook = deps.store.get_job(job_id).notifications[0].webhook  # type: ignore[union-attr]
    assert hook is not None
    assert hook.secrets(clock.now()) == ["fedcba9876543210", SECRET]
    assert hook.secrets(clock.now() + __import__("datetime").timedelta(hours=24, seconds=1)) == [
        "fedcba9876543210"
    ]
    assert patched["notifications"][0]["webhook"] == {
        "url": HOOK["webhook"]["url"],
        "secret": "set",
        "previous_secret": "set",
        "previous_valid_until": "2026-11-30T12:01:00.000Z",
    }


@pytest.mark.parametrize(
    ("rule", "field", "words"),
    [
        ({"on": ["exploded"], "email": ["a@example.com"]}, "notifications.0.on.0", "failed"),
        (
            {"on": ["failed"], "webhook": {"url": "https://h.example.com", "secret": "short"}},
            "notifications.0.webhook.secret",
            "16 bytes",
        ),
        (
            {"on": ["failed"], "webhook": {"url": "ftp://h.example.com/x", "secret": SECRET}},
            "notifications.0.webhook.url",
            "https",
        ),
        (
            {"on": ["failed"], "webhook": {"url": "http://169.254.169.254/latest", "secret": SECRET}},
            "notifications.0.webhook.url",
            "https",
        ),
        (
            {"on": ["failed"], "webhook": {"url": "https://169.254.169.254/latest", "secret": SECRET}},
            "notifications.0.webhook.url",
            "link-local",
        ),
        (
            {"on": ["failed"], "webhook": {"url": "https://[fd00:ec2::254]/", "secret": SECRET}},
            "notifications.0.webhook.url",
            "metadata",
        ),
        (
            {"on": ["failed"], "webhook": {"url": "https://h.example.com", "secret": "set"}},
            "notifications.0.webhook.secret",
            "no secret is stored",
        ),
        ({"on": ["failed"], "sns_topic_arn": "not-an-arn"}, "notifications.0.sns_topic_arn", "pattern"),
        ({"on": ["failed"]}, "notifications.0", "exactly one"),
        ({"on": ["failed"], "email": ["not an address"]}, "notifications.0.email.0", "email"),
        ({"on": ["failed", "failed"], "email": ["a@example.com"]}, "notifications.0.on", "twice"),
        (
            {"on": ["failed"], "email": ["a@example.com"], "remind_every_seconds": 5},
            "notifications.0.remind_every_seconds",
            "60",
        ),
    ],
)
def test_a_bad_rule_is_a_400_naming_its_field(
    api: ModuleType, rule: dict[str, Any], field: str, words: str
) -> None:
    for method, path, body in (
        ("POST", "/jobs", {**JOB, "notifications": [rule]}),
        ("PUT", "/tenants/me/notifications", {"notifications": [rule]}),
    ):
        status, answer, _ = call(api, method, path, body)
        assert status == 400, (method, answer)
        assert answer["error"]["field"] == field, answer
        assert words in answer["error"]["message"], answer


def test_on_aws_private_and_loopback_webhooks_are_refused_and_plain_http_is(
    tmp_path: Path, clock: FixedClock
) -> None:
    from duetime.domain.errors import RequestFieldError
    from duetime.domain.models import NotificationRule
    from duetime.services.notifier import prepare_rules

    aws_like = _deps(tmp_path, clock)
    aws_like.settings = aws_like.settings.model_copy(update={"state_dir": None, "jobs_table": "j"})
    for url in (
        "https://10.0.0.5/h",
        "https://192.168.1.1/h",
        "https://127.0.0.1/h",
        "http://127.0.0.1:8080/h",
        "https://localhost/h",
        "http://example.com/h",
    ):
        rule = NotificationRule.model_validate({"on": ["failed"], "webhook": {"url": url, "secret": SECRET}})
        with pytest.raises(RequestFieldError) as caught:
            prepare_rules([], [rule], field="notifications", deps=aws_like)
        assert caught.value.field == "notifications.0.webhook.url", url
    # And on the local stack plain http to loopback is fine, to another host not
    local = _deps(tmp_path / "l", clock)
    ok = NotificationRule.model_validate(
        {"on": ["failed"], "webhook": {"url": "http://127.0.0.1:9/h", "secret": SECRET}}
    )
    assert prepare_rules([], [ok], field="notifications", deps=local)[0].webhook.url == "http://127.0.0.1:9/h"  # type: ignore[union-attr]
    bad = NotificationRule.model_validate(
        {"on": ["failed"], "webhook": {"url": "http://example.com/h", "secret": SECRET}}
    )
    with pytest.raises(RequestFieldError):
        prepare_rules([], [bad], field="notifications", deps=local)


def test_tenant_defaults_are_replaced_whole_and_read_back_without_secrets(
    api: ModuleType, deps: Deps
) -> None:
    status, empty, _ = call(api, "GET", "/tenants/me/notifications")
    assert (status, empty["notifications"], empty["updated_at"]) == (200, [], None)
    status, put, _ = call(api, "PUT", "/tenants/me/notifications", {"notifications": [HOOK]})
    assert status == 200, put
    assert put["notifications"][0]["webhook"]["secret"] == "set"
    status, got, _ = call(api, "GET", "/tenants/me/notifications")
    assert got["notifications"] == put["notifications"] and got["updated_at"] == "2026-11-29T12:00:00.000Z"
    assert SECRET not in str(got)
    # Another tenant sees none of them
    _, other, _ = call(api, "GET", "/tenants/me/notifications", tenant="someone-else")
    assert other["notifications"] == [] and other["tenant"] == "someone-else"


def test_a_request_cannot_set_the_rotation_fields_itself(api: ModuleType) -> None:
    rule = {"on": ["failed"], "webhook": {**HOOK["webhook"], "previous_secret": "x" * 16}}
    status, answer, _ = call(api, "POST", "/jobs", {**JOB, "notifications": [rule]})
    assert status == 400 and answer["error"]["field"] == "notifications", answer


def test_deliveries_of_another_tenants_job_are_a_404(api: ModuleType) -> None:
    _, job, _ = call(api, "POST", "/jobs", JOB)
    status, _, _ = call(api, "GET", f"/jobs/{job['job_id']}/deliveries", tenant="someone-else")
    assert status == 404
    status, page, _ = call(api, "GET", f"/jobs/{job['job_id']}/deliveries")
    assert (status, page) == (200, {"events": [], "next_token": None})
    status, answer, _ = call(api, "GET", f"/jobs/{job['job_id']}/deliveries", query={"next_token": "garbage"})
    assert status == 400 and answer["error"]["field"] == "next_token"


def test_a_topic_of_another_account_is_a_400_naming_it_and_one_of_this_account_is_kept(
    api: ModuleType, deps: Deps
) -> None:
    # Given a deployment in account 111122223333 (the stack sets DUETIME_AWS_ACCOUNT_ID)
    deps.settings = deps.settings.model_copy(update={"aws_account_id": "111122223333"})
    theirs = {"on": ["failed"], "sns_topic_arn": "arn:aws:sns:us-east-1:999988887777:alerts"}
    ours = {"on": ["failed"], "sns_topic_arn": "arn:aws:sns:us-east-1:111122223333:alerts"}
    for method, path, key in (("POST", "/jobs", "notifications"), ("PUT", "/tenants/me/notifications", None)):
        body = {**JOB, "notifications": [ours, theirs]} if key else {"notifications": [ours, theirs]}
        status, answer, _ = call(api, method, path, body)
        assert (status, answer["error"]["field"]) == (400, "notifications.1.sns_topic_arn"), answer
        assert "111122223333" in answer["error"]["message"]
        status, answer, _ = call(api, method, path, {**body, "notifications": [ours]})
        assert status in (200, 201), answer
        assert answer["notifications"] == [ours]
