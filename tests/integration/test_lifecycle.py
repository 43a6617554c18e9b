"""Job lifecycle and listing through the API handler: PATCH, pause/resume, trigger, delete, cancel, paging."""

from __future__ import annotations

from datetime import timedelta
from types import ModuleType

import pytest

from duetime.services import claims
from duetime.services.worker import Worker
from tests.conftest import T0
from tests.helpers import call, drain

EVERY_5 = {
    "name": "five",
    "schedule": {"expression": "rate(5 minutes)"},
    "task": {"kind": "container", "command": ["true"]},
}


def _runs(api: ModuleType, job_id: str, **query) -> list[dict]:
    status, body, _ = call(api, "GET", f"/jobs/{job_id}/runs", query={k: str(v) for k, v in query.items()})
    assert status == 200, body
    return body["runs"]


def test_a_job_shows_its_next_fire_times_and_last_run(api: ModuleType, deps) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    assert job["next_fire_times"] == [
        "2026-11-29T12:05:00.000Z",
        "2026-11-29T12:10:00.000Z",
        "2026-11-29T12:15:00.000Z",
    ]
    assert job["last_run"] is None
    status, now_job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": None})
    Worker(deps, "small", owner="w").poll_once()
    _, got, _ = call(api, "GET", f"/jobs/{now_job['job_id']}")
    assert got["last_run"]["state"] == "SUCCEEDED" and got["next_fire_times"] == []


def test_pause_leaves_the_due_index_and_resume_catches_up_once(api: ModuleType, deps, clock) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    status, paused, _ = call(api, "POST", f"/jobs/{job['job_id']}/pause")
    assert status == 200 and paused["state"] == "PAUSED" and paused["next_fire_at"] is None
    # While paused for an hour, ticks claim nothing
    clock.advance(3600)
    assert claims.tick(deps.store.get_job(job["job_id"]).shard, deps).claimed == 0
    assert _runs(api, job["job_id"]) == []
    # On resume the catch-up policy (latest) runs the most recent missed slot once, now
    status, resumed, _ = call(api, "POST", f"/jobs/{job['job_id']}/resume")
    assert status == 200 and resumed["state"] == "ACTIVE"
    [run] = _runs(api, job["job_id"])
    assert run["due_at"] == "2026-11-29T13:00:00.000Z" and run["missed_slots"] == 11
    assert resumed["next_fire_at"] == "2026-11-29T13:05:00.000Z"


@pytest.mark.parametrize(
    ("expression", "kept"),
    [
        # every minute from the submission at 12:00: 12:05 is a slot of both schedules, so its run stays
        ("rate(1 minute)", True),
        # every 7 minutes from 12:00 (12:07, 12:14...): 12:05 is not a slot any more
        ("rate(7 minutes)", False),
    ],
)
def test_patching_the_schedule_keeps_a_shared_claimed_slot_and_ends_the_others(
    api, deps, clock, expression: str, kept: bool
) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    clock.advance(270)
    claims.tick(deps.store.get_job(job["job_id"]).shard, deps)  # claims 12:05
    # When the schedule changes at 12:04:30 (a rate still counts from the job's submission)
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": {"expression": expression}}
    )
    assert status == 200, patched
    assert patched["version"] == 2
    # Then the run claimed at 12:05 exists once: it stays if the new schedule fires then too, else it ended
    # SKIPPED (schedule_changed); the new schedule goes on from its next slot
    found = {r["due_at"]: r for r in _runs(api, job["job_id"])}
    old = found["2026-11-29T12:05:00.000Z"]
    if kept:
        assert (old["state"], old["error"]) == ("PENDING", None)
    else:
        assert (old["state"], old["error"]) == ("SKIPPED", "schedule_changed")
        assert patched["next_fire_at"] == "2026-11-29T12:07:00.000Z"


