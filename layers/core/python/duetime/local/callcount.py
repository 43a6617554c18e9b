"""Count every AWS call a process makes, with the item sizes that AWS bills by (for ``bench/``).

Off unless ``DUETIME_CALL_COUNT_DIR`` is set and the process called :func:`install_from_env` where it starts
(``duetime local``'s stack, ``duetime worker``, the bench's in-process measurements): then a client hook of
:mod:`duetime.adapters.aws.clients` calls :func:`register` on each client it creates, and every call appends
one JSON line to ``<dir>/calls-<pid>.jsonl``: service, operation, outcome, duration, and what the bill
depends on:

- DynamoDB writes: the item's size before and after (read on the side with an uncounted client, consistent),
  the write units of the table write and of each GSI write, by DynamoDB's rules: 1 WRU per started KB of the
  larger of the two images, at least 1; a failed condition still costs the existing item's size; a GSI costs
  one write per started KB of its entry when an item enters, leaves or changes inside the index, two when the
  index key changes; transactions cost double.
- DynamoDB reads: the bytes returned; 1 RRU per started 4 KB per request (per item for batch gets), half for
  eventually consistent reads (every GSI read). Filters are not used by Duetime, so returned = evaluated.
- SQS: messages and body bytes; one billed request per started 64 KB of payload.
- S3: object bytes.

The side reads make counting slow: measure costs with it, never latency. Sizes follow "Item sizes and formats"
in the DynamoDB Developer Guide (names and values in UTF-8 bytes; numbers 1 byte per two significant digits
plus 1; lists and maps 3 bytes plus 1 per element).
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from duetime.adapters.aws import clients

#: Environment variable naming the directory that receives ``calls-<pid>.jsonl`` files.
ENV_VAR = "DUETIME_CALL_COUNT_DIR"
#: Set to ``light`` to skip the side reads (no DynamoDB write sizes): counts and durations only, for timing.
MODE_ENV_VAR = "DUETIME_CALL_COUNT_MODE"

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
SQS_CHUNK_BYTES = 64 * 1024

_WRITE_OPS = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
_READ_OPS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem"})
_ITEM_OPS = _WRITE_OPS | {"GetItem"}

_lock = threading.Lock()
_files: dict[str, Any] = {}
_side: dict[str, Any] = {}
_schemas: dict[str, TableSchema] = {}
#: the client hook :func:`install` added (at most one), to take it away again
_installed: list[clients.ClientHook] = []


# ---- item sizes (pure) ----------------------------------------------------------------------------------
def _number_size(text: str) -> int:
    digits = text.lstrip("+-").lower().split("e")[0].replace(".", "").lstrip("0").rstrip("0")
    return max(1, math.ceil(len(digits) / 2)) + 1


def value_size(value: Mapping[str, Any]) -> int:
    """Billed size, bytes, of one DynamoDB attribute value in wire format (``{"S": "x"}``)."""
    (kind, data), *_ = value.items()
    if kind == "S":
        return len(str(data).encode())
    if kind == "N":
        return _number_size(str(data))
    if kind == "B":
        return len(data) if isinstance(data, bytes | bytearray) else len(base64.b64decode(data))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(s).encode()) for s in data)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in data)
    if kind == "BS":
        return sum(value_size({"B": b}) for b in data)
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in data)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + value_size(v) for k, v in data.items())
    raise ValueError(f"unknown DynamoDB type {kind!r}")


def item_size(item: Mapping[str, Any] | None) -> int:
    """Billed size, bytes, of an item in wire format (0 for no item)."""
    if not item:
        return 0
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def write_units(size: int, *, transactional: bool = False) -> int:
    """WRU of writing an item of ``size`` bytes: one per started KB, at least 1 (doubled in a transaction)."""
    return max(1, math.ceil(size / WRITE_UNIT_BYTES)) * (2 if transactional else 1)


def read_units(size: int, *, consistent: bool) -> float:
    """RRU of one read request returning ``size`` bytes: one per started 4 KB, at least 1; half if eventual."""
    units = max(1, math.ceil(size / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


def sqs_requests(payload_bytes: int) -> int:
    """Billed SQS requests of one action carrying ``payload_bytes``: one per started 64 KB, at least 1."""
    return max(1, math.ceil(payload_bytes / SQS_CHUNK_BYTES))


class TableSchema:
    """A table's key attributes and its GSIs: ``{index: (key attributes, projection, included)}``."""

    def __init__(
        self, keys: tuple[str, ...], indexes: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]]
    ):
        self.keys = keys
        self.indexes = indexes

    @classmethod
    def from_description(cls, table: Mapping[str, Any]) -> TableSchema:
        keys = tuple(k["AttributeName"] for k in table["KeySchema"])
        indexes = {}
        for gsi in table.get("GlobalSecondaryIndexes", []):
            proj = gsi.get("Projection", {})
            indexes[gsi["IndexName"]] = (
                tuple(k["AttributeName"] for k in gsi["KeySchema"]),
                proj.get("ProjectionType", "ALL"),
                tuple(proj.get("NonKeyAttributes", [])),
            )
        return cls(keys, indexes)

    def key_of(self, item: Mapping[str, Any]) -> dict[str, Any]:
        return {k: item[k] for k in self.keys if k in item}

    def _entry(self, index: str, item: Mapping[str, Any]) -> dict[str, Any]:
        index_keys, projection, included = self.indexes[index]
        if projection == "ALL":
            return dict(item)
        wanted = set(self.keys) | set(index_keys) | (set(included) if projection == "INCLUDE" else set())
        return {k: v for k, v in item.items() if k in wanted}

    def gsi_writes(
        self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
    ) -> dict[str, list[int]]:
        """``{index: [WRU of each index write]}`` for a table write turning ``old`` into ``new``."""
        out: dict[str, list[int]] = {}
        for index, (index_keys, _, _) in self.indexes.items():
            was = bool(old) and all(k in old for k in index_keys)  # type: ignore[operator]
            now = bool(new) and all(k in new for k in index_keys)  # type: ignore[operator]
            old_entry = self._entry(index, old) if was and old else {}
            new_entry = self._entry(index, new) if now and new else {}
            writes: list[int] = []
            if was and now:
                assert old is not None and new is not None
                if any(old[k] != new[k] for k in index_keys):
                    writes = [write_units(item_size(old_entry)), write_units(item_size(new_entry))]
                elif old_entry != new_entry:
                    writes = [write_units(max(item_size(old_entry), item_size(new_entry)))]
            elif was:
                writes = [write_units(item_size(old_entry))]
            elif now:
                writes = [write_units(item_size(new_entry))]
            if writes:
                out[index] = writes
        return out


