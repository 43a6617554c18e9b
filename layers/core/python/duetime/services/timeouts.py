"""Timeout handling for stuck or partitioned workers: the timeout-handler state machine (Step Functions).

The worker enforces ``timeout_seconds`` itself (SIGTERM, ``kill_grace_seconds``, SIGKILL, TIMED_OUT). When
it cannot (stuck, paused, cut off), its run stays RUNNING past the deadline; the sweeper sees that on the
watchdog GSI and starts one execution of the state machine below, named from the run id and attempt so a
second start is a no-op (DESIGN.md section 5). The execution:

1. **Fence**: one conditional DynamoDB UpdateItem ends the attempt as TIMED_OUT (or RETRY_WAIT for
   ``on_timeout.action = retry`` with attempts left) and bumps the fencing token, only if the run is still
   RUNNING under the stuck worker's token. If the worker finished first, the condition fails and the
   execution ends (``AlreadySettled``): one outcome, never two. The stuck worker's session finds the run
   fenced at its next beat and kills its task; its finish is rejected.
2. **Stop the task** where the platform allows (ECS StopTask, for a per-task container ARN).
3. **Apply ``on_timeout``**: ``retry`` sends the next attempt's message with the backoff delay (SQS);
   ``trigger`` puts the triggered job's run (conditional, idempotent) and sends its message; ``fail`` is
   done by the fence alone.

The sweeper decides the whole plan here (:func:`plan_timeout`: the same attempt end a worker's own finish
applies, :func:`duetime.domain.lifecycle.decide_attempt_end`, plus the fence) and hands it to the timeout
runner port: on AWS the Step Functions adapter (``duetime.adapters.aws.stepfunctions``: every step a direct
service integration, no Lambda); without a state machine, :class:`InProcessTimeoutRunner` runs the same
steps through the store and queue ports.
"""

from __future__ import annotations

import hashlib

from duetime.config.observability import emit_metric, logger
from duetime.domain.errors import AlreadyClaimedError, LeaseLostError
from duetime.domain.lifecycle import (
    MAX_MESSAGE_DELAY_SECONDS,
    decide_attempt_end,
    delay_seconds,
    message_for,
    timeout_triggered_run,
)
from duetime.domain.models import Run, RunState
from duetime.domain.ports import RunQueue, Store, TimeoutPlan
from duetime.services.deps import Deps
from duetime.services.runs import triggerable

#: Step Functions execution names: 1-80 characters of [A-Za-z0-9-_].
MAX_EXECUTION_NAME = 80


def execution_name(run: Run) -> str:
    """``<run id>-<attempt>`` with ``.`` as ``-``; hashed when longer than Step Functions allows."""
    name = f"{run.run_id.replace('.', '-')}-a{run.attempt}"
    if len(name) <= MAX_EXECUTION_NAME:
        return name
    digest = hashlib.sha256(run.run_id.encode()).hexdigest()[:40]
    return f"run-{digest}-a{run.attempt}"


def plan_timeout(run: Run, deps: Deps) -> TimeoutPlan:
    """Everything that settles ``run``'s current attempt as timed out under its ``on_timeout``.

    The fence is the attempt end a worker applies at its own deadline
    (:func:`~duetime.domain.lifecycle.decide_attempt_end`) with the fencing token raised, conditional on
    RUNNING under the stuck worker's token. Then: the retry's wake-up (when its backoff fits a message
    delay), the run ``on_timeout: trigger`` creates, and the overlap successor's wake-up when the run ends.
    """
    now = deps.clock.now()
    name = execution_name(run)
    end = decide_attempt_end(
        run,
        outcome=RunState.TIMED_OUT,
        now=now,
        fencing_token=run.fencing_token,
        watch_after_seconds=deps.settings.first_watch_seconds,
        worker=run.lease_owner,
        error=f"timed out after {run.timeout_seconds} s; the worker did not stop it (timeout handler)",
        reason="timeout_handler",
    ).with_fence(execution=name)
    retry = triggered = successor = None
    if end.retry_at is not None and (end.retry_at - now).total_seconds() <= MAX_MESSAGE_DELAY_SECONDS:
        retry = (
            message_for(run, attempt=run.attempt + 1, retry_at=end.retry_at),
            delay_seconds(end.retry_at, now),
        )
    if run.on_timeout.action == "trigger" and run.on_timeout.job_id:
        target = deps.store.get_job(run.on_timeout.job_id)
        if target is not None and triggerable(target, run.tenant):
            new = timeout_triggered_run(
                run, target, now=now, watch_after_seconds=deps.settings.first_watch_seconds
            )
            triggered = (new, message_for(new))
    if end.terminal and run.overlap.enforced:
        # the run ends here: its overlap successor, waiting PENDING behind it, is woken at once
        for due_at in deps.store.query_active_after(run.job_id, after=run.due_at, limit=1):
            waiting = deps.store.get_run(run.job_id, due_at)
            if waiting is not None and waiting.state is RunState.PENDING and waiting.held is None:
                successor = message_for(waiting)
    return TimeoutPlan(run=run, name=name, end=end, retry=retry, triggered=triggered, successor=successor)


class InProcessTimeoutRunner:
    """Runs a plan's steps in this process through the ports, in the state machine's order: fence (stop
    here if the run was already settled), retry wake-up, triggered run (put if new) and its wake-up, the
    overlap successor's wake-up. Used where no state machine is configured."""

    def __init__(self, store: Store, queues: RunQueue) -> None:
        self.store = store
        self.queues = queues

    def start(self, plan: TimeoutPlan) -> bool:
        try:
            self.store.end_attempt(plan.end)
        except LeaseLostError:
            return False  # the worker (or another handler) settled it first
        if plan.retry is not None:
            message, delay = plan.retry
            self.queues.send(message.tier or plan.run.task.tier, message, delay=delay)
        if plan.triggered is not None:
            run, message = plan.triggered
            try:
                self.store.put_new_run(run)
            except AlreadyClaimedError:
                pass
            self.queues.send(run.task.tier, message)
        if plan.successor is not None:
            self.queues.send(plan.successor.tier or plan.run.task.tier, plan.successor)
        return True


def start_handler(run: Run, deps: Deps) -> str:
    """Start the timeout handler for ``run``'s current attempt; a second start for the same attempt is a no-op.

    Returns the execution name. ``deps.timeouts`` runs it (Step Functions on AWS); without one, it runs
    in-process (:class:`InProcessTimeoutRunner`) with the same steps and the same conditions.

    Raises:
        whatever the runner's backing service raises for faults other than "already started" (the sweeper
        retries at its next pass).
    """
    plan = plan_timeout(run, deps)
    runner = deps.timeouts or InProcessTimeoutRunner(deps.store, deps.queues)
    if runner.start(plan):
        _count(plan)
        logger.warning("timeout handler started", extra={"run_id": run.run_id, "execution": plan.name})
    return plan.name


def _count(plan: TimeoutPlan) -> None:
    """The metrics of a fenced attempt, the same as when a worker reports the timeout itself."""
    emit_metric("RunTimedOut")
    if plan.dead_letters:
        emit_metric("RunDeadLettered")
        logger.error("run dead-lettered", extra={"run_id": plan.run.run_id, "attempts": plan.run.attempt})


__all__ = ["InProcessTimeoutRunner", "TimeoutPlan", "execution_name", "plan_timeout", "start_handler"]