def test_sending_the_schedule_a_job_already_has_changes_nothing(api: ModuleType, deps, clock) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    clock.advance(270)
    claims.tick(deps.store.get_job(job["job_id"]).shard, deps)  # claims 12:05
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": {"expression": "rate(5 minutes)"}}
    )
    assert status == 200 and patched["next_fire_at"] == job["next_fire_at"].replace("12:05", "12:10")
    [run] = _runs(api, job["job_id"])
    assert (run["due_at"], run["state"]) == ("2026-11-29T12:05:00.000Z", "PENDING")


def test_patch_refuses_bad_fields_and_unknown_jobs(api: ModuleType) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    status, body, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": {"expression": "0 0 30 2 *"}})
    assert status == 400 and body["error"]["field"] == "schedule.expression"
    status, body, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"colour": "red"})
    assert status == 400 and body["error"]["field"] == "colour"
    assert call(api, "PATCH", "/jobs/job-nope", {"name": "x"})[0] == 404


def test_trigger_makes_a_manual_run_now(api: ModuleType, deps) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    status, run, headers = call(api, "POST", f"/jobs/{job['job_id']}/trigger")
    assert status == 202 and run["trigger"] == "manual" and run["due_at"] == "2026-11-29T12:00:00.000Z"
    Worker(deps, "small", owner="w").poll_once()
    assert call(api, "GET", headers["location"])[1]["state"] == "SUCCEEDED"


def test_delete_with_cancel_running_cancels_in_flight_runs(api: ModuleType, deps) -> None:
    _, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": {"expression": "rate(20 seconds)"}})
    assert len(_runs(api, job["job_id"])) == 3  # 12:00:20, :40, 12:01:00 claimed in the lookahead
    status, deleted, _ = call(api, "DELETE", f"/jobs/{job['job_id']}", query={"cancel_running": "true"})
    assert status == 200 and deleted["state"] == "DELETED" and deleted["next_fire_at"] is None
    assert {r["state"] for r in _runs(api, job["job_id"])} == {"CANCELLED"}
    # deleted jobs leave the default listing but stay readable
    listed = call(api, "GET", "/jobs")[1]["jobs"]
    assert job["job_id"] not in [j["job_id"] for j in listed]
    assert call(api, "GET", "/jobs", query={"state": "DELETED"})[1]["jobs"][0]["job_id"] == job["job_id"]
    assert call(api, "POST", f"/jobs/{job['job_id']}/trigger")[0] == 409


def test_cancel_a_pending_run_so_it_never_starts(api: ModuleType, deps) -> None:
    _, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": None})
    [run] = _runs(api, job["job_id"])
    status, cancelled, _ = call(api, "POST", f"/runs/{run['run_id']}/cancel")
    assert status == 200 and cancelled["state"] == "CANCELLED"
    assert Worker(deps, "small", owner="w").poll_once() == 1  # the message arrives and is dropped
    assert _runs(api, job["job_id"])[0]["state"] == "CANCELLED"
    assert call(api, "POST", f"/runs/{run['run_id']}/cancel")[0] == 409


def test_listing_pages_with_opaque_tokens_in_a_stable_order(api: ModuleType, clock) -> None:
    ids = []
    for i in range(7):
        clock.advance(1)
        ids.append(call(api, "POST", "/jobs", {**EVERY_5, "name": f"batch-{i}"})[1]["job_id"])
    call(api, "POST", "/jobs", {**EVERY_5, "name": "other"})
    seen, token = [], None
    while True:
        query = {"limit": "3", "name_prefix": "batch-"}
        if token:
            query["next_token"] = token
        status, page, _ = call(api, "GET", "/jobs", query=query)
        assert status == 200 and len(page["jobs"]) <= 3
        seen += [j["job_id"] for j in page["jobs"]]
        token = page["next_token"]
        if token is None:
            break
    assert seen == list(reversed(ids))  # newest first, each once
    status, body, _ = call(api, "GET", "/jobs", query={"next_token": "garbage"})
    assert status == 400 and body["error"]["field"] == "next_token"


