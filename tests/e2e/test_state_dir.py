"""`duetime local` refuses a state directory it cannot use with one line naming the path, never a traceback
and never a silently empty stack (issue 15): a corrupted database, a directory in use by another stack (of
either backend), a directory that cannot be made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from duetime.config.deps import DATABASE_FILE
from tests.e2e.conftest import local_argv, stack_env, start_stack, stop_stack

pytestmark = pytest.mark.e2e


def _local(workdir: Path, state_dir: Path, backend: str = "sqlite") -> subprocess.CompletedProcess[str]:
    cmd = local_argv("--state-dir", str(state_dir), backend=backend)
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


@pytest.mark.parametrize(
    ("first_backend", "second_backend"), [("sqlite", "moto"), ("moto", "sqlite"), ("moto", "moto")]
)
def test_a_second_stack_of_any_backend_is_refused_and_leaves_the_first_ones_state_file(
    tmp_path: Path, first_backend: str, second_backend: str
) -> None:
    # Given a stack on the default state directory (.duetime/ of its working directory)
    first = start_stack(tmp_path, "--workers", "1", backend=first_backend)
    state_file = tmp_path / ".duetime" / "local.json"
    try:
        written = state_file.read_text()
        assert json.loads(written)["pid"] == first.proc.pid
        # When a stack of the other (or the same) backend is started on it
        message = _refused(_local(tmp_path, tmp_path / ".duetime", second_backend), tmp_path / ".duetime")
        # Then it is refused naming the first stack's process, and the first one's local.json is as it was
        assert f"process {first.proc.pid}" in message
        assert state_file.read_text() == written
        # And the CLI still finds the first stack through it
        listed = subprocess.run(
            [sys.executable, "-m", "duetime", "jobs", "list", "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=stack_env(),
        )
        assert listed.returncode == 0, listed.stdout + listed.stderr
    finally:
        stop_stack(first)
    # And the first stack, stopped, removes the state file it wrote
    assert not state_file.exists()
