"""Run logs: one final object per attempt, and the numbered chunks streamed while it runs."""

from __future__ import annotations

import pytest

from tests.contract.conftest import Adapters

KEY = "logs/job-a/job-a.1796040000000/attempt-1.log"


def test_a_final_log_is_read_back_as_written(adapters: Adapters) -> None:
    data = "héllo\nwörld\n".encode()
    adapters.logs.put(KEY, data)
    assert adapters.logs.get(KEY) == data
    assert adapters.logs.get_final(KEY) == data


def test_a_final_log_is_overwritten_by_the_next_put(adapters: Adapters) -> None:
    adapters.logs.put(KEY, b"first\n")
    adapters.logs.put(KEY, b"second\n")
    assert adapters.logs.get(KEY) == b"second\n"


def test_a_missing_log_is_none(adapters: Adapters) -> None:
    assert adapters.logs.get(KEY) is None
    assert adapters.logs.get_final(KEY) is None
    adapters.logs.put("logs/job-a/other.log", b"x")
    assert adapters.logs.get(KEY) is None  # another key, even a neighbour, is not this log


def test_chunks_read_back_concatenated_in_order_while_no_final_log_exists(adapters: Adapters) -> None:
    for seq, data in ((2, b"three\n"), (0, b"one\n"), (1, b"two\n")):  # written out of order
        adapters.logs.put_chunk(KEY, seq, data)
    assert adapters.logs.get(KEY) == b"one\ntwo\nthree\n"
    assert adapters.logs.get_final(KEY) is None


def test_chunk_order_is_numeric_past_ten(adapters: Adapters) -> None:
    for seq in range(12):
        adapters.logs.put_chunk(KEY, seq, f"{seq},".encode())
    assert adapters.logs.get(KEY) == b"".join(f"{seq},".encode() for seq in range(12))


def test_the_final_log_wins_over_chunks(adapters: Adapters) -> None:
    for seq in range(3):
        adapters.logs.put_chunk(KEY, seq, b"live\n")
    adapters.logs.put(KEY, b"final\n")
    assert adapters.logs.get(KEY) == b"final\n"
    assert adapters.logs.get_final(KEY) == b"final\n"


def test_delete_chunks_with_a_count_removes_those_chunks(adapters: Adapters) -> None:
    for seq in range(3):
        adapters.logs.put_chunk(KEY, seq, f"chunk {seq}\n".encode())
    adapters.logs.delete_chunks(KEY, 2)
    assert adapters.logs.get(KEY) == b"chunk 2\n"
    adapters.logs.delete_chunks(KEY, 3)
    assert adapters.logs.get(KEY) is None


def test_delete_chunks_without_a_count_removes_them_all_and_keeps_the_final_log(adapters: Adapters) -> None:
    other = KEY.replace("attempt-1", "attempt-2")
    for seq in range(4):
        adapters.logs.put_chunk(KEY, seq, b"x")
        adapters.logs.put_chunk(other, seq, b"y")
    adapters.logs.put(KEY, b"final\n")
    adapters.logs.delete_chunks(KEY)
    assert adapters.logs.get(KEY) == b"final\n"
    assert adapters.logs.get(other) == b"yyyy"  # another attempt's chunks are left alone
    adapters.logs.delete_chunks(other, 4)
    assert adapters.logs.get(other) is None


def test_delete_chunks_of_a_log_without_chunks_is_fine(adapters: Adapters) -> None:
    adapters.logs.delete_chunks(KEY)
    adapters.logs.delete_chunks(KEY, 5)
    assert adapters.logs.get(KEY) is None


def test_a_byte_range_of_a_log_pack_is_read_alone(adapters: Adapters) -> None:
    # Given a log pack: three attempts' logs one after another in one object
    parts = [b"first attempt\n", "zwei \u00fc\n".encode(), b""]
    key = "logs/packs/2026-11-29/120000-pack.log"
    adapters.logs.put(key, b"".join(parts))
    # Then each part is read by its offset and length, and nothing of its neighbours
    assert adapters.logs.get_range(key, 0, len(parts[0])) == parts[0]
    assert adapters.logs.get_range(key, len(parts[0]), len(parts[1])) == parts[1]
    assert adapters.logs.get_range(key, len(parts[0]) + len(parts[1]), 0) == b""
    # A range of an object that does not exist is None; a negative one is refused
    assert adapters.logs.get_range("logs/packs/2026-11-29/missing.log", 0, 5) is None
    with pytest.raises(ValueError, match="negative"):
        adapters.logs.get_range(key, -1, 3)
