"""Read the call records of :mod:`duetime.local.callcount` and split them into per-run and fixed costs (pure).

Fixed costs are what the system spends whatever is due: every tick (one per shard, once a minute in AWS) makes
its due-index queries, and a tick that finds something due takes and releases its shard lease (per tick,
whatever it claims); every sweep queries each shard's watchdog index; idle workers long-poll their queues.
The bench records an idle window first (stack up, nothing submitted): every DynamoDB item touched there is a
fixed-cost item, as are the shard lease rows (an idle tick no longer touches them), and the idle window's
calls per tick and per sweep are the fixed profile it reports. In the workload window, record by record:

- fixed: empty polls, empty queries, the *request* of every tick and sweep query, calls on fixed-cost items;
- per run: everything else, and the *bytes* tick and sweep queries return (``bytes / 4 KB`` RRU, half for
  eventually consistent reads: at scale a page is full and the per-request rounding is negligible; the
  rounding is booked as fixed).

The sweeper's reads of overdue runs (its watchdog query's bytes and its BatchGetItem of their rows and
worker sessions) repeat at every sweep while a run stays overdue, as a long run held by a worker session
does: the local stack sweeps every ``tick_seconds`` (1 s in the bench), AWS once a minute, so those reads
are weighted by ``sweep_weight`` (``tick_seconds / 60``) to price what AWS would read.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from duetime.adapters.aws.resources import SHARD_LEASE_PREFIX, WATCH_KEYS_PER_SHARD
from duetime.local.callcount import READ_UNIT_BYTES

#: the local stack's clock-loop thread (tick per shard, then the sweeper)
CLOCK_THREAD = "clock"


def load(directory: Path) -> list[dict[str, Any]]:
    """Every record of every ``calls-<pid>.jsonl`` in ``directory``, in time order."""
    records: list[dict[str, Any]] = []
    for path in sorted(directory.glob("calls-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    records.sort(key=lambda r: r["t"])
    return records


def op_key(record: Mapping[str, Any]) -> str:
    """``"dynamodb PutItem runs"``: service, operation and the table's or queue's logical name."""
    where = record.get("table") or record.get("queue") or record.get("bucket") or ""
    logical = str(where).rsplit("-", 1)[-1] if where else ""
    if record.get("op") == "Query" and record.get("index"):
        logical = f"{logical}/{record['index']}"
    return " ".join(p for p in (record["svc"], record["op"], logical) if p)


def is_empty_poll(record: Mapping[str, Any]) -> bool:
    return record["svc"] == "sqs" and record["op"] == "ReceiveMessage" and not record.get("messages")


def is_clock(record: Mapping[str, Any]) -> bool:
    return record.get("thread") == CLOCK_THREAD


def is_tick_query(record: Mapping[str, Any]) -> bool:
    """A tick's due-index query (every tick makes one per shard)."""
    return is_clock(record) and record["op"] == "Query" and str(record.get("table", "")).endswith("-jobs")


def is_sweep_query(record: Mapping[str, Any]) -> bool:
    """A sweep's watchdog query (every sweep makes one per shard)."""
    return is_clock(record) and record["op"] == "Query" and str(record.get("table", "")).endswith("-runs")


@dataclass
class Tally:
    """Calls, write units, read units, SQS requests and call time of a set of records."""

    calls: Counter[str] = field(default_factory=Counter)
    #: write units by table (the table write only) and by GSI
    table_wru: Counter[str] = field(default_factory=Counter)
    gsi_wru: Counter[str] = field(default_factory=Counter)
    wru: float = 0.0
    rru: float = 0.0
    sqs_requests: float = 0.0
    s3_puts: float = 0.0
    s3_gets: float = 0.0
    ms: float = 0.0

    def add(self, record: Mapping[str, Any], *, weight: float = 1.0, query_by_bytes: bool = False) -> None:
        self.calls[op_key(record)] += weight
        self.wru += weight * float(record.get("wru") or 0)
        if record.get("wru"):
            index_units = {i: sum(w) for i, w in (record.get("gsi") or {}).items()}
            for index, units in index_units.items():
                self.gsi_wru[index] += weight * units
            table = str(record.get("table", "")).rsplit("-", 1)[-1]
            self.table_wru[table] += weight * (float(record["wru"]) - sum(index_units.values()))
        if query_by_bytes and record["op"] in ("Query", "Scan"):
            units = record.get("read_bytes", 0) / READ_UNIT_BYTES
            self.rru += weight * (units if record.get("consistent") else units / 2)
        else:
            self.rru += weight * float(record.get("rru") or 0)
        if record["svc"] == "sqs":
            self.sqs_requests += weight * float(record.get("requests") or 1)
        if record["svc"] == "s3" and record["op"] == "PutObject":
            self.s3_puts += weight
        if record["svc"] == "s3" and record["op"] == "GetObject":
            self.s3_gets += weight
        self.ms += weight * float(record.get("ms") or 0)

    def scaled(self, factor: float) -> Tally:
        out = Tally(
            calls=Counter({k: v * factor for k, v in self.calls.items()}),
            table_wru=Counter({k: v * factor for k, v in self.table_wru.items()}),
            gsi_wru=Counter({k: v * factor for k, v in self.gsi_wru.items()}),
            wru=self.wru * factor,
            rru=self.rru * factor,
            sqs_requests=self.sqs_requests * factor,
            s3_puts=self.s3_puts * factor,
            s3_gets=self.s3_gets * factor,
            ms=self.ms * factor,
        )
        return out

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        return {
            "calls": {k: round(v, digits) for k, v in sorted(self.calls.items())},
            "dynamodb_wru": round(self.wru, digits),
            "table_wru": {k: round(v, digits) for k, v in sorted(self.table_wru.items())},
            "gsi_wru": {k: round(v, digits) for k, v in sorted(self.gsi_wru.items())},
            "dynamodb_rru": round(self.rru, digits),
            "sqs_requests": round(self.sqs_requests, digits),
            "s3_puts": round(self.s3_puts, digits),
            "s3_gets": round(self.s3_gets, digits),
            "call_ms": round(self.ms, 1),
        }


