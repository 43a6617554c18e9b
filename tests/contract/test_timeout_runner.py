"""The in-process timeout runner over the adapters' ports: a plan is applied once; a second start of the
same plan, or a plan for an attempt its worker settled first, returns False and changes nothing."""

from __future__ import annotations

from datetime import timedelta

from duetime.domain.lifecycle import message_for
from duetime.domain.models import OnTimeout, Run, RunState, Trigger
from duetime.domain.ports import ReceivedMessage, TimeoutPlan
from duetime.services.timeouts import InProcessTimeoutRunner, execution_name
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import attempt_end, make_job, make_run, put_run, start

STUCK_AT = T0 + timedelta(seconds=320)  # the attempt's 300 s deadline, its kill grace and a beat interval on


def _stuck(adapters: Adapters, tier: str, job_id: str, **job_kw: object) -> Run:
    job = make_job(job_id, tier=tier, backoff_seconds=5.0, **job_kw)  # type: ignore[arg-type]
    return start(adapters.store, put_run(adapters.store, job, T0), now=T0, owner="stuck")


def _plan(run: Run, *, retry: bool = False, triggered: tuple[Run, object] | None = None) -> TimeoutPlan:
    name = execution_name(run)
    end = attempt_end(run, RunState.TIMED_OUT, now=STUCK_AT, reason="timeout_handler").with_fence(
        execution=name
    )
    return TimeoutPlan(
        run=run,
        name=name,
        end=end,
        retry=(message_for(run, attempt=run.attempt + 1), 0) if retry else None,
        triggered=triggered,  # type: ignore[arg-type]
    )


def _drain(adapters: Adapters, tier: str) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    while batch := adapters.queues.receive(tier, max_messages=10, wait_seconds=0, visibility_seconds=30):
        got += batch
    return got


def test_a_plan_is_applied_once_and_its_second_start_changes_nothing(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    stuck = _stuck(adapters, tier, "stuck-retry")
    plan = _plan(stuck, retry=True)
    runner = InProcessTimeoutRunner(adapters.store, adapters.queues)

    assert runner.start(plan) is True
    fenced = adapters.store.get_run(stuck.job_id, T0)
    assert fenced is not None
    assert (fenced.state, fenced.fencing_token, fenced.timeout_execution) == (
        RunState.RETRY_WAIT,
        2,
        plan.name,
    )
    assert fenced.retry_at == STUCK_AT + timedelta(seconds=5)
    assert [(a.state, a.reason, a.fencing_token) for a in fenced.attempts] == [
        (RunState.TIMED_OUT, "timeout_handler", 1)
    ]
    assert [m.message for m in _drain(adapters, tier)] == [message_for(stuck, attempt=2)]

    assert runner.start(plan) is False
    assert adapters.store.get_run(stuck.job_id, T0) == fenced
    assert _drain(adapters, tier) == []


def test_a_plan_for_an_attempt_its_worker_settled_first_returns_false(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    stuck = _stuck(adapters, tier, "settled")
    done = adapters.store.end_attempt(
        attempt_end(stuck, RunState.SUCCEEDED, now=STUCK_AT - timedelta(seconds=1))
    )
    runner = InProcessTimeoutRunner(adapters.store, adapters.queues)
    assert runner.start(_plan(stuck, retry=True)) is False
    assert adapters.store.get_run(stuck.job_id, T0) == done
    assert _drain(adapters, tier) == []


def test_a_fail_plan_ends_the_run_timed_out_and_the_stuck_worker_is_fenced(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    stuck = _stuck(adapters, tier, "stuck-fail", on_timeout=OnTimeout(action="fail"))
    plan = _plan(stuck)
    runner = InProcessTimeoutRunner(adapters.store, adapters.queues)
    assert runner.start(plan) is True
    ended = adapters.store.get_run(stuck.job_id, T0)
    assert ended is not None
    assert (ended.state, ended.fencing_token, ended.timeout_outcome) == (
        RunState.TIMED_OUT,
        2,
        "failed, no retry",
    )
    assert runner.start(plan) is False
    assert adapters.store.get_run(stuck.job_id, T0) == ended
    assert _drain(adapters, tier) == []


def test_a_trigger_plan_puts_the_triggered_run_once(adapters: Adapters) -> None:
    tier = adapters.new_tier()
    target = make_job("target", tier=tier)
    stuck = _stuck(adapters, tier, "stuck-trigger", on_timeout=OnTimeout(action="trigger", job_id="target"))
    triggered = make_run(target, STUCK_AT, trigger=Trigger.TIMEOUT_HANDLER, triggered_by=stuck.run_id)
    plan = _plan(stuck, triggered=(triggered, message_for(triggered)))
    runner = InProcessTimeoutRunner(adapters.store, adapters.queues)
    assert runner.start(plan) is True
    assert adapters.store.get_run("target", STUCK_AT) == triggered
    assert [m.message for m in _drain(adapters, tier)] == [message_for(triggered)]
    assert runner.start(plan) is False
    assert adapters.store.get_run("target", STUCK_AT) == triggered
    assert _drain(adapters, tier) == []
