"""Notifications end to end: the real local stack (embedded backend) delivers webhooks to a real HTTP
receiver on loopback: one dead_lettered per failing run, signed; one recovered after a fix; every event
after a receiver outage, none twice; a muted job's events listed, nothing sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from duetime.domain.notifications import verify_signature
from tests.e2e.conftest import FAST, Stack, start_stack, stop_stack
from tests.receiver import Receiver

pytestmark = pytest.mark.e2e

SECRET = "e2e-secret-0123456789"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tmp_path_factory.mktemp("notify"), *FAST, "--notify-max-backoff-seconds", "1")
    yield s
    stop_stack(s)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver().up()
    yield hook
    hook.down()


def _job(receiver: Receiver, command: str, events: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "name": "notified",
        "task": {"kind": "container", "command": ["sh", "-c", command]},
        "retry": {"max_attempts": 3, "backoff_seconds": 1, "jitter": "none"},
        "notifications": [{"on": events, "webhook": {"url": receiver.url, "secret": SECRET}}],
        **extra,
    }


def _wait(what: str, check: Any, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"never happened: {what}")


def _of(receiver: Receiver, job_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in receiver.events() if e["job_id"] == job_id and (kind is None or e["type"] == kind)]


def test_a_run_failing_3_attempts_sends_one_signed_dead_lettered_then_one_recovered_after_a_fix(
    stack: Stack, receiver: Receiver
) -> None:
    # Given a run-now job whose 3 attempts fail, with a rule on dead_lettered and recovered
    status, job = stack.request("POST", "/jobs", _job(receiver, "exit 4", ["dead_lettered", "recovered"]))
    assert status == 201, job
    job_id = job["job_id"]
    stack.wait_run(job_id, {"FAILED"})
    # Then exactly one dead_lettered delivery comes, signed with the secret
    _wait("the dead_lettered delivery", lambda: _of(receiver, job_id, "dead_lettered"))
    time.sleep(2)  # nothing else is coming
    [got] = [r for r in receiver.received if r.json["job_id"] == job_id]
    assert got.json["type"] == "dead_lettered" and got.json["attempt"] == 3 and got.json["state"] == "FAILED"
    assert verify_signature(got.headers["duetime-signature"], got.body, SECRET, now=int(time.time()))
    # When its command is fixed and it is triggered
    status, _ = stack.request(
        "PATCH", f"/jobs/{job_id}", {"task": {"kind": "container", "command": ["true"]}}
    )
    assert status == 200
    status, run = stack.request("POST", f"/jobs/{job_id}/trigger")
    assert status == 202, run
    # Then exactly one recovered comes, for the triggered run
    _wait("the recovered delivery", lambda: _of(receiver, job_id, "recovered"))
    time.sleep(2)
    assert [e["type"] for e in _of(receiver, job_id)] == ["dead_lettered", "recovered"]
    assert _of(receiver, job_id, "recovered")[0]["run_id"] == run["run_id"]
    # And the deliveries listing shows both, delivered
    status, page = stack.request("GET", f"/jobs/{job_id}/deliveries")
    assert status == 200
    sent = {e["type"]: e["deliveries"][0]["status"] for e in page["events"] if e["deliveries"]}
    assert sent == {"dead_lettered": "delivered", "recovered": "delivered"}


def test_a_receiver_down_gets_every_event_afterwards_and_no_event_twice(
    stack: Stack, receiver: Receiver
) -> None:
    # Given the receiver down while two jobs fail every attempt (3 failed + 1 dead_lettered each)
    receiver.down()
    ids = []
    for _ in range(2):
        status, job = stack.request("POST", "/jobs", _job(receiver, "exit 1", ["failed", "dead_lettered"]))
        assert status == 201
        ids.append(job["job_id"])
    for job_id in ids:
        stack.wait_run(job_id, {"FAILED"})
    time.sleep(8)  # tries refused meanwhile (1 s apart at most)
    status, page = stack.request("GET", f"/jobs/{ids[0]}/deliveries")
    pending = [d for e in page["events"] for d in e["deliveries"]]
    assert pending and all(d["status"] == "pending" and d["tries"] >= 2 for d in pending), page
    # When it comes back on its port
    receiver.up()
    # Then it gets each job's events (the first failed alerted, the streak's other attempts suppressed)
    _wait("every delivery", lambda: all(len(_of(receiver, j)) == 2 for j in ids))
    time.sleep(2)
    got = [e for e in receiver.events() if e["job_id"] in ids]
    assert sorted((e["job_id"], e["type"]) for e in got) == sorted(
        (j, t) for j in ids for t in ("dead_lettered", "failed")
    )
    assert len({e["event_id"] for e in got}) == len(got) == 4


def test_a_muted_job_sends_nothing_and_its_events_are_listed(stack: Stack, receiver: Receiver) -> None:
    # Given a failing job muted for an hour
    until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    status, job = stack.request(
        "POST", "/jobs", _job(receiver, "exit 5", ["failed", "dead_lettered"], mute_until=until)
    )
    assert status == 201, job
    job_id = job["job_id"]
    stack.wait_run(job_id, {"FAILED"})

    # Then its events are recorded and listed as muted, with no deliveries
    def listed() -> list[dict[str, Any]]:
        page = stack.request("GET", f"/jobs/{job_id}/deliveries")[1]
        return page["events"] if len(page["events"]) == 4 else []

    events = _wait("the muted events", listed)
    assert sorted(e["type"] for e in events) == ["dead_lettered", "failed", "failed", "failed"]
    assert {e["notified"] for e in events} == {"muted"} and all(e["deliveries"] == [] for e in events)
    time.sleep(2)
    assert _of(receiver, job_id) == []


def test_the_cli_lists_a_jobs_deliveries(stack: Stack, receiver: Receiver, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    status, job = stack.request("POST", "/jobs", _job(receiver, "exit 1", ["dead_lettered"]))
    job_id = job["job_id"]
    _wait("the delivery", lambda: _of(receiver, job_id, "dead_lettered"))
    out = subprocess.run(
        [sys.executable, "-m", "duetime", "--api", stack.api, "jobs", "deliveries", job_id, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    page = json.loads(out)
    [dead] = [e for e in page["events"] if e["type"] == "dead_lettered"]
    assert dead["deliveries"][0]["status"] == "delivered" and dead["deliveries"][0]["target"] == receiver.url
    table = subprocess.run(
        [sys.executable, "-m", "duetime", "--api", stack.api, "jobs", "deliveries", job_id],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "dead_lettered" in table and "delivered" in table


def test_a_sleep_30_job_queued_behind_busy_workers_is_late_and_the_busy_one_overran(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> None:
    # Given a stack with one task slot for the small tier
    busy = start_stack(
        tmp_path_factory.mktemp("late"),
        "--tick-seconds",
        "1",
        "--workers",
        "1",
        "--slots",
        "1",
        "--notify-max-backoff-seconds",
        "1",
    )
    try:
        # And a `sleep 30` job holding it, expected to take 2 s
        rule = {"webhook": {"url": receiver.url, "secret": SECRET}}
        status, blocker = busy.request(
            "POST",
            "/jobs",
            {
                "name": "blocker",
                "task": {"kind": "container", "command": ["sleep", "30"]},
                "expected_duration_seconds": 2,
                "notifications": [{"on": ["overran"], **rule}],
            },
        )
        assert status == 201, blocker
        busy.wait_run(blocker["job_id"], {"RUNNING"})
        # When a `sleep 30` job with late_after_seconds 5 is queued behind it
        status, job = busy.request(
            "POST",
            "/jobs",
            {
                "name": "queued",
                "task": {"kind": "container", "command": ["sleep", "30"]},
                "late_after_seconds": 5,
                "notifications": [{"on": ["late"], **rule}],
            },
        )
        assert status == 201, job
        submitted = time.monotonic()
        # Then it is late about 5 s after its due time, still PENDING
        [late] = _wait("the late delivery", lambda: _of(receiver, job["job_id"], "late"), timeout=30)
        assert 4.0 <= time.monotonic() - submitted <= 15.0
        assert (late["state"], late["attempt"]) == ("PENDING", 1)
        # And the blocker overran its expected 2 s, once
        [overran] = _wait("the overran delivery", lambda: _of(receiver, blocker["job_id"], "overran"))
        assert overran["state"] == "RUNNING" and overran["started_at"] is not None
        time.sleep(3)
        assert len(_of(receiver, blocker["job_id"])) == 1 and len(_of(receiver, job["job_id"])) == 1
        status, run = busy.request("GET", f"/runs/{late['run_id']}")
        assert run["state"] == "PENDING" and [e["kind"] for e in run["events"]].count("late") == 1
    finally:
        stop_stack(busy)