def test_runs_filter_by_state_and_due_window_and_page(api: ModuleType, deps, clock) -> None:
    _, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": {"expression": "rate(20 seconds)"}})
    for _ in range(3):
        clock.advance(60)
        claims.tick(deps.store.get_job(job["job_id"]).shard, deps)
    drain(deps.settings.queue_url("small"))
    all_runs = _runs(api, job["job_id"], limit=100)
    assert len(all_runs) == 12
    window = _runs(
        api,
        job["job_id"],
        since=(T0 + timedelta(seconds=60)).isoformat(),
        until=(T0 + timedelta(seconds=120)).isoformat(),
    )
    assert [r["due_at"][11:19] for r in window] == ["12:02:00", "12:01:40", "12:01:20", "12:01:00"]
    first = call(api, "GET", f"/jobs/{job['job_id']}/runs", query={"limit": "5"})[1]
    second = call(
        api, "GET", f"/jobs/{job['job_id']}/runs", query={"limit": "5", "next_token": first["next_token"]}
    )[1]
    assert [r["run_id"] for r in first["runs"] + second["runs"]] == [r["run_id"] for r in all_runs[:10]]
    assert _runs(api, job["job_id"], state="SUCCEEDED") == []


def test_a_patch_with_nulls_puts_fields_back_to_their_defaults_and_keeps_the_job_readable(
    api: ModuleType,
) -> None:
    # schemathesis found this: nulls for non-nullable fields once stored a broken job (500 on every read)
    # Given a job whose every optional field differs from its default
    body = {
        **EVERY_5,
        "timeout_seconds": 60,
        "retry": {"max_attempts": 7, "jitter": "none"},
        "on_timeout": {"action": "fail", "kill_grace_seconds": 2},
        "catch_up": {"policy": "all", "max_runs": 5},
        "overlap": {"policy": "skip"},
        "starting_deadline_seconds": 60,
    }
    _, job, _ = call(api, "POST", "/jobs", body)
    # When a PATCH sends null for each of them (JSON Merge Patch: null removes a field)
    nulls = {
        "timeout_seconds": None,
        "retry": None,
        "on_timeout": None,
        "catch_up": None,
        "overlap": None,
        "starting_deadline_seconds": None,
    }
    status, patched, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", nulls)
    # Then each is back to what a POST without it gives, and the rest is untouched
    assert status == 200, patched
    _, fresh, _ = call(api, "POST", "/jobs", EVERY_5)
    for field in nulls:
        assert patched[field] == fresh[field], field
    assert patched["timeout_seconds"] == 3600 and patched["retry"]["max_attempts"] == 3
    assert patched["starting_deadline_seconds"] is None
    assert (patched["name"], patched["schedule"], patched["task"]) == (
        job["name"],
        job["schedule"],
        job["task"],
    )
    # And the stored job reads back the same, alone and in the listing
    status, got, _ = call(api, "GET", f"/jobs/{job['job_id']}")
    assert status == 200 and got == patched
    status, listed, _ = call(api, "GET", "/jobs")
    assert status == 200 and job["job_id"] in [j["job_id"] for j in listed["jobs"]]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"name": None}, "name"),
        ({"task": None}, "task"),
        ({"schedule": None}, "schedule"),
        ({"schedule": {"expression": None}}, "schedule.expression"),
        ({"retry": None, "name": None}, "name"),
    ],
)
def test_a_patch_cannot_remove_a_field_that_has_no_default(api: ModuleType, patch: dict, field: str) -> None:
    # Given a scheduled job
    _, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "retry": {"max_attempts": 7}})
    # When a PATCH sends null for a field the job cannot be without
    status, answer, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", patch)
    # Then it is a 400 naming the field and saying it cannot be removed, and nothing changed
    assert status == 400, answer
    assert answer["error"]["field"] == field
    assert "cannot be removed" in answer["error"]["message"]
    status, got, _ = call(api, "GET", f"/jobs/{job['job_id']}")
    assert status == 200 and (got["version"], got["retry"]) == (1, job["retry"])


