"""The deterministic simulation's pytest plugin: markers, and one summary line of every seed run (with ``-n``).

Each chunk of seeds records its counts as a user property; this plugin adds them up in the controller process
and prints, at the end of the session: seeds, failures, seeds per second, faults injected by kind. It is
loaded by the root ``tests/conftest.py`` (``pytest_plugins``), so `make test` prints it as `make faults` does.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

_totals: dict[str, Any] = {"seeds": 0, "failed": 0, "wall": 0.0, "faults": Counter(), "stats": Counter()}


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
            _totals["seeds"] += data["seeds"]
            _totals["failed"] += data["failed"]
            _totals["wall"] += data["wall_seconds"]
            _totals["faults"].update(data["faults"])
            _totals["stats"].update(data["stats"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _totals["seeds"]:
        return
    faults: Counter[str] = _totals["faults"]
    stats: Counter[str] = _totals["stats"]
    rate = _totals["seeds"] / _totals["wall"] if _totals["wall"] else 0.0
    terminalreporter.write_sep("-", "deterministic simulation")
    terminalreporter.write_line(
        f"{_totals['seeds']} seeds, {_totals['failed']} failing, {rate:.1f} seeds/s per process; "
        f"{stats['runs']} runs, {stats['starts']} attempts started, {stats['effects']} task executions"
    )
    terminalreporter.write_line(
        f"faults injected: {sum(faults.values())}: "
        + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items()))
    )
