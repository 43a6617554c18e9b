"""GET /jobs/{id}/slots: every expected fire time of a job's schedule with what became of it, through the
real API handler on moto with a fixed clock; and GET /jobs/{id}'s lag figures."""

from __future__ import annotations

import base64
from types import ModuleType
from typing import Any

from duetime.domain.lifecycle import message_for
from duetime.domain.models import RunState
from duetime.services import claims, runs
from duetime.services.deps import Deps
from tests.helpers import call

WINDOW = {"since": "2026-11-29T11:00:00Z", "until": "2026-11-29T12:10:00Z"}
RATE = {
    "name": "every-minute",
    "schedule": {"expression": "rate(1 minute)", "timezone": "UTC"},
    "task": {"kind": "container", "command": ["true"]},
}


def _tick(deps: Deps) -> None:
    for shard in range(deps.settings.shard_count):
        claims.tick(shard, deps)


def _run_due(deps: Deps, job_id: str, due: str, outcome: RunState = RunState.SUCCEEDED) -> None:
    """A worker starts the job's PENDING run due at ``due`` (HH:MM) now and ends it with ``outcome``."""
    [run] = [r for r in deps.store.list_runs(job_id, limit=50) if r.due_at.strftime("%H:%M") == due]
    started = runs.start(message_for(run), deps, owner="w1")
    runs.finish(started, deps, fencing_token=started.fencing_token, outcome=outcome)


def _slots(api: ModuleType, job_id: str, **query: Any) -> list[tuple[str, str, str | None]]:
    status, body, _ = call(api, "GET", f"/jobs/{job_id}/slots", query={**WINDOW, **query})
    assert status == 200, body
    return [(s["due_at"][11:16], s["outcome"], s["reason"] or s["state"]) for s in body["slots"]]


def test_slots_say_which_fires_ran_were_skipped_by_a_pause_missed_are_pending_or_upcoming(
    api: ModuleType, deps: Deps, clock: Any
) -> None:
    # Given a rate(1 minute) job submitted at 12:00 (its first slot 12:01, claimed at submit)
    _, job, _ = call(api, "POST", "/jobs", RATE)
    job_id = job["job_id"]
    # 12:01 runs half a second late and fails; 12:02 (claimed by the tick) succeeds 2 s late
    clock.advance(60.5)
    _run_due(deps, job_id, "12:01", RunState.FAILED)
    _tick(deps)
    clock.advance(61.5)
    _run_due(deps, job_id, "12:02")
    # the job is paused at 12:02:30 for two and a half minutes: 12:03 (claimed ahead) and 12:04 fall in it
    _tick(deps)
    clock.advance(28)
    assert call(api, "POST", f"/jobs/{job_id}/pause")[0] == 200
    clock.advance(150)
    assert call(api, "POST", f"/jobs/{job_id}/resume")[0] == 200
    _tick(deps)
    # When its slots are read at 12:05:00 (window 11:00 to 12:10)
    assert clock.now().strftime("%H:%M:%S") == "12:05:00"
    slots = _slots(api, job_id)
    # Then every minute from 12:01 to 12:10 is there, newest first, none before the job existed (12:00)
    assert slots == [
        ("12:10", "upcoming", None),
        ("12:09", "upcoming", None),
        ("12:08", "upcoming", None),
        ("12:07", "upcoming", None),
        ("12:06", "pending", "PENDING"),  # claimed ahead by the tick
        ("12:05", "pending", "PENDING"),  # due now: the resume's catch-up (latest) runs the newest slot
        ("12:04", "skipped", "paused"),  # due while paused, never claimed: dropped by the catch-up policy
        ("12:03", "skipped", "paused"),  # claimed before the pause, held, then skipped at the resume
        ("12:02", "ran", "SUCCEEDED"),
        ("12:01", "ran", "RETRY_WAIT"),  # its first attempt failed, a retry waits
    ]
    # And each ran slot has its run id and lag
    query = {**WINDOW, "until": "2026-11-29T12:02:00Z"}
    status, body, _ = call(api, "GET", f"/jobs/{job_id}/slots", query=query)
    assert [(s["run_id"] is not None, s["lag_seconds"]) for s in body["slots"]] == [(True, 2.0), (True, 0.5)]
    # And GET /jobs/{id} gives the lag of the runs that started: p50 and p99 (nearest rank) of 0.5 and 2.0
    _, got, _ = call(api, "GET", f"/jobs/{job_id}")
    assert got["lag"] == {"runs": 2, "p50_seconds": 0.5, "p99_seconds": 2.0}