def test_a_null_inside_a_policy_or_schedule_resets_just_that_field(api: ModuleType) -> None:
    # Given a job with a Berlin cron schedule, a start time and a tuned retry policy
    body = {
        **EVERY_5,
        "schedule": {
            "expression": "0 9 * * *",
            "timezone": "Europe/Berlin",
            "start_at": "2026-12-01T00:00:00Z",
            "dst_policy": "skip",
        },
        "retry": {"max_attempts": 5, "backoff_seconds": 2, "jitter": "none"},
        "overlap": {"policy": "allow", "max_concurrency": 2},
    }
    _, job, _ = call(api, "POST", "/jobs", body)
    assert job["next_fire_at"] == "2026-12-01T08:00:00.000Z"
    # When a PATCH nulls some fields inside them
    patch = {
        "schedule": {"timezone": None, "start_at": None, "dst_policy": None},
        "retry": {"jitter": None, "backoff_seconds": None},
        "overlap": {"max_concurrency": None},
    }
    status, patched, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", patch)
    # Then just those fields are back to their defaults and the schedule is recomputed in UTC from now
    assert status == 200, patched
    assert patched["schedule"] == {
        "expression": "0 9 * * *",
        "timezone": "UTC",
        "start_at": None,
        "end_at": None,
        "dst_policy": "shift",
    }
    assert patched["retry"] == {**job["retry"], "jitter": "equal", "backoff_seconds": 10.0}
    assert patched["overlap"] == {"policy": "allow", "max_concurrency": None}
    assert patched["next_fire_at"] == "2026-11-30T09:00:00.000Z"
    assert call(api, "GET", f"/jobs/{job['job_id']}")[1] == patched


def test_a_null_timeout_is_the_default_of_the_jobs_task_kind(api: ModuleType) -> None:
    # Given a Lambda job with a 60 s timeout
    lambda_job = {
        "name": "fn",
        "schedule": {"expression": "rate(1 hour)"},
        "task": {"kind": "lambda", "function": "hello", "payload": {}},
        "timeout_seconds": 60,
    }
    _, job, _ = call(api, "POST", "/jobs", lambda_job)
    # When its timeout is removed, it is Lambda's limit, 900 s (not 3600 s, which a Lambda task cannot have)
    status, patched, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"timeout_seconds": None})
    assert status == 200 and patched["timeout_seconds"] == 900, patched
    # And when it becomes a container task in the same PATCH, it is the container default, 3600 s
    container = {"kind": "container", "command": ["true"]}
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job['job_id']}", {"task": container, "timeout_seconds": None}
    )
    assert status == 200 and (patched["task"]["kind"], patched["timeout_seconds"]) == ("container", 3600)


def test_a_new_task_kind_without_a_timeout_moves_a_default_timeout_to_the_new_kinds_default(
    api: ModuleType,
) -> None:
    # Given a container job with the default timeout (3600 s) and one that chose 1200 s
    default, chosen = (
        call(api, "POST", "/jobs", {**EVERY_5, "name": name, **extra})[1]
        for name, extra in (("default", {}), ("chosen", {"timeout_seconds": 1200}))
    )
    fn = {"kind": "lambda", "function": "hello", "payload": {}}
    # When the first becomes a Lambda task, its timeout is Lambda's default, 900 s (was a 400)
    status, patched, _ = call(api, "PATCH", f"/jobs/{default['job_id']}", {"task": fn})
    assert status == 200 and patched["timeout_seconds"] == 900, patched
    # And back to a container task: the container default again (it kept 900 s)
    container = {"kind": "container", "command": ["true"]}
    status, patched, _ = call(api, "PATCH", f"/jobs/{default['job_id']}", {"task": container})
    assert status == 200 and patched["timeout_seconds"] == 3600, patched
    # A timeout the user chose is theirs: too long for Lambda, it is refused naming the field
    status, answer, _ = call(api, "PATCH", f"/jobs/{chosen['job_id']}", {"task": fn})
    assert status == 400 and answer["error"]["field"] == "timeout_seconds"
    assert call(api, "GET", f"/jobs/{chosen['job_id']}")[1]["task"]["kind"] == "container"


