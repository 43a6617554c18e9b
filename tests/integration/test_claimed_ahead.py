"""Job actions govern runs already claimed (DESIGN.md section 5, "claimed ahead, decided at start").

The tick claims up to 75 s ahead (60 s period + 15 s margin): these tests claim a rate(10 seconds) job's
runs ahead, change the job (pause, delete, a schedule PATCH), and then start each run as its worker would
when its wake-up arrives, at its due time, on moto in-process with a fixed clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from duetime.config.deps import Deps
from duetime.domain.api_models import CreateJobRequest, UpdateJobRequest
from duetime.domain.errors import StartRejectedError
from duetime.domain.models import CatchUpPolicy, ContainerTask, Run, RunMessage, RunState, ScheduleSpec
from duetime.services import jobs, runs, sweeper
from duetime.services.runs import NotStartedError, message_for
from tests.conftest import T0
from tests.helpers import drain


def _rate_job(deps: Deps, *, catch_up: CatchUpPolicy | None = None, every: str = "rate(10 seconds)"):
    request = CreateJobRequest(
        name="ten",
        schedule=ScheduleSpec(expression=every),
        task=ContainerTask(command=["true"]),
        catch_up=catch_up or CatchUpPolicy(),
    )
    return jobs.create_job(request, tenant="t1", deps=deps)


def _runs(deps: Deps, job_id: str) -> list[Run]:
    return list(reversed(deps.store.list_runs(job_id, limit=200)))


def _start_at_due(deps: Deps, clock, run: Run) -> Run | str:
    """Move the clock to the run's due time (if it lies ahead) and start it as a worker would."""
    if run.due_at > clock.now():
        clock.set(run.due_at)
    try:
        return runs.start(message_for(run), deps, owner="w1")
    except StartRejectedError:
        return "not started"


def _parsed(body: dict) -> dict:
    return RunMessage.model_validate(body).model_dump()


def _state(deps: Deps, run: Run) -> tuple[str, str | None, str | None]:
    stored = deps.store.get_run(run.job_id, run.due_at)
    assert stored is not None
    return stored.state.value, stored.error, stored.held


def test_a_submit_claims_the_look_ahead_and_every_claimed_run_carries_its_trigger(deps: Deps) -> None:
    job = _rate_job(deps)
    claimed = _runs(deps, job.job_id)
    # 10 s .. 70 s are inside the 75 s look-ahead
    assert [int((r.due_at - T0).total_seconds()) for r in claimed] == [10, 20, 30, 40, 50, 60, 70]
    assert {message_for(r).trigger for r in claimed} == {claimed[0].trigger}


@pytest.mark.parametrize(
    ("policy", "expect_started"),
    [("none", []), ("latest", [30]), ("all", [10, 20, 30])],
)
def test_runs_due_during_a_pause_are_held_and_the_resume_applies_the_catch_up_policy(
    deps: Deps, clock, policy: str, expect_started: list[int]
) -> None:
    # Given a rate(10 seconds) job with 7 runs claimed ahead, paused at T0+5 s
    job = _rate_job(deps, catch_up=CatchUpPolicy(policy=policy))
    claimed = _runs(deps, job.job_id)
    clock.set(T0 + timedelta(seconds=5))
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    # When the runs due at 10, 20 and 30 s arrive at their workers while it is paused
    for run in claimed[:3]:
        assert _start_at_due(deps, clock, run) == "not started"
    # Then none started: each is held, PENDING, out of the queue
    assert [_state(deps, r) for r in claimed[:3]] == [("PENDING", None, "paused")] * 3
    # When the job is resumed at T0+35 s (40 s of pause... the runs due at 40 s+ were never reached)
    clock.set(T0 + timedelta(seconds=35))
    drain(deps.settings.queue_url("small"))
    jobs.resume_job(job.job_id, tenant="t1", deps=deps)
    # Then the policy decides among the held runs: the kept ones are sent again, the others SKIPPED (paused)
    released = [
        int((r.due_at - T0).total_seconds())
        for r in claimed[:3]
        if _state(deps, r) == ("PENDING", None, None)
    ]
    assert released == expect_started
    skipped = [r for r in claimed[:3] if _state(deps, r)[0] == "SKIPPED"]
    assert [_state(deps, r)[1] for r in skipped] == ["paused"] * (3 - len(expect_started))
    woken = sorted(
        int((m["due_at"] - T0).total_seconds()) for m in map(_parsed, drain(deps.settings.queue_url("small")))
    )
    assert [w for w in woken if w <= 30] == expect_started
    # And each released run starts once its message comes; the job counts what the pause dropped
    for run in claimed[:3]:
        if _state(deps, run)[0] == "PENDING":
            started = runs.start(message_for(run), deps, owner="w1")
            assert started.state is RunState.RUNNING
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.missed_slots == 3 - len(expect_started)
    # And the runs due after the resume start as usual
    assert isinstance(_start_at_due(deps, clock, claimed[3]), Run)


