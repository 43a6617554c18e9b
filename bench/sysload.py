"""How busy the machine is around a measurement (other work on it skews the lag figures), never pass/fail."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def snapshot() -> dict[str, Any]:
    """The 1-minute load average and the CPU and I/O pressure (``/proc/pressure``: % of the last 10 s in
    which some task waited for a CPU, or for I/O) now; a figure that cannot be read is left out."""
    out: dict[str, Any] = {}
    try:
        out["load_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    for resource in ("cpu", "io"):
        try:
            text = Path(f"/proc/pressure/{resource}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("some "):
                fields = dict(f.split("=", 1) for f in line.split()[1:])
                out[f"{resource}_pressure_pct"] = float(fields["avg10"])
    return out


def pss_kib(pid: int) -> int | None:
    """``pid``'s proportional set size in KiB (``/proc/<pid>/smaps_rollup``; None if it is gone or
    unreadable): what a process adds to the machine's memory, its shared pages split among their users."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None