def test_a_slot_no_run_was_claimed_for_is_missed_and_a_schedule_change_keeps_the_old_slots(
    api: ModuleType, deps: Deps, clock: Any
) -> None:
    # Given a rate(1 minute) job whose 12:01 ran, then nothing ticked for three minutes (an outage)
    _, job, _ = call(api, "POST", "/jobs", RATE)
    job_id = job["job_id"]
    clock.advance(61)
    _run_due(deps, job_id, "12:01")
    clock.advance(180)  # 12:04:01: 12:02 and 12:03 never got a run
    # When its schedule changes to rate(5 minutes) at 12:04:01 (the tick then claims by the new one)
    status, changed, _ = call(
        api, "PATCH", f"/jobs/{job_id}", {"schedule": {"expression": "rate(5 minutes)", "timezone": "UTC"}}
    )
    assert status == 200, changed
    _tick(deps)
    slots = _slots(api, job_id)
    # Then the old schedule's slots are its recorded runs only (12:01 ran; 12:02 and 12:03 had none, and
    # the current schedule does not reach back past its change), and the new schedule's come after
    assert slots[-1] == ("12:01", "ran", "SUCCEEDED")
    new = [due for due, outcome, _ in slots if outcome in ("upcoming", "pending")]
    assert new and all(due > "12:04" for due in new)
    assert [due for due, _, _ in slots] == sorted((due for due, _, _ in slots), reverse=True)


def test_slots_page_newest_first_with_one_token_and_bad_input_is_a_400(api: ModuleType, clock: Any) -> None:
    _, job, _ = call(api, "POST", "/jobs", RATE)
    job_id = job["job_id"]
    seen: list[str] = []
    token = None
    while True:
        query = {**WINDOW, "limit": "4"} | ({"next_token": token} if token else {})
        status, body, _ = call(api, "GET", f"/jobs/{job_id}/slots", query=query)
        assert status == 200 and len(body["slots"]) <= 4
        seen += [s["due_at"][11:16] for s in body["slots"]]
        token = body["next_token"]
        if token is None:
            break
    assert seen == [f"12:{m:02d}" for m in range(10, 0, -1)]
    for bad, field in (
        ({"next_token": "not-a-token"}, "next_token"),
        ({"since": "2026-11-29T11:00:00"}, "since"),
        ({"limit": "0"}, "limit"),
    ):
        status, body, _ = call(api, "GET", f"/jobs/{job_id}/slots", query={**WINDOW, **bad})
        assert status == 400 and field in str(body), (bad, body)
    assert call(api, "GET", "/jobs/job-absent/slots")[0] == 404


