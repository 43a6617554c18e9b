"""Thousands of seeded worlds, each run with faults and then quiesced, must keep every invariant.

Two variants of one simulation (tests/faults/README.md): on the SQLite adapters (`make test`) and on the AWS
adapters over moto in-process (`make faults`). ``DUETIME_SIM_SEEDS`` (default 400) sqlite seeds and
``DUETIME_SIM_AWS_SEEDS`` (default 0: the moto variant is skipped; `make faults` runs 5,000 of each) moto
seeds, both from ``DUETIME_SIM_BASE`` (default 0), run in chunks of ``DUETIME_SIM_CHUNK`` (default 100 sqlite
seeds, 25 moto seeds) so ``pytest -n`` spreads them over processes. A failing seed prints its violations, the
last steps of its trace, and the command that replays it exactly.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.sim.simulation import Simulation, explain, run_seeds, world

pytestmark = [pytest.mark.sim, pytest.mark.faults]

SEEDS = int(os.environ.get("DUETIME_SIM_SEEDS", "400"))
AWS_SEEDS = int(os.environ.get("DUETIME_SIM_AWS_SEEDS", "0"))
BASE = int(os.environ.get("DUETIME_SIM_BASE", "0"))


def _chunks(backend: str, seeds: int, default_chunk: int) -> list[object]:
    chunk = int(os.environ.get("DUETIME_SIM_CHUNK", str(default_chunk)))
    firsts = range(BASE, BASE + seeds, chunk)
    params: list[object] = [
        pytest.param(
            backend,
            a,
            min(a + chunk, BASE + seeds),
            id=f"{backend}-seeds{a}-{min(a + chunk, BASE + seeds) - 1}",
        )
        for a in firsts
    ]
    if not params and backend == "aws":  # one skipped test says how to run the moto variant
        params = [
            pytest.param(
                backend,
                0,
                0,
                id="aws",
                marks=pytest.mark.skip(
                    reason="the moto variant runs under make faults (DUETIME_SIM_AWS_SEEDS=n)"
                ),
            )
        ]
    return params


CHUNKS = _chunks("sqlite", SEEDS, 100) + _chunks("aws", AWS_SEEDS, 25)


@pytest.mark.parametrize(("backend", "first", "stop"), CHUNKS)
def test_every_seed_keeps_every_invariant(
    backend: str, first: int, stop: int, record_property: pytest.RecordProperty
) -> None:
    batch = run_seeds(range(first, stop), backend=backend)
    record_property(
        "simulation",
        json.dumps(
            {
                "backend": backend,
                "seeds": batch.seeds,
                "failed": len(batch.failed),
                "wall_seconds": batch.wall_seconds,
                "faults": dict(batch.faults),
                "stats": dict(batch.stats),
            }
        ),
    )
    print(batch.summary())
    assert not batch.failed, batch.summary() + "\n\n" + "\n\n".join(explain(f) for f in batch.failed[:3])


@pytest.mark.parametrize("backend", ["sqlite", "aws"])
def test_a_seed_replays_exactly_whatever_ran_before_it(backend: str) -> None:
    # Given three seeds run in one order, then in another (the store, the clock and the queue all start afresh)
    with world(backend):
        first = {s: Simulation(s, backend=backend).run() for s in (5, 6, 7)}
    with world(backend):
        again = {s: Simulation(s, backend=backend).run() for s in (7, 5, 6)}
    # Then every step of every seed is the same, and faults were injected
    assert {s: r.trace_digest for s, r in first.items()} == {s: r.trace_digest for s, r in again.items()}
    assert all(r.trace == again[s].trace for s, r in first.items())
    assert sum(sum(r.faults.values()) for r in first.values()) > 0