def test_a_completed_one_off_whose_run_is_claimed_can_be_paused_and_its_run_waits_for_the_resume(
    deps: Deps, clock
) -> None:
    # Given a one-off due in 30 s: its submit claims its run and COMPLETES the job
    request = CreateJobRequest(
        name="once",
        schedule=ScheduleSpec(expression=f"at({T0 + timedelta(seconds=30):%Y-%m-%dT%H:%M:%S})"),
        task=ContainerTask(command=["true"]),
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    assert job.state.value == "COMPLETED"
    (run,) = _runs(deps, job.job_id)
    # When it is paused before its run is due, the run's wake-up starts nothing: it is held
    assert jobs.pause_job(job.job_id, tenant="t1", deps=deps).state.value == "PAUSED"
    assert _start_at_due(deps, clock, run) == "not started"
    assert _state(deps, run) == ("PENDING", None, "paused")
    # When it is resumed, the catch-up policy (latest) runs it, and the job is COMPLETED again
    drain(deps.settings.queue_url("small"))
    assert jobs.resume_job(job.job_id, tenant="t1", deps=deps).state.value == "COMPLETED"
    assert _state(deps, run) == ("PENDING", None, None)
    assert [_parsed(m)["due_at"] for m in drain(deps.settings.queue_url("small"))] == [run.due_at]
    assert runs.start(message_for(run), deps, owner="w1").state is RunState.RUNNING


def test_a_pause_longer_than_the_look_ahead_counts_the_unclaimed_slots_and_latest_runs_the_newest(
    deps: Deps, clock
) -> None:
    # Given a job paused at T0+5 s with its 7 claimed runs held, resumed 10 minutes later
    job = _rate_job(deps)
    claimed = _runs(deps, job.job_id)
    clock.set(T0 + timedelta(seconds=5))
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    for run in claimed:
        _start_at_due(deps, clock, run)
    clock.set(T0 + timedelta(seconds=605))
    resumed = jobs.resume_job(job.job_id, tenant="t1", deps=deps)
    # Then of the 60 slots due in the pause (7 held, 53 never claimed) only the newest (600 s) runs
    pending = [r for r in _runs(deps, job.job_id) if r.state is RunState.PENDING and r.due_at <= clock.now()]
    assert [int((r.due_at - T0).total_seconds()) for r in pending] == [600]
    assert pending[0].held is None and pending[0].missed_slots == 59
    assert all(_state(deps, r)[:2] == ("SKIPPED", "paused") for r in claimed)
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.missed_slots == 59
    # (and the resume's answer says so too: it shows the job as stored after the held runs were skipped)
    assert resumed.missed_slots == 59
    # And the schedule continues from its first slot after now
    assert resumed.next_fire_at is not None and resumed.next_fire_at > clock.now()


def test_a_manual_run_of_a_paused_job_is_not_held(deps: Deps, clock) -> None:
    job = _rate_job(deps)
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    manual = jobs.trigger_job(job.job_id, tenant="t1", deps=deps)
    assert runs.start(message_for(manual), deps, owner="w1").state is RunState.RUNNING


def test_the_sweeper_releases_a_held_run_the_resume_missed(deps: Deps, clock, monkeypatch) -> None:
    # Given a held run, and a resume that did not see it (the index lagged)
    job = _rate_job(deps, catch_up=CatchUpPolicy(policy="all"))
    first = _runs(deps, job.job_id)[0]
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    _start_at_due(deps, clock, first)
    with monkeypatch.context() as patched:
        patched.setattr(jobs, "held_runs", lambda *_a, **_k: [])
        patched.setattr(jobs, "release_held", lambda *_a, **_k: (0, 0))
        jobs.resume_job(job.job_id, tenant="t1", deps=deps)
    assert _state(deps, first) == ("PENDING", None, "paused")
    # When the sweeper reaches its re-check time
    clock.advance(runs.HOLD_RECHECK_SECONDS + 1)
    result = sweeper.sweep(job.shard, deps)
    # Then it settled the run as the resume would have (catch-up `all`: it runs)
    assert result.held_rechecked == 1
    assert _state(deps, first) == ("PENDING", None, None)
    assert runs.start(message_for(first), deps, owner="w1").state is RunState.RUNNING


def test_the_sweeper_keeps_holding_while_the_job_stays_paused(deps: Deps, clock) -> None:
    job = _rate_job(deps)
    first = _runs(deps, job.job_id)[0]
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    _start_at_due(deps, clock, first)
    clock.advance(runs.HOLD_RECHECK_SECONDS + 1)
    sweeper.sweep(job.shard, deps)
    stored = deps.store.get_run(first.job_id, first.due_at)
    assert stored is not None and stored.held == "paused" and stored.watch_at is not None
    assert stored.watch_at > clock.now()


def test_delete_ends_every_run_claimed_ahead_at_once_and_a_late_message_starts_nothing(
    deps: Deps, clock
) -> None:
    # Given 7 runs claimed ahead, the first one already RUNNING
    job = _rate_job(deps)
    claimed = _runs(deps, job.job_id)
    running = _start_at_due(deps, clock, claimed[0])
    assert isinstance(running, Run)
    # When the job is deleted without cancel_running
    jobs.delete_job(job.job_id, tenant="t1", deps=deps)
    # Then the running run continues and every other run ended SKIPPED (deleted) at once
    assert _state(deps, claimed[0])[0] == "RUNNING"
    assert {_state(deps, r)[:2] for r in claimed[1:]} == {("SKIPPED", "deleted")}
    # And their messages, when they come, start nothing
    for run in claimed[1:]:
        assert _start_at_due(deps, clock, run) == "not started"


def test_a_run_whose_job_was_deleted_meanwhile_is_skipped_at_its_start(
    deps: Deps, clock, monkeypatch
) -> None:
    job = _rate_job(deps)
    first = _runs(deps, job.job_id)[0]
    monkeypatch.setattr(jobs, "settle_claimed_ahead", lambda *_a, **_k: 0)  # as if the DELETE died after it
    jobs.delete_job(job.job_id, tenant="t1", deps=deps)
    with pytest.raises(NotStartedError):
        runs.start(message_for(first), deps, owner="w1")
    assert _state(deps, first)[:2] == ("SKIPPED", "deleted")


def test_a_schedule_patch_takes_effect_from_its_next_slot_and_old_claimed_slots_do_not_run(
    deps: Deps, clock
) -> None:
    # Given a rate(10 seconds) job with 7 runs claimed ahead (10..70 s)
    job = _rate_job(deps)
    claimed = _runs(deps, job.job_id)
    # When its schedule becomes every minute, at T0+15 s
    clock.set(T0 + timedelta(seconds=15))
    patched = jobs.update_job(
        job.job_id,
        UpdateJobRequest.model_validate({"schedule": {"expression": "* * * * *"}}),
        tenant="t1",
        deps=deps,
    )
    # Then the old slots claimed ahead ended SKIPPED (schedule_changed), but the one the new schedule shares
    # (T0+60 s, a whole minute) is kept, and the new schedule goes on from its next slot
    states = {int((r.due_at - T0).total_seconds()): _state(deps, r)[:2] for r in claimed[1:]}
    assert states == {
        20: ("SKIPPED", "schedule_changed"),
        30: ("SKIPPED", "schedule_changed"),
        40: ("SKIPPED", "schedule_changed"),
        50: ("SKIPPED", "schedule_changed"),
        60: ("PENDING", None),
        70: ("SKIPPED", "schedule_changed"),
    }
    assert patched.next_fire_at == T0 + timedelta(seconds=120)
    assert isinstance(_start_at_due(deps, clock, claimed[5]), Run)


@pytest.mark.parametrize(
    ("policy", "expect_started"), [("none", []), ("latest", [30]), ("all", [10, 20, 30])]
)
def test_runs_claimed_ahead_that_start_past_the_tolerance_follow_the_catch_up_policy(
    deps: Deps, clock, policy: str, expect_started: list[int]
) -> None:
    # Given runs due at 10, 20, 30 s claimed ahead, delivered only at 50 s (no worker was free), tolerance 15 s
    job = _rate_job(deps, catch_up=CatchUpPolicy(policy=policy, tolerance_seconds=15))
    claimed = _runs(deps, job.job_id)
    clock.set(T0 + timedelta(seconds=50))
    started = []
    for run in claimed[:4]:  # 40 s is 10 s late: on time within the tolerance
        if isinstance(_start_at_due(deps, clock, run), Run):
            started.append(int((run.due_at - T0).total_seconds()))
    # Then the missed ones (10, 20, 30 s: more than 15 s late) follow the policy; 40 s runs
    assert started == [*expect_started, 40]
    missed = [r for r in claimed[:3] if _state(deps, r)[0] == "SKIPPED"]
    assert {_state(deps, r)[1] for r in missed} <= {"missed"}
    stored = deps.store.get_job(job.job_id)
    assert stored is not None and stored.missed_slots == 3 - len(expect_started)


def test_a_run_of_a_run_now_job_is_never_dropped_for_lateness(deps: Deps, clock) -> None:
    request = CreateJobRequest(
        name="once", task=ContainerTask(command=["true"]), catch_up=CatchUpPolicy(policy="none")
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    [run] = _runs(deps, job.job_id)
    clock.advance(3600)
    assert runs.start(message_for(run), deps, owner="w1").state is RunState.RUNNING


def test_a_message_without_a_trigger_reads_it_from_the_row(deps: Deps, clock) -> None:
    job = _rate_job(deps)
    first = _runs(deps, job.job_id)[0]
    jobs.delete_job(job.job_id, tenant="t1", deps=deps)
    message = message_for(first).model_copy(update={"trigger": None})
    clock.set(first.due_at)
    with pytest.raises(StartRejectedError):
        runs.start(message, deps, owner="w1")


def test_a_redriven_dead_letter_backs_off_from_the_fresh_budgets_first_step(deps: Deps, clock) -> None:
    from duetime.domain.models import RetryPolicy
    from duetime.services.worker import Worker

    # Given a job that always fails, 2 attempts with 10 s then 40 s backoff, dead-lettered
    request = CreateJobRequest(
        name="fails",
        task=ContainerTask(command=["sh", "-c", "exit 1"]),
        retry=RetryPolicy(max_attempts=2, backoff_seconds=10, backoff_multiplier=4, jitter="none"),
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    worker = Worker(deps, "small", owner="w")
    worker.poll_once()
    [run] = deps.store.list_runs(job.job_id)
    assert run.retry_at == clock.now() + timedelta(seconds=10)
    clock.advance(10)
    drain(deps.settings.queue_url("small"))
    deps.queues.send("small", message_for(run, attempt=2))
    worker.poll_once()
    [run] = deps.store.list_runs(job.job_id)
    assert (run.state, run.dead_lettered, run.attempt) == (RunState.FAILED, True, 2)
    # When it is re-driven and its attempt 3 fails too
    jobs.redrive(run.run_id, tenant="t1", deps=deps)
    worker.poll_once()
    [run] = deps.store.list_runs(job.job_id)
    # Then attempt 4 waits the first step of the new budget (10 s), not the third of the old one (160 s)
    assert (run.state, run.attempt) == (RunState.RETRY_WAIT, 3)
    assert run.retry_at == clock.now() + timedelta(seconds=10)


def test_a_slot_due_in_the_pause_whose_wake_up_never_reached_a_worker_is_decided_by_the_resume(
    deps: Deps, clock
) -> None:
    # Given a paused job whose runs due at 10 and 20 s were never delivered (workers busy)
    job = _rate_job(deps, catch_up=CatchUpPolicy(policy="none"))
    claimed = _runs(deps, job.job_id)
    clock.set(T0 + timedelta(seconds=5))
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    # When it is resumed at 25 s, and the late wake-ups arrive afterwards
    clock.set(T0 + timedelta(seconds=25))
    jobs.resume_job(job.job_id, tenant="t1", deps=deps)
    # Then both were decided by the pause's catch-up (none: SKIPPED, paused) and never start
    assert [_state(deps, r)[:2] for r in claimed[:2]] == [("SKIPPED", "paused")] * 2
    assert [_start_at_due(deps, clock, r) for r in claimed[:2]] == ["not started"] * 2
    # And the run due at 30 s, after the resume, starts
    assert isinstance(_start_at_due(deps, clock, claimed[2]), Run)


@pytest.mark.parametrize(("policy", "runs_it"), [("latest", True), ("none", False)])
def test_a_late_wake_up_whose_newer_slots_already_ran_is_still_the_newest_missed_slot(
    deps: Deps, clock, policy: str, runs_it: bool
) -> None:
    # Given the run due at 10 s lost its wake-up while the runs due at 20 .. 70 s ran on time
    job = _rate_job(deps, catch_up=CatchUpPolicy(policy=policy))
    claimed = _runs(deps, job.job_id)
    for run in claimed[1:]:
        started = _start_at_due(deps, clock, run)
        assert isinstance(started, Run)
        runs.finish(
            started, deps, fencing_token=started.fencing_token, outcome=RunState.SUCCEEDED, exit_code=0
        )
    # When the sweeper's re-sent wake-up starts it at 85 s (75 s late: missed)
    clock.set(T0 + timedelta(seconds=85))
    outcome = _start_at_due(deps, clock, claimed[0])
    # Then it is the newest missed slot still to decide: `latest` runs it, `none` does not
    assert isinstance(outcome, Run) is runs_it
    assert _state(deps, claimed[0])[0] == ("RUNNING" if runs_it else "SKIPPED")


def test_a_run_due_before_a_schedule_change_still_runs_when_its_wake_up_comes_late(deps: Deps, clock) -> None:
    job = _rate_job(deps)
    first = _runs(deps, job.job_id)[0]
    clock.set(T0 + timedelta(seconds=12))  # the 10 s run's wake-up has not reached a worker yet
    jobs.update_job(
        job.job_id,
        UpdateJobRequest.model_validate({"schedule": {"expression": "rate(7 minutes)"}}),
        tenant="t1",
        deps=deps,
    )
    assert runs.start(message_for(first), deps, owner="w1").state is RunState.RUNNING


def test_a_manual_run_of_a_paused_job_is_not_held_back_by_its_held_runs(deps: Deps, clock) -> None:
    from duetime.domain.models import OverlapPolicy

    request = CreateJobRequest(
        name="skip",
        schedule=ScheduleSpec(expression="rate(10 seconds)"),
        task=ContainerTask(command=["true"]),
        overlap=OverlapPolicy(policy="skip"),
    )
    job = jobs.create_job(request, tenant="t1", deps=deps)
    first = _runs(deps, job.job_id)[0]
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    assert _start_at_due(deps, clock, first) == "not started"  # held
    clock.advance(5)
    manual = jobs.trigger_job(job.job_id, tenant="t1", deps=deps)
    assert runs.start(message_for(manual), deps, owner="w1").state is RunState.RUNNING


def test_a_resume_releases_the_runs_it_held_though_the_index_lags(deps: Deps, clock, monkeypatch) -> None:
    # Given a paused job whose held run (10 s) the active-runs index does not show yet
    job = _rate_job(deps)
    claimed = _runs(deps, job.job_id)
    clock.set(T0 + timedelta(seconds=5))
    jobs.pause_job(job.job_id, tenant="t1", deps=deps)
    _start_at_due(deps, clock, claimed[0])
    monkeypatch.setattr(deps.store, "query_active", lambda *_a, **_k: [])
    # When it is resumed 10 minutes later (latest)
    clock.set(T0 + timedelta(seconds=605))
    jobs.resume_job(job.job_id, tenant="t1", deps=deps)
    # Then the newest slot of the pause (600 s), never claimed before, is the one released, and it starts
    [newest] = [r for r in _runs(deps, job.job_id) if r.due_at == T0 + timedelta(seconds=600)]
    assert (newest.state, newest.held) == (RunState.PENDING, None)
    assert runs.start(message_for(newest), deps, owner="w1").state is RunState.RUNNING