def test_the_default_window_is_the_last_day_up_to_now_and_a_token_or_window_that_cannot_be_is_a_400(
    api: ModuleType, deps: Deps, clock: Any
) -> None:
    # Given two rate(1 minute) jobs submitted at 12:00, read at 12:05:30
    _, job, _ = call(api, "POST", "/jobs", RATE)
    _, other, _ = call(api, "POST", "/jobs", {**RATE, "name": "other"})
    clock.advance(330)
    _tick(deps)
    # When the slots are read without a window: the past only (did it run?), 12:05 back to 12:01
    status, body, _ = call(api, "GET", f"/jobs/{job['job_id']}/slots")
    assert status == 200
    assert [s["due_at"][11:16] for s in body["slots"]] == ["12:05", "12:04", "12:03", "12:02", "12:01"]
    # Then a token of another job's slots, or a window that ends before it starts, is a 400 naming the field
    _, paged, _ = call(api, "GET", f"/jobs/{job['job_id']}/slots", query={"limit": "2"})
    assert paged["next_token"]
    status, body, _ = call(
        api, "GET", f"/jobs/{other['job_id']}/slots", query={"next_token": paged["next_token"]}
    )
    assert status == 400 and body["error"]["field"] == "next_token"
    status, body, _ = call(
        api,
        "GET",
        f"/jobs/{job['job_id']}/slots",
        query={"since": "2026-11-29T12:05:00Z", "until": "2026-11-29T12:01:00Z"},
    )
    assert status == 400 and body["error"]["field"] == "until"
    # And a paused job's future slots say it is paused
    call(api, "POST", f"/jobs/{job['job_id']}/pause")
    later = _slots(api, job["job_id"], since="2026-11-29T12:07:00Z", until="2026-11-29T12:08:00Z")
    assert later == [("12:08", "upcoming", "paused"), ("12:07", "upcoming", "paused")]


def test_a_missed_slot_the_catch_up_ran_is_ran_with_its_run_not_missed(
    api: ModuleType, deps: Deps, clock: Any
) -> None:
    # Given a rate(1 minute) job with catch-up `all` whose 12:01 ran, then nothing ticked until 12:04:30
    body = {**RATE, "catch_up": {"policy": "all", "tolerance_seconds": 15}}
    _, job, _ = call(api, "POST", "/jobs", body)
    job_id = job["job_id"]
    clock.advance(61)
    _run_due(deps, job_id, "12:01")
    clock.advance(209)  # 12:04:30: 12:02, 12:03 and 12:04 are missed (more than 15 s late)
    # When the tick claims them (the older ones as backfill runs) and a worker runs 12:02's
    _tick(deps)
    backfill = {r.due_at.strftime("%H:%M"): r.trigger.value for r in deps.store.list_runs(job_id, limit=50)}
    assert backfill["12:02"] == backfill["12:03"] == "backfill"
    _run_due(deps, job_id, "12:02")
    # Then each of those slots is its catch-up run: ran or pending, with the run's id, none "missed"
    status, got, _ = call(
        api, "GET", f"/jobs/{job_id}/slots", query={**WINDOW, "until": "2026-11-29T12:04:00Z"}
    )
    assert status == 200, got
    assert [
        (s["due_at"][11:16], s["outcome"], s["state"], s["run_id"] is not None) for s in got["slots"]
    ] == [
        ("12:04", "pending", "PENDING", True),
        ("12:03", "pending", "PENDING", True),
        ("12:02", "ran", "SUCCEEDED", True),
        ("12:01", "ran", "SUCCEEDED", True),
    ]


def test_a_page_token_is_read_only_as_the_listing_spelled_it(api: ModuleType) -> None:
    # Given a job's slots paged with a token
    _, job, _ = call(api, "POST", "/jobs", RATE)
    _, paged, _ = call(api, "GET", f"/jobs/{job['job_id']}/slots", query={**WINDOW, "limit": "2"})
    token = paged["next_token"]
    kind, owner, ms = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode().split(":")
    # When the cursor is respelled with a leading zero or with Arabic-Indic digits (int() reads both)
    for spelled in ("0" + ms, ms.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))):
        forged = base64.urlsafe_b64encode(f"{kind}:{owner}:{spelled}".encode()).decode().rstrip("=")
        status, body, _ = call(
            api, "GET", f"/jobs/{job['job_id']}/slots", query={**WINDOW, "limit": "2", "next_token": forged}
        )
        # Then it is no token of this listing
        assert status == 400 and body["error"]["field"] == "next_token", (spelled, body)