def test_an_empty_patch_changes_nothing_not_even_the_version(api: ModuleType) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    status, patched, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {})
    assert status == 200 and patched["version"] == job["version"]
    assert call(api, "GET", f"/jobs/{job['job_id']}")[1]["updated_at"] == job["updated_at"]


def test_removing_the_schedule_of_a_run_once_job_changes_nothing(api: ModuleType) -> None:
    # Given a run-once job (it has no schedule)
    _, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": None})
    # When a PATCH removes its schedule, there is nothing to remove: the job stays as it was
    status, patched, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": None})
    assert status == 200, patched
    assert (patched["schedule"], patched["state"]) == (None, job["state"])


def test_patching_a_lambda_jobs_timeout_past_lambdas_limit_is_refused(api: ModuleType) -> None:
    body = {
        "name": "fn",
        "schedule": {"expression": "rate(1 hour)"},
        "task": {"kind": "lambda", "function": "hello", "payload": {}},
    }
    status, job, _ = call(api, "POST", "/jobs", body)
    assert status == 201, job
    status, answer, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"timeout_seconds": 901})
    assert status == 400 and answer["error"]["field"] == "timeout_seconds"
    assert call(api, "GET", f"/jobs/{job['job_id']}")[1]["timeout_seconds"] <= 900


def test_patch_merges_the_schedule_and_policies_field_by_field(api: ModuleType) -> None:
    body = {
        **EVERY_5,
        "schedule": {"expression": "0 9 * * *", "timezone": "America/New_York"},
        "retry": {"max_attempts": 5, "backoff_seconds": 2},
    }
    _, job, _ = call(api, "POST", "/jobs", body)
    status, patched, _ = call(
        api,
        "PATCH",
        f"/jobs/{job['job_id']}",
        {"schedule": {"expression": "0 10 * * *"}, "retry": {"max_attempts": 7}},
    )
    assert status == 200, patched
    assert patched["schedule"]["timezone"] == "America/New_York"  # kept
    assert patched["retry"]["backoff_seconds"] == 2 and patched["retry"]["max_attempts"] == 7
    status, patched, _ = call(
        api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": {"timezone": "Asia/Tokyo"}}
    )
    assert status == 200 and patched["schedule"] == {
        **patched["schedule"],
        "expression": "0 10 * * *",
        "timezone": "Asia/Tokyo",
    }
    # a run-now job has no schedule to merge into: a partial one names the missing field
    _, once, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": None})
    status, body, _ = call(api, "PATCH", f"/jobs/{once['job_id']}", {"schedule": {"timezone": "UTC"}})
    assert status == 400 and body["error"]["field"] == "schedule.expression"


@pytest.mark.parametrize(
    ("method", "path_fmt", "payload", "query", "field"),
    [
        (
            "POST",
            "/jobs",
            {"schedule": {"expression": "rate(1 minute)", "start_at": "0001-01-01T00:00:00Z"}},
            None,
            "schedule.start_at",
        ),
        (
            "POST",
            "/jobs",
            {"schedule": {"expression": "rate(1 minute)", "end_at": "9999-12-31T23:59:59-14:00"}},
            None,
            "schedule.end_at",
        ),
        ("GET", "/jobs/{job}/runs", None, {"since": "0001-01-01T00:00:00+14:00"}, "since"),
        (
            "GET",
            "/jobs",
            None,
            {
                "next_token": "eyJjcmVhdGVkX2F0Ijp7Ik4iOiIxIn0sImpvYl9pZCI6eyJTIjoieSJ9LCJ0ZW5hbnQiOnsiUyI6ImxvY2FsIn19"
            },
            "next_token",
        ),
    ],
)
def test_out_of_range_instants_and_forged_tokens_are_400(
    api, method, path_fmt, payload, query, field
) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    body = {**EVERY_5, **payload} if payload else None
    status, answer, _ = call(api, method, path_fmt.format(job=job["job_id"]), body, query=query)
    assert status == 400, answer
    assert answer["error"]["field"] == field


