"""The run archive's object store (ArchiveStore), the same on S3 and on files (issue 19)."""

from __future__ import annotations

from duetime.domain.archive import decode_member, encode_batch, run_line, run_of_line
from duetime.domain.ports import ArchiveStore
from tests.contract.conftest import T0, Adapters
from tests.contract.factories import make_job, make_run


def archive_of(adapters: Adapters) -> ArchiveStore:
    assert adapters.archive is not None
    return adapters.archive


def test_an_object_is_read_back_whole_and_by_range(adapters: Adapters) -> None:
    archive = archive_of(adapters)
    archive.put("archive/runs/tenant=t1/dt=2026-11-29/b1.jsonl.gz", b"0123456789")
    assert archive.get("archive/runs/tenant=t1/dt=2026-11-29/b1.jsonl.gz") == b"0123456789"
    assert archive.get_range("archive/runs/tenant=t1/dt=2026-11-29/b1.jsonl.gz", 3, 4) == b"3456"
    assert archive.get("archive/runs/tenant=t1/dt=2026-11-29/missing.jsonl.gz") is None
    assert archive.get_range("archive/runs/tenant=t1/dt=2026-11-29/missing.jsonl.gz", 0, 4) is None


def test_writing_a_key_again_replaces_it(adapters: Adapters) -> None:
    archive = archive_of(adapters)
    archive.put("archive/index/tenant=t1/job=j/dt=2026-11-29/b1.json", b"first")
    archive.put("archive/index/tenant=t1/job=j/dt=2026-11-29/b1.json", b"second")
    assert archive.get("archive/index/tenant=t1/job=j/dt=2026-11-29/b1.json") == b"second"
    assert archive.list_keys("archive/index/tenant=t1/job=j/") == [
        "archive/index/tenant=t1/job=j/dt=2026-11-29/b1.json"
    ]


def test_keys_and_dirs_are_listed_in_order_under_a_prefix(adapters: Adapters) -> None:
    archive = archive_of(adapters)
    for day in ("2026-11-30", "2026-11-28", "2026-11-29"):
        archive.put(f"archive/index/tenant=t1/job=j/dt={day}/b2.json", b"x")
        archive.put(f"archive/index/tenant=t1/job=j/dt={day}/b1.json", b"x")
    archive.put("archive/index/tenant=t1/job=jj/dt=2026-11-28/b1.json", b"x")
    assert archive.list_dirs("archive/index/tenant=t1/job=j/") == [
        "archive/index/tenant=t1/job=j/dt=2026-11-28/",
        "archive/index/tenant=t1/job=j/dt=2026-11-29/",
        "archive/index/tenant=t1/job=j/dt=2026-11-30/",
    ]
    assert archive.list_keys("archive/index/tenant=t1/job=j/dt=2026-11-29/") == [
        "archive/index/tenant=t1/job=j/dt=2026-11-29/b1.json",
        "archive/index/tenant=t1/job=j/dt=2026-11-29/b2.json",
    ]
    assert archive.list_keys("archive/index/tenant=t2/") == []
    assert archive.list_dirs("archive/index/tenant=t2/") == []


def test_a_batch_object_holds_one_member_per_job_read_by_its_range(adapters: Adapters) -> None:
    archive = archive_of(adapters)
    runs = [make_run(make_job(job_id), T0) for job_id in ("job-a", "job-b")]
    lines = [run_line(run, logs={1: "hello\n"}, archived_at=T0) for run in runs]
    (obj,) = encode_batch(lines, batch="b1")
    archive.put(obj.key, obj.data)
    for index_key, entry in obj.index:
        archive.put(index_key, entry.to_json())
    assert obj.key == "archive/runs/tenant=t1/dt=2026-11-29/b1.jsonl.gz"
    assert [line["run_id"] for line in decode_member(archive.get(obj.key) or b"")] == [r.run_id for r in runs]
    for (_, entry), run in zip(obj.index, runs, strict=True):
        (line,) = decode_member(archive.get_range(entry.key, entry.offset, entry.length) or b"")
        assert run_of_line(line) == run
        assert line["logs"] == {"1": "hello\n"}
