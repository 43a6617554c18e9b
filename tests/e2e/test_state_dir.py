"""`duetime local` refuses a state directory it cannot use with one line naming the path, never a traceback
and never a silently empty stack (issue 15): a corrupted database, a directory in use by another stack, a
directory that cannot be made."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from duetime.config.deps import DATABASE_FILE
from tests.e2e.conftest import local_argv, stack_env, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def _local(workdir: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = local_argv("--state-dir", str(state_dir))
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=60, env=stack_env())


def _refused(result: subprocess.CompletedProcess[str], names: Path) -> str:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Ready" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("duetime local: ") and str(names) in lines[0], lines
    return lines[0]


def test_a_corrupted_state_file_is_refused_naming_it_and_left_as_it_was(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    db = state / DATABASE_FILE
    garbage = b"this is not an SQLite database\n" * 200
    db.write_bytes(garbage)
    _refused(_local(tmp_path, state), db)
    assert db.read_bytes() == garbage  # nothing overwritten: the user may still recover it


def test_a_state_directory_that_cannot_be_made_is_refused_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    state = blocker / "state"  # its parent is a file: mkdir fails whoever runs it (root included)
    message = _refused(_local(tmp_path, state), state)
    assert "--state-dir" in message


def test_a_state_directory_in_use_by_another_stack_is_refused_naming_its_process(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = start_stack(tmp_path, "--state-dir", str(state), "--workers", "1")
    try:
        message = _refused(_local(tmp_path, state), state)
        assert f"process {first.proc.pid}" in message
    finally:
        stop_stack(first)