# ---- the hooks ------------------------------------------------------------------------------------------
def _side_client() -> Any:
    """An uncounted DynamoDB client on the same endpoint (reads item images and table schemas)."""
    with _lock:
        if "dynamodb" not in _side:
            _side["dynamodb"] = boto3.session.Session().client(
                "dynamodb", config=Config(retries={"max_attempts": 5, "mode": "standard"})
            )
        return _side["dynamodb"]


def _schema(table: str) -> TableSchema:
    found = _schemas.get(table)
    if found is None:
        found = TableSchema.from_description(_side_client().describe_table(TableName=table)["Table"])
        _schemas[table] = found
    return found


def _image(table: str, key: Mapping[str, Any]) -> dict[str, Any] | None:
    out = _side_client().get_item(TableName=table, Key=dict(key), ConsistentRead=True)
    item: dict[str, Any] | None = out.get("Item")
    return item


def _sink(directory: str) -> Any:
    with _lock:
        handle = _files.get(directory)
        if handle is None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            handle = open(Path(directory) / f"calls-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
            _files[directory] = handle
        return handle


def _process_label() -> str:
    argv = [a for a in sys.argv[1:] if not a.startswith("-")]
    return " ".join(argv[:2]) or Path(sys.argv[0]).name


class _Recorder:
    """The hook pair of one client: ``before-parameter-build`` (params, side reads) and ``after-call``."""

    def __init__(self, service: str, directory: str) -> None:
        self.service = service
        self.directory = directory
        self.label = _process_label()
        self.light = os.environ.get(MODE_ENV_VAR) == "light"

    def before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        state: dict[str, Any] = {"params": params, "t0": time.perf_counter()}
        if self.service == "dynamodb" and model.name in _WRITE_OPS and not self.light:
            table = params["TableName"]
            key = params.get("Key") or _schema(table).key_of(params.get("Item", {}))
            state["old"] = _image(table, key)
            state["key"] = key
        context["duetime_callcount"] = state
        state["t0"] = time.perf_counter()  # the side read is not the call's own time

    def after(
        self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        state = context.get("duetime_callcount")
        if state is None:
            return
        record: dict[str, Any] = {
            "t": time.time(),
            "pid": os.getpid(),
            "proc": self.label,
            "thread": threading.current_thread().name,
            "svc": self.service,
            "op": model.name,
            "ms": round((time.perf_counter() - state["t0"]) * 1000, 3),
            "status": getattr(http_response, "status_code", None),
        }
        error = parsed.get("Error", {}).get("Code") if isinstance(parsed, dict) else None
        if error:
            record["error"] = error
        try:
            extra = getattr(self, f"_{self.service}", None)
            if extra is not None:
                record.update(extra(model.name, state, parsed, error))
        except Exception as exc:  # noqa: BLE001 - a measuring fault must never break the measured call
            record["count_error"] = repr(exc)
        _sink(self.directory).write(json.dumps(record, separators=(",", ":")) + "\n")

    # ---- per service -------------------------------------------------------------------------------------
    def _dynamodb(
        self, op: str, state: dict[str, Any], parsed: dict[str, Any], error: str | None
    ) -> dict[str, Any]:
        params = state["params"]
        out: dict[str, Any] = {"table": params.get("TableName")}
        if op in _ITEM_OPS and (params.get("Key") or state.get("key")):
            out["key"] = _key_text(params.get("Key") or state["key"])
        if op in _WRITE_OPS and self.light:
            pass
        elif op in _WRITE_OPS:
            table = params["TableName"]
            old = state.get("old")
            out["old_bytes"] = item_size(old)
            if error:
                # a failed condition still consumes the write units of the existing item (at least 1)
                out.update(new_bytes=out["old_bytes"], wru=write_units(out["old_bytes"]), gsi={})
                return out
            if op == "PutItem":
                new = params["Item"]
            elif op == "DeleteItem":
                new = None
            elif parsed.get("Attributes") is not None and params.get("ReturnValues") == "ALL_NEW":
                new = parsed["Attributes"]
            else:
                new = _image(table, state["key"])
            out["new_bytes"] = item_size(new)
            gsi = _schema(table).gsi_writes(old, new)
            out["wru"] = write_units(max(out["old_bytes"], out["new_bytes"])) + sum(
                sum(w) for w in gsi.values()
            )
            out["gsi"] = gsi
        elif op in _READ_OPS:
            if op == "GetItem":
                size = item_size(parsed.get("Item"))
                consistent = bool(params.get("ConsistentRead"))
                out.update(
                    items=int("Item" in parsed), read_bytes=size, rru=read_units(size, consistent=consistent)
                )
            elif op == "BatchGetItem":
                # each table's reads are strongly consistent or not as its RequestItems entry says
                requested = params.get("RequestItems") or {}
                sized = [
                    (item_size(i), bool((requested.get(table) or {}).get("ConsistentRead")))
                    for table, items in parsed.get("Responses", {}).items()
                    for i in items
                ]
                out.update(
                    items=len(sized),
                    read_bytes=sum(s for s, _ in sized),
                    rru=sum(read_units(s, consistent=c) for s, c in sized),
                )
            else:
                items = parsed.get("Items", [])
                size = sum(item_size(i) for i in items)
                consistent = bool(params.get("ConsistentRead")) and "IndexName" not in params
                out.update(
                    page="ExclusiveStartKey" in params,
                    index=params.get("IndexName"),
                    items=len(items),
                    read_bytes=size,
                    consistent=consistent,
                    rru=read_units(size, consistent=consistent),
                )
        elif op in ("BatchWriteItem", "TransactWriteItems"):
            sizes = []
            for entry in _write_requests(op, params):
                sizes.append(item_size(entry))
            out.update(
                items=len(sizes),
                wru=sum(write_units(s, transactional=op == "TransactWriteItems") for s in sizes),
                gsi={},
            )
            out["approximate"] = "request item sizes only; GSI writes not counted"
        return out

    def _sqs(
        self, op: str, state: dict[str, Any], parsed: dict[str, Any], error: str | None
    ) -> dict[str, Any]:
        params = state["params"]
        out: dict[str, Any] = {"queue": str(params.get("QueueUrl", "")).rsplit("/", 1)[-1]}
        if op == "SendMessage":
            size = len(str(params.get("MessageBody", "")).encode())
            out.update(messages=1, bytes=size, requests=sqs_requests(size))
        elif op == "SendMessageBatch":
            sizes = [len(str(e.get("MessageBody", "")).encode()) for e in params.get("Entries", [])]
            out.update(messages=len(sizes), bytes=sum(sizes), requests=sqs_requests(sum(sizes)))
        elif op == "ReceiveMessage":
            messages = parsed.get("Messages", [])
            size = sum(len(str(m.get("Body", "")).encode()) for m in messages)
            out.update(messages=len(messages), bytes=size, requests=sqs_requests(size))
        else:
            out["requests"] = 1
        return out

    def _s3(
        self, op: str, state: dict[str, Any], parsed: dict[str, Any], error: str | None
    ) -> dict[str, Any]:
        params = state["params"]
        out: dict[str, Any] = {"bucket": params.get("Bucket")}
        if params.get("Key"):
            out["key"] = str(params["Key"])[:300]  # the bench tells live-log chunks from final logs by it
        if op == "PutObject":
            body = params.get("Body", b"")
            out["bytes"] = len(body) if isinstance(body, bytes | bytearray | str) else None
        elif op == "GetObject":
            out["bytes"] = parsed.get("ContentLength")
        return out


def _key_text(key: Mapping[str, Any]) -> str:
    """A primary key as short text: its values joined by ``|`` (to recognise the same item again)."""
    return "|".join(str(next(iter(key[k].values()))) for k in sorted(key))[:200]


def _write_requests(op: str, params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The items (or keys) each entry of a batch or transaction writes."""
    if op == "BatchWriteItem":
        return [
            r.get("PutRequest", {}).get("Item") or r.get("DeleteRequest", {}).get("Key", {})
            for requests in params.get("RequestItems", {}).values()
            for r in requests
        ]
    entries: list[Mapping[str, Any]] = []
    for action in params.get("TransactItems", []):
        ((_, body),) = action.items()
        entries.append(body.get("Item") or body.get("Key", {}))
    return entries


def register(client: Any, directory: str) -> None:
    """Count every call ``client`` makes into ``<directory>/calls-<pid>.jsonl``."""
    service = client.meta.service_model.service_name
    recorder = _Recorder(service, directory)
    events = client.meta.events
    events.register(f"before-parameter-build.{service}", recorder.before)
    events.register(f"after-call.{service}", recorder.after)
    client.meta.duetime_callcount = recorder


def install(directory: str) -> None:
    """Count the calls of every client ``duetime.adapters.aws.clients.client`` creates from now on into
    ``directory`` (replaces an earlier :func:`install`)."""
    uninstall()

    def hook(client: Any) -> None:
        register(client, directory)

    clients.add_client_hook(hook)
    _installed.append(hook)


def install_from_env() -> bool:
    """:func:`install` into ``$DUETIME_CALL_COUNT_DIR`` if it is set (call it where a process starts, before
    its first client); whether counting is on."""
    directory = os.environ.get(ENV_VAR)
    if not directory:
        return False
    install(directory)
    return True


def uninstall() -> None:
    """Stop counting the calls of clients created from now on (those already counting go on)."""
    while _installed:
        clients.remove_client_hook(_installed.pop())


def flush() -> None:
    """Flush every open count file (they are line-buffered; this is for tests)."""
    with _lock:
        for handle in _files.values():
            handle.flush()


def reset() -> None:
    """Close count files and forget side clients and schemas (tests that restart moto call this)."""
    with _lock:
        for handle in _files.values():
            handle.close()
        _files.clear()
        _side.clear()
        _schemas.clear()
