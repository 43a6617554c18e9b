"""The deterministic simulation's pytest plugin: markers, and one summary line per backend of every seed run
(with ``-n``).

Each chunk of seeds records its counts (and its backend, ``sqlite`` or ``aws``) as a user property; this
plugin adds them up in the controller process and prints, at the end of the session, per backend: seeds,
failures, seeds per second, faults injected by kind. It is loaded by the root ``tests/conftest.py``
(``pytest_plugins``), so `make test` prints it as `make faults` does.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest


def _empty() -> dict[str, Any]:
    return {"seeds": 0, "failed": 0, "wall": 0.0, "faults": Counter(), "stats": Counter()}


_totals: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sim: the deterministic simulation (seeded schedules of faults)")
    config.addinivalue_line(
        "markers",
        "faults: fault injection (real stacks and the deterministic simulation); `make faults` runs them alone",
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for name, value in report.user_properties:
        if name == "simulation":
            data = json.loads(str(value))
            totals = _totals.setdefault(str(data.get("backend", "aws")), _empty())
            totals["seeds"] += data["seeds"]
            totals["failed"] += data["failed"]
            totals["wall"] += data["wall_seconds"]
            totals["faults"].update(data["faults"])
            totals["stats"].update(data["stats"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not any(t["seeds"] for t in _totals.values()):
        return
    terminalreporter.write_sep("-", "deterministic simulation")
    for backend, totals in sorted(_totals.items()):
        faults: Counter[str] = totals["faults"]
        stats: Counter[str] = totals["stats"]
        rate = totals["seeds"] / totals["wall"] if totals["wall"] else 0.0
        terminalreporter.write_line(
            f"{backend}: {totals['seeds']} seeds, {totals['failed']} failing, {rate:.1f} seeds/s per process; "
            f"{stats['runs']} runs, {stats['starts']} attempts started, {stats['effects']} task executions"
        )
        terminalreporter.write_line(
            f"{backend}: faults injected: {sum(faults.values())}: "
            + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items()))
        )