def test_a_listing_shows_each_jobs_current_state_though_the_index_holds_only_state_and_name(
    api: ModuleType, deps, clock
) -> None:
    # Given three jobs, one paused, whose next fires the tick has moved on (the tenant index is not written)
    ids = [call(api, "POST", "/jobs", {**EVERY_5, "name": f"n{i}"})[1]["job_id"] for i in range(3)]
    call(api, "POST", f"/jobs/{ids[0]}/pause")
    clock.advance(300)
    for shard in range(deps.settings.shard_count):
        claims.tick(shard, deps)
    # When the tenant lists its jobs
    status, page, _ = call(api, "GET", "/jobs")
    # Then every job comes back whole and current: task, schedule, next fire as stored now
    assert status == 200
    listed = {j["job_id"]: j for j in page["jobs"]}
    assert set(listed) == set(ids)
    for job_id in ids:
        stored = call(api, "GET", f"/jobs/{job_id}")[1]
        # (a listing leaves out the lag figures: they would read 100 runs of each job)
        assert listed[job_id] == {**stored, "lag": None} and stored["lag"]["runs"] == 0
    assert listed[ids[0]]["state"] == "PAUSED" and listed[ids[1]]["task"]["command"] == ["true"]
    # And the state filter is applied on the index
    status, paused, _ = call(api, "GET", "/jobs", query={"state": "PAUSED"})
    assert [j["job_id"] for j in paused["jobs"]] == [ids[0]]


def test_keys_dynamodb_leaves_unprocessed_are_asked_again(api: ModuleType, deps, monkeypatch) -> None:
    ids = [call(api, "POST", "/jobs", {**EVERY_5, "name": f"n{i}"})[1]["job_id"] for i in range(4)]
    real = deps.store._ddb.batch_get_item
    calls: list[int] = []

    def half_at_a_time(RequestItems):  # noqa: N803 (boto3's parameter name)
        # DynamoDB answers part of the batch and returns the rest as UnprocessedKeys (as under throttling)
        [(table, request)] = RequestItems.items()
        keys = request["Keys"]
        calls.append(len(keys))
        now, later = keys[: max(1, len(keys) // 2)], keys[max(1, len(keys) // 2) :]
        out = real(RequestItems={table: {**request, "Keys": now}})
        if later:
            out["UnprocessedKeys"] = {table: {**request, "Keys": later}}
        return out

    monkeypatch.setattr(deps.store._ddb, "batch_get_item", half_at_a_time)
    status, page, _ = call(api, "GET", "/jobs")
    assert status == 200 and sorted(j["job_id"] for j in page["jobs"]) == sorted(ids)
    assert calls == [4, 2, 1]


def test_a_listing_dynamodb_keeps_throttling_is_a_503_with_retry_after(
    api: ModuleType, deps, monkeypatch
) -> None:
    call(api, "POST", "/jobs", EVERY_5)

    def throttled(RequestItems):  # noqa: N803
        return {"Responses": {}, "UnprocessedKeys": RequestItems}

    monkeypatch.setattr(deps.store._ddb, "batch_get_item", throttled)
    monkeypatch.setattr("duetime.adapters.aws.dynamodb.wait_random_exponential", lambda **_: lambda _state: 0)
    status, body, headers = call(api, "GET", "/jobs")
    assert status == 503 and body["error"]["code"] == "throttled"
    assert "unprocessed" in body["error"]["message"] and headers["retry-after"] == "1"


def test_a_throttled_aws_call_is_a_503_and_writes_nothing(api: ModuleType, deps, monkeypatch) -> None:
    from botocore.exceptions import ClientError

    def throttled(**kwargs):
        raise ClientError(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}}, "PutItem"
        )

    real = deps.store._ddb.put_item
    monkeypatch.setattr(deps.store._ddb, "put_item", throttled)
    status, body, headers = call(api, "POST", "/jobs", EVERY_5)
    assert status == 503 and headers["retry-after"] == "1" and "PutItem" in body["error"]["message"]
    monkeypatch.setattr(deps.store._ddb, "put_item", real)
    assert call(api, "GET", "/jobs")[1]["jobs"] == []


