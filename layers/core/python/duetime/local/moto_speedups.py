"""Exact speed-ups of moto's DynamoDB key ordering and SQS receives, installed in the local moto server only.

moto answers every Query and Scan by sorting the table's items twice: all of them by table key
(``Table.all_items``), then a Query of an index the partition's items by index key (``Table.sorted_items``).
Both sorts compare ``DynamoType`` objects, whose ``==`` and ``<`` rebuild each side's Python value
(``cast_value``) on every comparison: about 500 ms for one ``Limit 25`` Query of the ``by_tenant`` index of
a tenant with 10,000 jobs (profiled: 70 % in ``sorted_items``, 22 % in ``all_items``), where DynamoDB reads
the 25 items the ``Limit`` asks for. That is the emulator's cost, not Duetime's: it made the console's jobs
page take 1.5 s on ``--backend moto``.

:func:`install` replaces those two methods with the same sorts over plain keys: each key attribute's
``cast_value`` computed once per item (a ``str`` for S, a ``Decimal`` for N, the value for B), compared by
Python's own tuple ordering. That ordering is moto's exactly: ``DynamoType.__eq__`` is "same type and equal
``cast_value``" and ``__lt__`` compares ``cast_value``, so while every item's value at one key position has
the same type (S, N or B, as a key attribute's declared type makes it), equal plain keys are equal
``DynamoType`` keys and the order between unequal ones is the same; the sorts are stable, so ties keep
moto's order too. Anything else (a missing key attribute, another type, two types at one position) takes
moto's own method, which behaves as it always did (including its errors). Nothing else changes: which items
a Query reads, its filters, ``Limit``, ``ExclusiveStartKey``/``LastEvaluatedKey``, ``ScanIndexForward``,
projections and the response are moto's code. It is still a walk of the whole table per request (moto
keeps no index; one kept up to date would have to follow every write path, updates change items in place),
but without the ``DynamoType`` comparisons: that ``by_tenant`` Query takes about 100 ms rather than 480 ms
(in-process moto, 10,000 items), nearer DynamoDB's cost model, where a Query with ``Limit`` reads one page.

SQS: moto's ``ReceiveMessage`` checks each message it hands out against the queue's retention period by
calling ``get_queue_attributes``, which builds every attribute of the queue, three of them counts over all
its messages: a receive from a queue holding a burst's 1,000 delayed messages walked them about three times
per message returned (profiled: 7 % of the moto server's CPU in a burst). :func:`retention_check` reads the
one attribute it needs from the queue, with moto's own arithmetic.

``tests/integration/test_moto_speedups.py`` compares these against moto's stock methods on random items and
queries. In-process moto (the integration tests) keeps its stock methods: only
:func:`duetime.local.moto_server.main` installs these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

#: the DynamoDB types a key attribute may have (DynamoDB: S, N or B)
_KEY_TYPES = frozenset({"S", "N", "B"})


def plain_sort_keys(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]] | None:
    """Each row of key ``DynamoType`` values as a tuple of the values moto compares them by (their
    ``cast_value``: a ``str`` for S, a ``Decimal`` for N, the value for B), or None when that plain order
    would not be moto's: a value that is not S, N or B (absent, a set, a list, a map, NULL, BOOL), two types
    at one position, or rows of unequal length."""
    if not rows:
        return []
    try:
        kinds = tuple(value.type for value in rows[0])
    except AttributeError:
        return None
    if not set(kinds) <= _KEY_TYPES:
        return None
    width, numbers = len(kinds), [i for i, kind in enumerate(kinds) if kind == "N"]
    keys: list[tuple[Any, ...]] = []
    try:
        for row in rows:
            if len(row) != width or tuple(value.type for value in row) != kinds:
                return None
            if numbers:
                values = [value.value for value in row]
                for i in numbers:
                    values[i] = Decimal(values[i])
                keys.append(tuple(values))
            else:
                keys.append(tuple(value.value for value in row))
    except AttributeError:
        return None
    return keys


def _sort_by(items: list[Any], keys: list[Any]) -> None:
    """Sort ``items`` in place by ``keys`` (one per item), stably."""
    order = sorted(range(len(items)), key=keys.__getitem__)
    items[:] = [items[i] for i in order]


def make_sorted_items(stock: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``Table.sorted_items`` over plain keys; ``stock`` (moto's) for anything the plain ordering does not
    cover."""

    def sorted_items(
        self: Any, hash_key_attrs: list[str], range_key_attrs: list[str | None], items: list[Any]
    ) -> list[Any]:
        attrs = self._generate_attr_to_sort_by(hash_key_attrs, range_key_attrs)
        try:
            rows = [[item.attrs[a] for a in attrs] for item in items]
        except KeyError:
            return stock(self, hash_key_attrs, range_key_attrs, items)
        keys = plain_sort_keys(rows)
        if keys is None:
            return stock(self, hash_key_attrs, range_key_attrs, items)
        _sort_by(items, keys)
        return items

    return sorted_items


def make_all_items(stock: Callable[[Any], list[Any]]) -> Callable[[Any], list[Any]]:
    """``Table.all_items`` sorted over plain keys; ``stock`` (moto's) for anything else."""

    def all_items(self: Any) -> list[Any]:
        items: list[Any] = []
        for hash_set in self.items.values():
            if self.range_key_attr:
                items.extend(hash_set.values())
            else:
                items.append(hash_set)
        # moto's key: (hash, range) where the item has a range key, else the hash key alone; a mix of the
        # two (or any other type) is left to moto
        with_range = [item.range_key is not None for item in items]
        if any(with_range) and not all(with_range):
            return stock(self)
        rows = [
            (item.hash_key, item.range_key) if has_range else (item.hash_key,)
            for item, has_range in zip(items, with_range, strict=True)
        ]
        keys = plain_sort_keys(rows)
        if keys is None:
            return stock(self)
        _sort_by(items, keys)
        return items

    return all_items


def retention_check(self: Any, queue_name: str, message: Any) -> bool:
    """``SQSBackend.is_message_valid_based_on_retention_period`` reading the queue's retention period (an
    int, seconds) directly rather than through ``get_queue_attributes`` (which computes every attribute):
    True while ``message`` (its ``sent_timestamp`` in epoch ms) is younger than the queue's retention."""
    from moto.core.utils import unix_time  # the function moto.sqs.models imports and its method calls

    retention_period = self.get_queue(queue_name).message_retention_period
    return bool(retention_period + message.sent_timestamp / 1000 > unix_time())


def install() -> None:
    """Replace moto's ``Table.sorted_items`` and ``Table.all_items`` with their plain-key versions and its
    SQS retention check with :func:`retention_check` (once)."""
    from moto.dynamodb.models.table import Table
    from moto.sqs.models import SQSBackend

    if getattr(Table, "_duetime_plain_keys", False):
        return
    Table.sorted_items = make_sorted_items(Table.sorted_items)  # type: ignore[method-assign]
    Table.all_items = make_all_items(Table.all_items)  # type: ignore[method-assign,assignment]
    SQSBackend.is_message_valid_based_on_retention_period = retention_check  # type: ignore[method-assign]
    Table._duetime_plain_keys = True  # type: ignore[attr-defined]
