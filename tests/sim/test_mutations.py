"""The simulation's invariants bite: break the core on purpose and a seed must report it (``make faults``).

Each mutation removes one safeguard of DESIGN.md sections 4 and 5; seeds run until one violates an invariant
(or the budget runs out, which fails the test: the harness would have missed a real bug).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from duetime.adapters.aws import dynamodb as store
from duetime.domain.errors import LeaseLostError
from duetime.services import sweeper
from tests.sim.simulation import Simulation, moto_world

pytestmark = [
    pytest.mark.sim,
    pytest.mark.faults,
    pytest.mark.skipif(os.environ.get("DUETIME_FAULTS_FULL") != "1", reason="make faults only"),
]


@contextmanager
def _patched(target: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, replacement)
    try:
        yield
    finally:
        setattr(target, name, original)


def _finish_without_fencing() -> Any:
    """Finish and lease expiry check only that the run is RUNNING, not whose lease it is."""

    def end_attempt(self: Any, end: Any) -> Any:
        update = self._end_attempt_update(end)
        update.conditions.pop("fencing_token")
        try:
            return self._update_run(end.job_id, end.due_at, update)
        except store.ConditionFailedError:
            raise LeaseLostError("mutant") from None

    return _patched(store.DynamoStore, "end_attempt", end_attempt)


def _claim_without_condition() -> Any:
    """Claim step 1 overwrites a run that already exists."""

    def put_new_run(self: Any, run: Any) -> None:
        item = store.serialize(store.run_to_item(run, retention_days=self.run_retention_days))
        self._ddb.put_item(TableName=self.runs_table, Item=item)

    return _patched(store.DynamoStore, "put_new_run", put_new_run)


def _sweeper_never_resends() -> Any:
    """A PENDING run whose message was lost is never sent again."""
    return _patched(sweeper, "_resend", lambda run, deps: True)


@pytest.mark.parametrize(
    "mutation",
    [_finish_without_fencing, _claim_without_condition, _sweeper_never_resends],
    ids=lambda m: m.__name__.strip("_"),
)
def test_a_broken_safeguard_is_caught_by_some_seed(mutation: Callable[[], Any]) -> None:
    with moto_world(), mutation():
        for seed in range(300):
            result = Simulation(seed).run()
            if result.violations:
                print(f"seed {seed} caught it: {result.violations[0][:200]}")
                return
    pytest.fail("300 seeds ran with a safeguard removed and no invariant noticed")
