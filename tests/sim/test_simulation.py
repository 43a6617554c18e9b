"""Thousands of seeded worlds, each run with faults and then quiesced, must keep every invariant.

``DUETIME_SIM_SEEDS`` (default 200) seeds from ``DUETIME_SIM_BASE`` (default 0) run in chunks of
``DUETIME_SIM_CHUNK`` (default 25) so ``pytest -n`` spreads them over processes; ``make faults`` runs 5,000.
A failing seed prints its violations, the last steps of its trace, and the command that replays it exactly.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.sim.simulation import Simulation, explain, moto_world, run_seeds

pytestmark = [pytest.mark.sim, pytest.mark.faults]

SEEDS = int(os.environ.get("DUETIME_SIM_SEEDS", "200"))
BASE = int(os.environ.get("DUETIME_SIM_BASE", "0"))
CHUNK = int(os.environ.get("DUETIME_SIM_CHUNK", "25"))
CHUNKS = [(first, min(first + CHUNK, BASE + SEEDS)) for first in range(BASE, BASE + SEEDS, CHUNK)]


@pytest.mark.parametrize(("first", "stop"), CHUNKS, ids=[f"seeds{a}-{b - 1}" for a, b in CHUNKS])
def test_every_seed_keeps_every_invariant(
    first: int, stop: int, record_property: pytest.RecordProperty
) -> None:
    batch = run_seeds(range(first, stop))
    record_property(
        "simulation",
        json.dumps(
            {
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


def test_a_seed_replays_exactly_whatever_ran_before_it() -> None:
    # Given three seeds run in one order, then in another (moto, the clock and the queue all start afresh)
    with moto_world():
        first = {s: Simulation(s).run() for s in (5, 6, 7)}
    with moto_world():
        again = {s: Simulation(s).run() for s in (7, 5, 6)}
    # Then every step of every seed is the same, and faults were injected
    assert {s: r.trace_digest for s, r in first.items()} == {s: r.trace_digest for s, r in again.items()}
    assert all(r.trace == again[s].trace for s, r in first.items())
    assert sum(sum(r.faults.values()) for r in first.values()) > 0
