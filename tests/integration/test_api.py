"""The HTTP API handler (functions/api) with real validation, against moto."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from duetime.services.worker import Worker
from tests.helpers import call

HELLO = {
    "name": "hello",
    "schedule": {"expression": "rate(1 minute)", "timezone": "UTC"},
    "task": {"kind": "container", "command": ["sh", "-c", "echo hello $DUETIME_RUN_ID"]},
}


def test_submit_answers_201_and_claims_a_first_fire_inside_the_lookahead(api: ModuleType) -> None:
    # Given rate(1 minute) submitted at 12:00: its first fire (12:01) is inside the tick's lookahead
    status, body, headers = call(api, "POST", "/jobs", HELLO)
    assert status == 201
    assert body["job_id"].startswith("job-")
    # Then the submit claimed 12:01 itself (PENDING run) and the job's next unclaimed fire is 12:02
    assert body["next_fire_at"] == "2026-11-29T12:02:00.000Z"
    _, runs, _ = call(api, "GET", f"/jobs/{body['job_id']}/runs")
    assert [(r["due_at"], r["state"]) for r in runs["runs"]] == [("2026-11-29T12:01:00.000Z", "PENDING")]
    assert body["state"] == "ACTIVE"
    assert headers["location"] == f"/jobs/{body['job_id']}"
    status, got, _ = call(api, "GET", f"/jobs/{body['job_id']}")
    assert status == 200 and got["name"] == "hello" and got["task"]["tier"] == "small"


def test_a_run_now_job_runs_and_its_run_and_logs_are_readable(api: ModuleType, deps) -> None:
    # Given a run-now job, and a worker that takes its run
    _, job, _ = call(api, "POST", "/jobs", {**HELLO, "schedule": None})
    Worker(deps, "small", owner="w1").poll_once()
    # When the runs, the run and its logs are read over the API
    status, runs, _ = call(api, "GET", f"/jobs/{job['job_id']}/runs", query={"limit": "5"})
    assert status == 200
    [run] = runs["runs"]
    assert run["state"] == "SUCCEEDED" and run["exit_code"] == 0 and run["attempt"] == 1
    for key in ("run_id", "job_id", "due_at", "started_at", "finished_at"):
        assert run[key] is not None
    status, one, _ = call(api, "GET", f"/runs/{run['run_id']}")
    assert status == 200 and one["run_id"] == run["run_id"]
    status, text, headers = call(api, "GET", f"/runs/{run['run_id']}/logs")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert text.strip() == f"hello {run['run_id']}"


def test_a_retried_runs_lag_is_its_first_attempts_start_minus_its_due_time(
    api: ModuleType, deps, clock
) -> None:
    # Given a run-now job (due 12:00:00) that fails its first attempt and gets a 1 s backoff
    body = {
        **HELLO,
        "schedule": None,
        "task": {"kind": "container", "command": ["sh", "-c", 'test "$DUETIME_ATTEMPT" = 2']},
        "retry": {"max_attempts": 2, "backoff_seconds": 1, "jitter": "none"},
    }
    _, job, _ = call(api, "POST", "/jobs", body)
    [run] = call(api, "GET", f"/jobs/{job['job_id']}/runs")[1]["runs"]
    assert run["lag_seconds"] is None  # not started yet
    worker = Worker(deps, "small", owner="w1")
    # When attempt 1 starts 0.04 s after the due time and fails
    clock.advance(0.04)
    assert worker.poll_once() == 1
    # And attempt 2 starts 44.9 s after the due time and succeeds
    clock.advance(44.86)
    assert worker.poll_once(wait_seconds=5) == 1
    # Then the run's lag is still its schedule lag, 0.04 s: retries do not make it late
    status, got, _ = call(api, "GET", f"/runs/{run['run_id']}")
    assert status == 200, got
    assert (got["state"], got["attempt"], got["started_at"]) == ("SUCCEEDED", 2, "2026-11-29T12:00:44.900Z")
    assert got["lag_seconds"] == 0.04
    # And the job's run listing says the same
    [listed] = call(api, "GET", f"/jobs/{job['job_id']}/runs")[1]["runs"]
    assert listed["lag_seconds"] == 0.04


def test_a_first_attempt_still_running_shows_its_lag(api: ModuleType, deps, clock) -> None:
    # Given a run-now job whose first attempt starts 2.5 s after its due time and is still running
    from duetime.domain.models import RunMessage
    from duetime.services import runs

    _, job, _ = call(api, "POST", "/jobs", {**HELLO, "schedule": None})
    [pending] = deps.store.list_runs(job["job_id"])
    clock.advance(2.5)
    runs.start(RunMessage(job_id=job["job_id"], due_at=pending.due_at, attempt=1), deps, owner="w1")
    # When the run is read (attempt 1 has no record in the history yet)
    status, got, _ = call(api, "GET", f"/runs/{pending.run_id}")
    # Then its lag is that attempt's start minus the due time, and the attempt is shown as it stands
    assert status == 200 and (got["state"], got["attempts"]) == ("RUNNING", [])
    current = got["current_attempt"]
    assert (current["attempt"], current["state"], current["worker"], current["finished_at"]) == (
        1,
        "RUNNING",
        "w1",
        None,
    )
    assert current["started_at"] == got["started_at"] and current["fencing_token"] == got["fencing_token"]
    assert got["lag_seconds"] == 2.5


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**HELLO, "colour": "red"}, "colour"),
        ({**HELLO, "task": {"kind": "container", "command": []}}, "task.command"),
        ({**HELLO, "task": {"kind": "container", "command": [""]}}, "task.command"),
        ({**HELLO, "task": {"kind": "container", "command": "echo hi"}}, "task.command"),
        ({**HELLO, "task": {"kind": "container", "command": ["true"], "tier": "huge"}}, "task.tier"),
        ({**HELLO, "name": ""}, "name"),
        ({k: v for k, v in HELLO.items() if k != "task"}, "task"),
        ({**HELLO, "timeout_seconds": 0}, "timeout_seconds"),
        ({**HELLO, "timeout_seconds": "soon"}, "timeout_seconds"),
        ({**HELLO, "retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ({**HELLO, "schedule": {"expression": "rate(0 minutes)"}}, "schedule.expression"),
        ({**HELLO, "schedule": {"expression": "every tuesday"}}, "schedule.expression"),
        (
            {**HELLO, "schedule": {"expression": "rate(1 minute)", "timezone": "Mars/Olympus"}},
            "schedule.timezone",
        ),
        ({**HELLO, "schedule": {"expression": "at(2020-01-01T00:00:00)"}}, "schedule.expression"),
        # its first fire would be in 2300, after 2199 (the last year of every other instant of a job)
        ({**HELLO, "schedule": {"expression": "rate(100000 days)"}}, "schedule.expression"),
        (
            {**HELLO, "schedule": {"expression": "rate(1 minute)", "end_at": "2020-01-01T00:00:00Z"}},
            "schedule.end_at",
        ),
        ({**HELLO, "job_id": "has spaces"}, "job_id"),
    ],
)
def test_bad_submit_bodies_get_a_4xx_naming_the_field(api: ModuleType, deps, body: dict, field: str) -> None:
    status, answer, _ = call(api, "POST", "/jobs", body)
    assert status == 400, answer
    assert answer["error"]["field"] == field
    assert answer["error"]["message"]
    # and nothing was written
    assert list(deps.store.query_due(0, deps.clock.now().replace(year=2100))) == []
    assert list(deps.store.query_due(1, deps.clock.now().replace(year=2100))) == []


def test_a_body_that_is_not_json_is_a_400(api: ModuleType) -> None:
    status, answer, _ = call(api, "POST", "/jobs", raw_body="{not json")
    assert status == 400 and answer["error"]["code"] == "invalid_json"


def test_a_taken_job_id_is_a_409(api: ModuleType) -> None:
    assert call(api, "POST", "/jobs", {**HELLO, "job_id": "mine"})[0] == 201
    status, answer, _ = call(api, "POST", "/jobs", {**HELLO, "job_id": "mine"})
    assert status == 409 and answer["error"]["field"] == "job_id"


@pytest.mark.parametrize(
    "path",
    [
        "/jobs/job-nope",
        "/jobs/job-nope/runs",
        "/runs/job-nope.1764417600000",
        "/runs/garbage",
        "/runs/job-nope.1764417600000/logs",
        "/nowhere",
    ],
)
def test_unknown_ids_are_404_with_a_json_body(api: ModuleType, path: str) -> None:
    status, answer, _ = call(api, "GET", path)
    assert status == 404
    assert answer["error"]["code"] in ("not_found", "no_such_route")


def test_healthz(api: ModuleType) -> None:
    assert call(api, "GET", "/healthz")[:2] == (200, {"status": "ok"})


@pytest.mark.parametrize(
    "raw",
    ["\udcff", '{"name": ' + "[" * 2000 + "]" * 2000 + "}"],
    ids=["not-utf8", "nested-2000-deep"],
)
def test_unreadable_bodies_are_a_400_not_a_500(api: ModuleType, raw: str) -> None:
    from duetime.local.lambda_runtime import LocalLambdaContext
    from tests.helpers import http_event

    event = http_event("POST", "/jobs")
    if raw == "\udcff":
        import base64

        event.update(body=base64.b64encode(b"\xff\xfe{").decode(), isBase64Encoded=True)
    else:
        event["body"] = raw
    result = api.lambda_handler(event, LocalLambdaContext("api"))
    assert result["statusCode"] == 400 and '"field":"body"' in result["body"]


@pytest.mark.parametrize("raw", ["null", " null\n", "[]", "42", '"a job"'])
def test_a_body_that_is_not_an_object_says_so(api: ModuleType, raw: str) -> None:
    from duetime.local.lambda_runtime import LocalLambdaContext
    from tests.helpers import http_event

    # Given JSON that is not an object (null included, which Powertools reads as no body)
    event = http_event("POST", "/jobs")
    event["body"] = raw
    result = api.lambda_handler(event, LocalLambdaContext("api"))
    # Then the 400 names the body and says it should be an object, never "Field required"
    error = json.loads(result["body"])["error"]
    assert result["statusCode"] == 400 and error["field"] == "body"
    assert error["message"].startswith("body: Input should be a valid dictionary or object"), error


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"timeout_seconds": "10"}, "timeout_seconds"),
        ({"timeout_seconds": True}, "timeout_seconds"),
        ({"retry": {"max_attempts": 2.0}}, "retry.max_attempts"),
        ({"schedule": {"expression": "rate(1 hour)", "start_at": 1700000000}}, "schedule.start_at"),
        ({"name": "   "}, "name"),
        ({"task": {"command": ["a\u0000b"]}}, "task.command.0"),
        ({"task": {"command": ["true"], "env": {"A": "x\u0000"}}}, "task.env.A"),
        ({"task": {"command": ["echo"] + ["x" * 8000] * 20}}, "task"),
    ],
)
def test_loose_or_unrunnable_values_are_refused(api: ModuleType, patch: dict, field: str) -> None:
    status, answer, _ = call(api, "POST", "/jobs", {**HELLO, **patch})
    assert status == 400, answer
    assert answer["error"]["field"] == field


@pytest.mark.parametrize(
    ("name", "code_point"),
    [
        ("nightly\u0000backup", "U+0000"),
        ("bell\u0007", "U+0007"),
        ("two\nlines", "U+000A"),
        ("tab\there", "U+0009"),
        ("\u001b[31mred", "U+001B"),
        ("del\u007f", "U+007F"),
        ("c1\u0085next-line", "U+0085"),
        ("evil\u202egnp.exe", "U+202E"),  # right-to-left override
        ("\u200b", "U+200B"),  # zero-width space: a blank name in listings
        ("line\u2028separator", "U+2028"),
    ],
)
def test_a_name_with_a_control_character_is_refused_naming_the_field(
    api: ModuleType, deps, name: str, code_point: str
) -> None:
    # Given a job named with a control character
    # When it is submitted
    status, answer, _ = call(api, "POST", "/jobs", {**HELLO, "name": name})
    # Then it is a 400 naming `name` and saying which character and why, and nothing was stored
    assert status == 400, answer
    assert answer["error"]["field"] == "name"
    assert "must not contain" in answer["error"]["message"] and code_point in answer["error"]["message"]
    assert call(api, "GET", "/jobs")[1]["jobs"] == []
    # And a PATCH cannot rename a job to it either
    _, job, _ = call(api, "POST", "/jobs", HELLO)
    status, answer, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"name": name})
    assert status == 400 and answer["error"]["field"] == "name", answer
    assert call(api, "GET", f"/jobs/{job['job_id']}")[1]["name"] == "hello"


def test_a_name_may_hold_any_printable_unicode(api: ModuleType) -> None:
    # Given a name with accents, CJK, an emoji and punctuation (and surrounding spaces, trimmed)
    status, job, _ = call(api, "POST", "/jobs", {**HELLO, "name": "  Café 夜間 🚀 #1 (prod)/daily  "})
    # Then it is accepted as written, without the surrounding spaces
    assert status == 201, job
    assert job["name"] == "Café 夜間 🚀 #1 (prod)/daily"


@pytest.mark.parametrize(
    ("task", "field", "message"),
    [
        (
            {"command": ["echo", "x" * 8193]},
            "task.command.1",
            "task.command.1: String should have at most 8192 characters",
        ),
        (
            {"command": ["cat"], "stdin": "x" * 65537},
            "task.stdin",
            "task.stdin: String should have at most 65536 characters",
        ),
    ],
)
def test_a_string_over_its_length_limit_is_measured_in_characters(
    api: ModuleType, task: dict, field: str, message: str
) -> None:
    # Given a task with one argument (or its stdin) one character over its limit
    # When it is submitted
    status, answer, _ = call(api, "POST", "/jobs", {**HELLO, "task": {"kind": "container", **task}})
    # Then the 400 names that string and counts characters (not "items", as for a list)
    assert status == 400, answer
    assert (answer["error"]["field"], answer["error"]["message"]) == (field, message)


def test_arguments_and_stdin_at_their_length_limits_are_accepted(api: ModuleType) -> None:
    task = {"kind": "container", "command": ["echo", "x" * 8192], "stdin": "y" * 65536}
    status, job, _ = call(api, "POST", "/jobs", {**HELLO, "task": task})
    assert status == 201, job
    assert len(job["task"]["command"][1]) == 8192 and len(job["task"]["stdin"]) == 65536


def test_an_out_of_range_run_id_is_a_404(api: ModuleType) -> None:
    assert call(api, "GET", "/runs/cron5.99999999999999999999999")[0] == 404
    assert call(api, "GET", "/runs/job-x.9999999999999999/logs")[0] == 404


@pytest.mark.parametrize(
    "spell",
    [
        lambda ms: "0" + ms,  # a leading zero
        lambda ms: ms.translate(str.maketrans("0123456789", "０１２３４５６７８９")),  # fullwidth digits
        lambda ms: ms.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")),  # Arabic-Indic digits
    ],
    ids=["leading-zero", "fullwidth", "arabic-indic"],
)
def test_only_the_canonical_run_id_names_a_run(api: ModuleType, spell) -> None:
    # Given a job whose submit claimed a run
    _, job, _ = call(api, "POST", "/jobs", HELLO)
    _, runs, _ = call(api, "GET", f"/jobs/{job['job_id']}/runs")
    run_id = runs["runs"][0]["run_id"]
    ms = run_id.rpartition(".")[2]
    # When the same due time is spelled another way int() reads as the same number
    other = f"{job['job_id']}.{spell(ms)}"
    # Then it names no run: reading it, its log or cancelling it is a 404
    assert call(api, "GET", f"/runs/{other}")[0] == 404
    assert call(api, "GET", f"/runs/{other}/logs")[0] == 404
    assert call(api, "POST", f"/runs/{other}/cancel")[0] == 404
    # And the run itself is untouched and still readable by its id
    status, run, _ = call(api, "GET", f"/runs/{run_id}")
    assert status == 200 and run["state"] == "PENDING"


def test_a_json_body_sent_as_a_form_is_read_as_json(api: ModuleType) -> None:
    # curl -d sends application/x-www-form-urlencoded unless told otherwise
    from duetime.local.lambda_runtime import LocalLambdaContext
    from tests.helpers import http_event

    event = http_event("POST", "/jobs", {**HELLO, "name": 1})
    event["headers"]["content-type"] = "application/x-www-form-urlencoded"
    result = api.lambda_handler(event, LocalLambdaContext("api"))
    assert result["statusCode"] == 400
    assert '"field":"name"' in result["body"] and "valid string" in result["body"]


def test_a_dead_lettered_run_is_listed_and_can_be_retried(api: ModuleType, deps) -> None:
    # Given a run-now job that fails its only attempt
    body = {
        **HELLO,
        "schedule": None,
        "task": {"kind": "container", "command": ["sh", "-c", "exit 4"]},
        "retry": {"max_attempts": 1},
    }
    _, job, _ = call(api, "POST", "/jobs", body)
    worker = Worker(deps, "small", owner="w1")
    worker.poll_once()
    # Then it is in the dead letters, newest first
    status, dead, _ = call(api, "GET", "/dead-letters")
    assert status == 200
    [run] = dead["runs"]
    assert (run["job_id"], run["state"], run["dead_lettered"], run["exit_code"]) == (
        job["job_id"],
        "FAILED",
        True,
        4,
    )
    assert run["current_attempt"] is None and [a["state"] for a in run["attempts"]] == ["FAILED"]
    # When it is re-driven it runs again as attempt 2 and leaves the dead letters
    status, again, _ = call(api, "POST", f"/runs/{run['run_id']}/retry")
    assert status == 200 and (again["state"], again["attempt"], again["trigger"]) == ("PENDING", 2, "retry")
    assert call(api, "GET", "/dead-letters")[1]["runs"] == []
    # And retrying a run that is not dead-lettered (now PENDING) is a 409 that says why
    status, answer, _ = call(api, "POST", f"/runs/{run['run_id']}/retry")
    assert status == 409 and "only a dead-lettered or timed-out run" in answer["error"]["message"]
    worker.poll_once()
    attempts = call(api, "GET", f"/runs/{run['run_id']}")[1]["attempts"]
    assert [(a["attempt"], a["exit_code"]) for a in attempts] == [(1, 4), (2, 4)]


def test_dead_letters_page_newest_first_with_tokens_bound_to_the_tenant(api: ModuleType, deps, clock) -> None:
    # Given alice has 5 runs dead-lettered one second apart, and bob has one
    failing = {
        **HELLO,
        "schedule": None,
        "task": {"kind": "container", "command": ["sh", "-c", "exit 4"]},
        "retry": {"max_attempts": 1},
    }
    worker = Worker(deps, "small", owner="w1")
    alices = []
    for i in range(5):
        clock.advance(1)
        _, job, _ = call(api, "POST", "/jobs", {**failing, "name": f"fails-{i}"}, tenant="alice")
        alices.append(job["job_id"])
        assert worker.poll_once() == 1
    call(api, "POST", "/jobs", failing, tenant="bob")
    assert worker.poll_once() == 1
    # When alice pages through her dead letters two at a time
    seen: list[str] = []
    tokens: list[str | None] = [None]
    while True:
        query = {"limit": "2"} | ({"next_token": tokens[-1]} if tokens[-1] else {})
        status, page, _ = call(api, "GET", "/dead-letters", query=query, tenant="alice")
        assert status == 200, page
        assert len(page["runs"]) <= 2 and all(r["dead_lettered"] for r in page["runs"])
        seen += [r["job_id"] for r in page["runs"]]
        tokens.append(page["next_token"])
        if page["next_token"] is None:
            break
    # Then she sees each of hers once, most recently dead-lettered first, in 3 pages, the last without a token
    assert seen == list(reversed(alices)) and len(tokens) == 4
    first_token = tokens[1]
    # And a token that is not one the list issued, or is alice's, is a 400 naming next_token for bob
    for forged in ("garbage", first_token):
        status, body, _ = call(api, "GET", "/dead-letters", query={"next_token": forged}, tenant="bob")
        assert status == 400, body
        assert body["error"]["field"] == "next_token"
    # While alice's own token still gives her the rest
    status, rest, _ = call(api, "GET", "/dead-letters", query={"next_token": first_token}, tenant="alice")
    assert status == 200 and [r["job_id"] for r in rest["runs"]] == list(reversed(alices))[2:]


def test_schedule_preview_lists_fire_times_in_utc_and_local_time(api: ModuleType) -> None:
    status, body, _ = call(
        api,
        "GET",
        "/schedules/preview",
        query={
            "expression": "cron(0 12 ? * MON-FRI *)",
            "timezone": "Europe/Berlin",
            "count": "3",
            "after": "2026-11-27T12:00:00Z",
        },
    )
    assert status == 200, body
    assert body["fire_times"] == [
        "2026-11-30T11:00:00.000Z",
        "2026-12-01T11:00:00.000Z",
        "2026-12-02T11:00:00.000Z",
    ]
    assert body["local_times"][0] == "2026-11-30T12:00:00+01:00"
    assert body["kind"] == "cron" and body["description"]


def test_schedule_preview_of_an_impossible_expression_is_a_400_saying_why(api: ModuleType) -> None:
    status, body, _ = call(api, "GET", "/schedules/preview", query={"expression": "0 0 30 2 *"})
    assert status == 400 and body["error"]["field"] == "expression"
    assert "never" in body["error"]["message"]


def test_a_one_off_in_a_dst_gap_under_skip_is_a_400_saying_it_can_never_fire(api: ModuleType) -> None:
    # Given an at() at 02:30 on New York's 2027 spring-forward day, with dst_policy skip
    schedule = {"expression": "at(2027-03-14T02:30:00)", "timezone": "America/New_York", "dst_policy": "skip"}
    # When it is submitted, or previewed
    status, body, _ = call(api, "POST", "/jobs", {**HELLO, "schedule": schedule})
    # Then it is refused on the expression as never firing, saying why
    assert status == 400, body
    assert body["error"]["field"] == "schedule.expression"
    assert "is in a DST gap" in body["error"]["message"] and "can never fire" in body["error"]["message"]
    assert call(api, "GET", "/jobs")[1]["jobs"] == []
    query = {"expression": schedule["expression"], "timezone": "America/New_York", "dst_policy": "skip"}
    status, body, _ = call(api, "GET", "/schedules/preview", query=query)
    assert status == 400 and body["error"]["field"] == "expression", body
    assert "is in a DST gap" in body["error"]["message"]
    # And a one-off accepted under shift cannot be switched to skip
    _, job, _ = call(api, "POST", "/jobs", {**HELLO, "schedule": {**schedule, "dst_policy": "shift"}})
    assert job["next_fire_at"] == "2027-03-14T07:00:00.000Z"
    status, body, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", {"schedule": {"dst_policy": "skip"}})
    assert status == 400 and body["error"]["field"] == "schedule.expression", body


def test_schedule_preview_stops_at_the_end_of_2199(api: ModuleType) -> None:
    # Given @daily previewed after the last midnight of the supported range
    query = {"expression": "@daily", "after": "2199-12-30T00:00:00Z"}
    # When the default five fire times are asked for
    status, body, _ = call(api, "GET", "/schedules/preview", query=query)
    # Then only 2199-12-31 comes: nothing in 2200
    assert status == 200, body
    assert body["fire_times"] == ["2199-12-31T00:00:00.000Z"]


def test_a_superscript_digit_in_a_schedule_is_a_400_not_a_500(api: ModuleType) -> None:
    # Given a submit, a preview and a patch each with `²` (int() raises on it) in the expression
    created = {**HELLO, "schedule": {"expression": "² * * * *", "timezone": "UTC"}}
    status, body, _ = call(api, "POST", "/jobs", created)
    assert status == 400, body
    assert body["error"]["field"] == "schedule.expression"
    assert "'²' (U+00B2) in `² * * * *` is not an ASCII digit" in body["error"]["message"]
    status, body, _ = call(api, "GET", "/schedules/preview", query={"expression": "² * * * *"})
    assert status == 400 and body["error"]["field"] == "expression", body
    assert "is not an ASCII digit" in body["error"]["message"]
    _, job, _ = call(api, "POST", "/jobs", HELLO)
    patch = {"schedule": {"expression": "0 ² * * *"}}
    status, body, _ = call(api, "PATCH", f"/jobs/{job['job_id']}", patch)
    assert status == 400 and body["error"]["field"] == "schedule.expression", body
    assert "is not an ASCII digit" in body["error"]["message"]
    # And the job keeps its schedule
    _, got, _ = call(api, "GET", f"/jobs/{job['job_id']}")
    assert got["schedule"]["expression"] == "rate(1 minute)"


@pytest.mark.parametrize(
    ("query", "parameter", "saying"),
    [
        ({"expression": "bogus"}, "expression", "cron takes 5"),
        ({"expression": "rate(0 minutes)"}, "expression", "at least 1"),
        ({"expression": "rate(1 minute)", "timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"expression": "rate(1 minute)", "timezone": ""}, "timezone", "empty"),
        ({"expression": "rate(1 minute)", "count": "0"}, "count", ""),
        ({"expression": "rate(1 minute)", "after": "2026-12-01T10:00:00"}, "after", "UTC offset"),
    ],
)
def test_schedule_preview_errors_name_the_query_parameter(
    api: ModuleType, query: dict[str, str], parameter: str, saying: str
) -> None:
    # Given a preview request with one bad query parameter
    # When it is sent
    status, body, _ = call(api, "GET", "/schedules/preview", query=query)
    # Then the 400 names that parameter, as the caller wrote it (not a job body's schedule.* field)
    assert status == 400, body
    assert body["error"]["field"] == parameter
    assert saying in body["error"]["message"]


@pytest.mark.parametrize(
    ("path", "query", "unknown"),
    [
        ("/schedules/preview", {"expression": "rate(1 minute)", "cuont": "3"}, "cuont"),
        ("/jobs", {"limit": "5", "staet": "PAUSED"}, "staet"),
        ("/dead-letters", {"tenant": "t2"}, "tenant"),
    ],
)
def test_an_unknown_query_parameter_is_a_400_naming_it(
    api: ModuleType, path: str, query: dict[str, str], unknown: str
) -> None:
    # Given a misspelt query parameter, which would otherwise silently fall back to its default
    status, body, _ = call(api, "GET", path, query=query)
    # Then the 400 names it and lists the parameters the route takes
    assert status == 400, body
    assert body["error"]["field"] == unknown
    assert body["error"]["message"].startswith(
        f"{unknown}: unknown query parameter of GET {path} (it takes: "
    )


@pytest.mark.parametrize(
    ("path", "pairs", "name", "times"),
    [
        ("/jobs", [("limit", "1"), ("limit", "2")], "limit", 2),
        (
            "/schedules/preview",
            [("expression", "@daily"), ("count", "1"), ("count", "2"), ("count", "3")],
            "count",
            3,
        ),
        ("/schedules/preview", [("expression", "@daily"), ("expression", "@hourly")], "expression", 2),
    ],
)
def test_a_query_parameter_given_twice_is_a_400_naming_it(
    api: ModuleType, path: str, pairs: list[tuple[str, str]], name: str, times: int
) -> None:
    # Given a parameter that takes one value given more than once (API Gateway joins them with commas)
    status, body, _ = call(api, "GET", path, query=pairs)
    # Then the 400 names it and says how often it came
    assert status == 400, body
    assert body["error"]["field"] == name
    assert body["error"]["message"] == f"{name}: given {times} times; give it once"


def test_a_wrong_method_with_a_query_is_still_a_405(api: ModuleType) -> None:
    status, body, _ = call(api, "DELETE", "/dead-letters", query={"limit": "20"})
    assert status == 405 and body["error"]["code"] == "method_not_allowed", body


def test_declared_query_parameters_are_still_taken(api: ModuleType) -> None:
    status, body, _ = call(
        api, "GET", "/schedules/preview", query={"expression": "rate(1 minute)", "count": "3"}
    )
    assert status == 200 and len(body["fire_times"]) == 3, body
    status, body, _ = call(api, "GET", "/jobs", query={"limit": "5"})
    assert status == 200, body


@pytest.mark.parametrize(
    ("schedule", "expected_next"),
    [
        # submitted Sunday 2026-11-29 12:00 UTC; Berlin is UTC+1 in winter: weekdays 12:00 local = 11:00 UTC
        ({"expression": "cron(0 12 ? * MON-FRI *)", "timezone": "Europe/Berlin"}, "2026-11-30T11:00:00.000Z"),
        # Kolkata is UTC+05:30: hourly at local :00 is at UTC :30 (not half past local)
        ({"expression": "0 * * * *", "timezone": "Asia/Kolkata"}, "2026-11-29T12:30:00.000Z"),
    ],
)
def test_cron_jobs_in_other_zones_show_the_right_next_fire(api: ModuleType, schedule, expected_next) -> None:
    status, body, _ = call(api, "POST", "/jobs", {**HELLO, "schedule": schedule})
    assert status == 201, body
    assert body["next_fire_at"] == expected_next


def test_policies_round_trip_through_the_api(api: ModuleType) -> None:
    body = {
        **HELLO,
        "overlap": {"policy": "skip"},
        "catch_up": {"policy": "all", "max_runs": 5},
        "starting_deadline_seconds": 120,
    }
    status, job, _ = call(api, "POST", "/jobs", body)
    assert status == 201
    assert job["overlap"] == {"policy": "skip", "max_concurrency": None}
    assert job["catch_up"] == {"policy": "all", "max_runs": 5, "tolerance_seconds": 60.0}
    assert job["starting_deadline_seconds"] == 120
    status, answer, _ = call(api, "POST", "/jobs", {**HELLO, "overlap": {"policy": "sometimes"}})
    assert status == 400 and answer["error"]["field"] == "overlap.policy"


def test_a_known_path_with_an_unknown_method_is_405_with_allow(api: ModuleType) -> None:
    status, body, headers = call(api, "PUT", "/jobs/job-x")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    assert headers["allow"] == "DELETE, GET, PATCH"
    assert call(api, "TRACE", "/healthz")[0] == 405


@pytest.mark.parametrize(
    "raw",
    [
        "1" + "0" * 5000,
        '{"name": 1' + "0" * 5000 + "}",
        '{"name": "x", "task": {"kind": "container", "command": ["true"]}, "timeout_seconds": 1'
        + "0" * 5000
        + "}",
    ],
)
def test_a_number_too_long_to_read_is_a_400_not_a_500(api: ModuleType, raw: str) -> None:
    # CPython refuses to convert integers of more than 4,300 digits (json.loads raises a plain ValueError)
    status, body, _ = call(api, "POST", "/jobs", raw_body=raw)
    assert status == 400 and body["error"]["field"] == "body", body
    assert "a number has more than 4,300 digits" in body["error"]["message"]
    assert "set_int_max_str_digits" not in body["error"]["message"]  # Python's hint is for Python programmers
    assert call(api, "GET", "/jobs")[1]["jobs"] == []


@pytest.mark.parametrize(("number", "why"), [("NaN", "NaN"), ("-Infinity", "-Infinity"), ("1e400", "1e400")])
def test_nan_infinity_and_overflowing_numbers_are_refused_not_stored_as_null(
    api: ModuleType, number: str, why: str
) -> None:
    raw = '{"name": "b", "task": {"kind": "lambda", "function": "x", "payload": {"a": ' + number + "}}}"
    status, body, _ = call(api, "POST", "/jobs", raw_body=raw)
    assert status == 400 and body["error"]["field"] == "body"
    assert why in body["error"]["message"]
    assert call(api, "GET", "/jobs")[1]["jobs"] == []


def test_a_body_naming_a_field_twice_is_refused_not_read_as_its_last(api: ModuleType) -> None:
    raw = '{"name": "x", "name": "y", "task": {"kind": "container", "command": ["true"]}}'
    status, body, _ = call(api, "POST", "/jobs", raw_body=raw)
    assert status == 400 and body["error"]["field"] == "body"
    assert "'name' appears twice" in body["error"]["message"]
    assert call(api, "GET", "/jobs")[1]["jobs"] == []


def test_a_name_with_an_emoji_sequence_is_accepted(api: ModuleType) -> None:
    family = "backup \U0001f468\u200d\U0001f469\u200d\U0001f467 nightly"  # joined by zero-width joiners
    status, job, _ = call(api, "POST", "/jobs", {**HELLO, "name": family})
    assert status == 201 and job["name"] == family


def test_a_bad_environment_variable_name_is_a_400_naming_the_env_field(api: ModuleType) -> None:
    body = {**HELLO, "task": {"kind": "container", "command": ["true"], "env": {"A=B": "1"}}}
    status, got, _ = call(api, "POST", "/jobs", body)
    assert status == 400, got
    assert got["error"]["field"] == "task.env"
    assert "A=B" in got["error"]["message"]


@pytest.mark.parametrize("path", ["/pause", "/trigger"])
def test_a_body_sent_to_an_action_that_takes_none_is_a_400(api: ModuleType, path: str) -> None:
    status, job, _ = call(api, "POST", "/jobs", HELLO)
    assert status == 201, job
    status, body, _ = call(api, "POST", f"/jobs/{job['job_id']}{path}", {"x": 1})
    assert status == 400 and body["error"]["field"] == "body", body
    assert body["error"]["message"] == f"body: POST /jobs/{{job_id}}{path} takes no body (send none, or {{}})"
    # an empty object is taken as no body
    status, body, _ = call(api, "POST", f"/jobs/{job['job_id']}{path}", {})
    assert status in (200, 202), body
