"""The simulation's invariants bite: break the core on purpose and a seed must report it, on both backends.

Each mutation removes one safeguard of DESIGN.md sections 4 and 5 from the adapter the backend runs
(``DynamoStore`` on aws, ``SqliteStore`` on sqlite) or from a service; seeds run until one violates an
invariant (or the budget runs out, which fails the test: the harness would have missed a real bug). The sqlite
variants run in `make test` (a few seeds each); the aws ones under `make faults` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from duetime.adapters.aws import dynamodb
from duetime.adapters.sqlite import store as sqlite_store
from duetime.domain.models import RunState
from duetime.domain.timeutil import to_iso
from duetime.services import sweeper
from tests.sim.simulation import Simulation, world

pytestmark = [pytest.mark.sim, pytest.mark.faults]

_FULL = os.environ.get("DUETIME_FAULTS_FULL") == "1"
#: the moto variants are slow (up to 300 moto seeds for a mutation caught late): `make faults` only
_BACKENDS = [
    "sqlite",
    pytest.param("aws", marks=pytest.mark.skipif(not _FULL, reason="the moto variant: make faults only")),
]
BUDGET = 300


@contextmanager
def _patched(target: Any, name: str, replacement: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, replacement)
    try:
        yield
    finally:
        setattr(target, name, original)


def _finish_without_fencing(backend: str) -> Any:
    """Finish and lease expiry check only that the run is RUNNING, not whose lease it is (in the one place
    each store builds an attempt end's condition, so single and batched ends alike)."""
    if backend == "aws":
        original_update = dynamodb.DynamoStore._end_attempt_update  # noqa: SLF001

        def end_attempt_update(self: Any, end: Any) -> Any:
            update = original_update(self, end)
            update.conditions.pop("fencing_token")
            return update

        return _patched(dynamodb.DynamoStore, "_end_attempt_update", end_attempt_update)

    original_edit = sqlite_store._end_edit  # noqa: SLF001

    def end_edit(end: Any) -> Any:
        condition, change = original_edit(end)

        def any_token(row: Any) -> bool:
            if row.get("state") == RunState.RUNNING.value:
                row = sqlite_store._RunRow(dict(row.doc, fencing_token=end.expected_token), row.index)  # noqa: SLF001
            return condition(row)

        return any_token, change

    return _patched(sqlite_store, "_end_edit", end_edit)


def _claim_without_condition(backend: str) -> Any:
    """Claim step 1 overwrites a run that already exists."""
    if backend == "aws":

        def put_new_run(self: Any, run: Any) -> None:
            item = dynamodb.serialize(dynamodb.run_to_item(run, retention=self.retention))
            self._ddb.put_item(TableName=self.runs_table, Item=item)

        return _patched(dynamodb.DynamoStore, "put_new_run", put_new_run)

    def overwrite(store: Any, conn: Any, run: Any) -> None:
        row = sqlite_store._RunRow(run.model_dump(mode="json"), sqlite_store._run_index(run))  # noqa: SLF001
        conn.execute("DELETE FROM runs WHERE job_id = ? AND due_at = ?", (run.job_id, to_iso(run.due_at)))
        store._save_run(conn, row, insert=True)  # noqa: SLF001

    def sqlite_put_new_run(self: Any, run: Any) -> None:
        with self.db.transaction() as conn:
            overwrite(self, conn, run)

    def sqlite_put_new_runs(self: Any, runs: Any) -> list[bool]:  # the tick's batched step 1
        with self.db.transaction() as conn:
            for run in runs:
                overwrite(self, conn, run)
        return [True] * len(runs)

    stack = ExitStack()
    stack.enter_context(_patched(sqlite_store.SqliteStore, "put_new_run", sqlite_put_new_run))
    stack.enter_context(_patched(sqlite_store.SqliteStore, "put_new_runs", sqlite_put_new_runs))
    return stack


def _sweeper_never_resends(backend: str) -> Any:  # noqa: ARG001 - a service's safeguard: both backends
    """A PENDING run whose message was lost is never sent again."""
    return _patched(sweeper, "_resend", lambda run, deps: True)


@pytest.mark.parametrize("backend", _BACKENDS)
@pytest.mark.parametrize(
    "mutation",
    [_finish_without_fencing, _claim_without_condition, _sweeper_never_resends],
    ids=lambda m: m.__name__.strip("_"),
)
def test_a_broken_safeguard_is_caught_by_some_seed(mutation: Callable[[str], Any], backend: str) -> None:
    with world(backend), mutation(backend):
        for seed in range(BUDGET):
            result = Simulation(seed, backend=backend).run()
            if result.violations:
                print(f"{backend} seed {seed} caught it: {result.violations[0][:200]}")
                return
    pytest.fail(f"{BUDGET} {backend} seeds ran with a safeguard removed and no invariant noticed")