def _throttle(deps, monkeypatch, client_name: str, operation: str) -> list[str]:
    """Make ``operation`` of the store's DynamoDB client or the queues' SQS client always throttled."""
    from botocore.exceptions import ClientError

    client = deps.store._ddb if client_name == "dynamodb" else deps.queues._sqs
    refused: list[str] = []

    def throttled(**kwargs):
        refused.append(operation)
        code = "RequestThrottled" if client_name == "sqs" else "ProvisionedThroughputExceededException"
        raise ClientError({"Error": {"Code": code, "Message": "slow down"}}, operation)

    monkeypatch.setattr(client, operation, throttled)
    return refused


def test_a_submit_whose_wake_up_is_throttled_is_accepted_once_and_its_run_still_runs_once(
    api: ModuleType, deps, clock, monkeypatch
) -> None:
    from duetime.services.sweeper import sweep

    # Given SQS refusing every send (throttled past the SDK's retries), batched or not
    real_send, real_batch = deps.queues._sqs.send_message, deps.queues._sqs.send_message_batch
    refused = _throttle(deps, monkeypatch, "sqs", "send_message_batch")
    refused_one = _throttle(deps, monkeypatch, "sqs", "send_message")
    # When a run-now job is submitted
    status, job, _ = call(api, "POST", "/jobs", {**EVERY_5, "schedule": None})
    # Then the submit took effect and says so (a 5xx would make the client submit a second job); the claim
    # tried its batch send, then the message alone
    assert status == 201 and (refused, refused_one) == (["send_message_batch"], ["send_message"])
    assert [j["job_id"] for j in call(api, "GET", "/jobs")[1]["jobs"]] == [job["job_id"]]
    [run] = deps.store.list_runs(job["job_id"])
    assert run.state.value == "PENDING"
    # And once SQS is back, the sweeper re-sends the PENDING run after its grace and it runs once
    monkeypatch.setattr(deps.queues._sqs, "send_message", real_send)
    monkeypatch.setattr(deps.queues._sqs, "send_message_batch", real_batch)
    clock.advance(deps.settings.pending_grace_seconds + 1)
    assert sweep(run.shard, deps).resent == 1
    assert Worker(deps, "small").poll_once(wait_seconds=1) == 1
    [run] = deps.store.list_runs(job["job_id"])
    assert (run.state.value, run.attempt) == ("SUCCEEDED", 1)


def test_a_manual_trigger_whose_send_is_throttled_is_a_202_with_one_run(
    api: ModuleType, deps, monkeypatch
) -> None:
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    _throttle(deps, monkeypatch, "sqs", "send_message")
    status, run, _ = call(api, "POST", f"/jobs/{job['job_id']}/trigger")
    assert status == 202 and run["state"] == "PENDING"
    assert [r["run_id"] for r in _runs(api, job["job_id"])] == [run["run_id"]]


def test_a_throttled_write_before_anything_is_stored_is_a_503(api: ModuleType, deps, monkeypatch) -> None:
    # SQS' and S3's throttling codes count too (botocore's list), not only DynamoDB's
    _, job, _ = call(api, "POST", "/jobs", EVERY_5)
    _throttle(deps, monkeypatch, "dynamodb", "put_item")
    status, body, headers = call(api, "POST", f"/jobs/{job['job_id']}/trigger")
    assert status == 503 and headers["retry-after"] == "1"
    assert _runs(api, job["job_id"]) == []