def tally(records: Iterable[Mapping[str, Any]], *, query_by_bytes: bool = False) -> Tally:
    out = Tally()
    for r in records:
        out.add(r, query_by_bytes=query_by_bytes)
    return out


@dataclass
class Split:
    """The records of one workload window, split into fixed and per-run costs."""

    #: the fixed cost of one tick of one shard and of one sweep (of all shards), from the idle window
    per_tick: Tally
    per_sweep: Tally
    #: ticks and sweeps in the workload window
    ticks: int
    sweeps: float
    #: empty polls in the workload window, and in the idle window
    idle_polls: int
    idle_window_polls: int
    fixed: Tally
    variable: Tally
    #: AWS call time of the clock thread spent on runs (the ticks' claims, the sweeper's repairs), ms
    variable_clock_ms: float
    errors: list[str]


def _item(record: Mapping[str, Any]) -> tuple[str, str] | None:
    key = record.get("key")
    return (str(record.get("table")), str(key)) if key else None


def is_shard_lease(record: Mapping[str, Any]) -> bool:
    """A write of a shard's lease row (callcount's key text is the key's value: ``#shard-lease#<n>``)."""
    return str(record.get("key") or "").startswith(SHARD_LEASE_PREFIX)


def _first_pages(records: Iterable[Mapping[str, Any]], kind: Any) -> int:
    return sum(1 for r in records if kind(r) and not r.get("page"))


def split(
    idle: list[dict[str, Any]], window: list[dict[str, Any]], *, shards: int, sweep_weight: float = 1.0
) -> Split:
    """Split ``window`` into fixed and per-run costs, record by record (see the module's docstring).

    Args:
        idle: records of an idle window (stack up, nothing submitted).
        window: records of the workload window.
        shards: the stack's shard count.
        sweep_weight: the weight of the sweeper's per-run reads (the local sweep period over AWS's, 60 s).

    Raises:
        ValueError: the idle window holds no tick or no sweep.
    """
    fixed_items = {item for r in idle if (item := _item(r)) is not None}
    fixed, variable = Tally(), Tally()
    clock_ms = 0.0
    for r in window:
        query = r["op"] in ("Query", "Scan")
        if is_empty_poll(r) or (query and not r.get("items")):
            fixed.add(r)
        elif query and is_clock(r):
            by_bytes = Tally()
            by_bytes.add(r, query_by_bytes=True)
            fixed.add({**r, "rru": float(r.get("rru") or 0) - by_bytes.rru, "ms": 0.0})
            weight = sweep_weight if is_sweep_query(r) else 1.0
            variable.rru += weight * by_bytes.rru
            variable.ms += by_bytes.ms
            clock_ms += by_bytes.ms
        elif _item(r) in fixed_items or is_shard_lease(r):
            fixed.add(r)
        else:
            # the sweeper's reads of overdue runs and their sessions: at AWS's sweep rate
            weight = sweep_weight if is_clock(r) and r["op"] == "BatchGetItem" else 1.0
            variable.add(r, query_by_bytes=True, weight=weight)
            if is_clock(r):
                clock_ms += float(r.get("ms") or 0)
    ticks = _first_pages(idle, is_tick_query)
    sweeps = _first_pages(idle, is_sweep_query) / (shards * WATCH_KEYS_PER_SHARD)  # one Query per watch key
    if not ticks or not sweeps:
        raise ValueError("the idle window holds no tick or no sweep: make it longer")
    return Split(
        per_tick=tally(r for r in idle if is_clock(r) and not is_sweep_query(r)).scaled(1 / ticks),
        per_sweep=tally(r for r in idle if is_sweep_query(r)).scaled(1 / sweeps),
        ticks=_first_pages(window, is_tick_query),
        sweeps=_first_pages(window, is_sweep_query) / (shards * WATCH_KEYS_PER_SHARD),
        idle_polls=sum(1 for r in window if is_empty_poll(r)),
        idle_window_polls=sum(1 for r in idle if is_empty_poll(r)),
        fixed=fixed,
        variable=variable,
        variable_clock_ms=clock_ms,
        errors=[r["count_error"] for r in window if r.get("count_error")],
    )


def per_process(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Calls by process label (``local``, ``worker small``...), for the report."""
    out: dict[str, int] = defaultdict(int)
    for r in records:
        out[str(r.get("proc"))] += 1
    return dict(out)
