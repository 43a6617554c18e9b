"""Job actions govern runs already claimed, end to end on the local stack with its default 60 s tick.

With a 60 s tick the look-ahead is 75 s: a `rate(10 seconds)` job submitted at S has its runs due at S+10 ..
S+70 claimed by the submit itself, each waiting on a delayed SQS message. Pause, delete and a schedule
PATCH must govern those runs (DESIGN.md section 5, "claimed ahead, decided at start").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack, start_stack, stop_stack
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(Path(tmp_path_factory.mktemp("actions")), "--workers", "1")
    yield s
    stop_stack(s)


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _job(name: str, **kw) -> dict:
    return {
        "name": name,
        "schedule": {"expression": "rate(10 seconds)"},
        "task": {"kind": "container", "command": ["true"]},
        **kw,
    }


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def _runs(stack: Stack, job_id: str) -> list[dict]:
    status, body = stack.request("GET", f"/jobs/{job_id}/runs?limit=100")
    assert status == 200, body
    return sorted(body["runs"], key=lambda r: r["due_at"])


def _slots(created: datetime, after: datetime, until: datetime) -> list[datetime]:
    """The rate(10 seconds) slots counted from ``created`` in ``(after, until]``."""
    return [
        created + timedelta(seconds=10 * k)
        for k in range(1, 100)
        if after < created + timedelta(seconds=10 * k) <= until
    ]


def _started(run: dict) -> bool:
    return run["started_at"] is not None or bool(run["attempts"])


#: the states a run never leaves
ENDED = {"SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "SKIPPED"}


def _settled_after_resume(stack: Stack, job_id: str, resumed: datetime) -> bool:
    """Every run due up to ``resumed`` has ended, and one due after it has SUCCEEDED."""
    found = _runs(stack, job_id)
    return all(r["state"] in ENDED for r in found if _ts(r["due_at"]) <= resumed) and any(
        r["state"] == "SUCCEEDED" for r in found if _ts(r["due_at"]) > resumed
    )


def test_pause_delete_and_a_schedule_change_govern_the_runs_claimed_ahead(default_stack: Stack) -> None:
    stack = default_stack
    t0 = time.monotonic()
    policies = ("none", "latest", "all")
    paused = {
        p: stack.request("POST", "/jobs", _job(f"pause-{p}", catch_up={"policy": p}))[1] for p in policies
    }
    deleted = stack.request("POST", "/jobs", _job("deleted"))[1]
    changed = stack.request("POST", "/jobs", _job("changed"))[1]
    for job in (*paused.values(), deleted, changed):
        assert len(_runs(stack, job["job_id"])) == 7, "the submit claims the 75 s look-ahead"

    # pause at +5 s (before the first run, due at +10 s)
    _sleep_until(t0 + 5)
    pause_at = {}
    for p, job in paused.items():
        status, body = stack.request("POST", f"/jobs/{job['job_id']}/pause")
        assert status == 200 and body["state"] == "PAUSED"
        pause_at[p] = _ts(body["paused_at"])

    # at +12 s: delete one job (its run due at +10 s has run) and move another to rate(30 seconds)
    _sleep_until(t0 + 12)
    status, body = stack.request("DELETE", f"/jobs/{deleted['job_id']}")
    assert status == 200, body
    deleted_at = _ts(body["updated_at"])
    status, patched = stack.request(
        "PATCH", f"/jobs/{changed['job_id']}", {"schedule": {"expression": "rate(30 seconds)"}}
    )
    assert status == 200, patched
    changed_at = _ts(patched["updated_at"])
    created = _ts(changed["created_at"])
    # a rate counts from the job's submission: +30 s is the new schedule's first slot after the change, a
    # slot the old one shares; the PATCH claimed +30 and +60 s, so next_fire_at is +90 s
    new_first = created + timedelta(seconds=30)
    assert _ts(patched["next_fire_at"]) == created + timedelta(seconds=90)

    # resume 30 s after the pause (the slots due at +10, +20 and +30 s held by it)
    _sleep_until(t0 + 35)
    resume_at = {}
    for p, job in paused.items():
        status, body = stack.request("POST", f"/jobs/{job['job_id']}/resume")
        assert status == 200 and body["state"] == "ACTIVE", body
        resume_at[p] = _ts(body["updated_at"])
    # until each paused job's held runs are decided and its first slot after the resume (+40 s) has run, and the
    # changed job's first slot of the new schedule (+30 s) too (every run checked below has ended by then)
    wait_for(
        "the runs after the resume",
        lambda: (
            all(_settled_after_resume(stack, job["job_id"], resume_at[p]) for p, job in paused.items())
            and any(
                _ts(r["due_at"]) == new_first and r["state"] == "SUCCEEDED"
                for r in _runs(stack, changed["job_id"])
            )
        ),
        timeout=40,
    )

    # pause: of the runs due during the pause, `none` started none, `latest` the newest, `all` every one;
    # the others ended SKIPPED (paused)
    for p, job in paused.items():
        found = _runs(stack, job["job_id"])
        during = [r for r in found if pause_at[p] < _ts(r["due_at"]) <= resume_at[p]]
        slots = _slots(_ts(job["created_at"]), pause_at[p], resume_at[p])
        assert [_ts(r["due_at"]) for r in during] == slots and len(slots) >= 3, found
        started = [r["due_at"] for r in during if _started(r)]
        expected = {"none": [], "latest": [during[-1]["due_at"]], "all": [r["due_at"] for r in during]}[p]
        assert started == expected, (p, during)
        assert {(r["state"], r["error"]) for r in during if not _started(r)} <= {("SKIPPED", "paused")}
        assert all(r["state"] == "SUCCEEDED" for r in during if _started(r)), during
        # and the slots after the resume ran as usual
        after = [r for r in found if resume_at[p] < _ts(r["due_at"]) <= _ts(found[-1]["due_at"])]
        assert any(r["state"] == "SUCCEEDED" for r in after), (p, found)

    # delete: no run due after the DELETE started; each claimed one ended SKIPPED (deleted)
    found = _runs(stack, deleted["job_id"])
    later = [r for r in found if _ts(r["due_at"]) > deleted_at]
    assert later and not any(_started(r) for r in later)
    assert {(r["state"], r["error"]) for r in later} == {("SKIPPED", "deleted")}

    # schedule change: the old schedule's claimed slots did not run; the new one runs from its next slot
    found = _runs(stack, changed["job_id"])
    old = [r for r in found if changed_at < _ts(r["due_at"]) < new_first]
    expected_old = [s for s in _slots(created, changed_at, new_first) if s != new_first]
    assert [_ts(r["due_at"]) for r in old] == expected_old and not any(_started(r) for r in old), found
    assert {(r["state"], r["error"]) for r in old} == {("SKIPPED", "schedule_changed")}
    not_shared = [
        r for r in found if _ts(r["due_at"]) > changed_at and (_ts(r["due_at"]) - created).seconds % 30
    ]
    assert {(r["state"], r["error"]) for r in not_shared} == {("SKIPPED", "schedule_changed")}
    [first_new] = [r for r in found if _ts(r["due_at"]) == new_first]
    assert first_new["state"] == "SUCCEEDED" and 0 <= first_new["lag_seconds"] < 5
    assert datetime.now(UTC) > new_first


def test_concurrent_patches_of_different_fields_all_apply(tmp_path: Path) -> None:
    # four API processes, so the PATCHes below really race (one process answers them one by one)
    stack = start_stack(tmp_path, "--workers", "1", "--api-processes", "4")
    try:
        _patch_at_once(stack)
    finally:
        stop_stack(stack)


def _patch_at_once(default_stack: Stack) -> None:
    from concurrent.futures import ThreadPoolExecutor

    status, job = default_stack.request("POST", "/jobs", _job("patched-at-once"))
    assert status == 201, job
    # eight clients each change one field of the same job at the same moment
    patches = [
        {"timeout_seconds": 1234},
        {"starting_deadline_seconds": 77},
        {"late_after_seconds": 30},
        {"expected_duration_seconds": 600},
        {"retry": {"max_attempts": 7}},
        {"catch_up": {"policy": "all", "max_runs": 3}},
        {"overlap": {"policy": "skip"}},
        {"name": "renamed-at-once"},
    ]
    with ThreadPoolExecutor(len(patches)) as pool:
        answers = list(
            pool.map(lambda p: default_stack.request("PATCH", f"/jobs/{job['job_id']}", p), patches)
        )
    assert [status for status, _ in answers] == [200] * len(patches), answers
    status, final = default_stack.request("GET", f"/jobs/{job['job_id']}")
    assert (final["timeout_seconds"], final["starting_deadline_seconds"], final["name"]) == (
        1234,
        77,
        "renamed-at-once",
    )
    assert (final["late_after_seconds"], final["expected_duration_seconds"]) == (30, 600)
    assert (final["retry"]["max_attempts"], final["catch_up"]["policy"], final["overlap"]["policy"]) == (
        7,
        "all",
        "skip",
    )
    assert final["version"] == job["version"] + len(patches)


def test_slots_due_in_a_pause_with_catch_up_none_are_skipped_paused_claimed_ahead_or_not(
    stack: Stack,
) -> None:
    # Given a rate(10 seconds) job (catch-up none) on a stack whose tick claims 3 s ahead
    status, job = stack.request("POST", "/jobs", _job("paused-slots", catch_up={"policy": "none"}))
    assert status == 201, job
    job_id = job["job_id"]

    def claimed_ahead() -> dict | None:
        _, page = stack.request("GET", f"/jobs/{job_id}/runs")
        ahead = [r for r in page["runs"] if r["state"] == "PENDING" and _ts(r["due_at"]) > datetime.now(UTC)]
        return ahead[0] if ahead else None

    # When it is paused while its next slot is already claimed, for 25 s, then resumed: the slot claimed ahead
    # is due x <= 3 s after the pause, so x + 10 and x + 20 s are due in it too, never claimed (3 slots)
    ahead = wait_for("a slot claimed ahead", claimed_ahead, timeout=30)
    assert stack.request("POST", f"/jobs/{job_id}/pause")[0] == 200
    paused_at = datetime.now(UTC)
    time.sleep(25)
    resumed_at = datetime.now(UTC)
    assert stack.request("POST", f"/jobs/{job_id}/resume")[0] == 200
    # Then every slot due in the pause is skipped, reason paused: the one claimed ahead (its run SKIPPED) and
    # those never claimed (no run)
    query = f"since={paused_at:%Y-%m-%dT%H:%M:%S.%f}Z&until={resumed_at - timedelta(seconds=1):%Y-%m-%dT%H:%M:%S.%f}Z"
    status, body = stack.request("GET", f"/jobs/{job_id}/slots?{query.replace('+', '%2B')}")
    assert status == 200, body
    slots = body["slots"]
    assert len(slots) >= 3, slots
    assert {(s["outcome"], s["reason"]) for s in slots} == {("skipped", "paused")}, slots
    assert ahead["run_id"] in {s["run_id"] for s in slots}
    assert any(s["run_id"] is None for s in slots)
