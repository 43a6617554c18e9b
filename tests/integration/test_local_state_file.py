"""A local stack deletes ``local.json`` at exit only if it is the one it wrote (real files): another stack's,
even one of the same process, is left alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

from duetime.local.stack import LocalOptions, LocalStack


def _stack(state_dir: Path) -> LocalStack:
    return LocalStack(LocalOptions(state_dir=state_dir, state_file=state_dir / "local.json"))


def test_a_stack_stopping_leaves_a_state_file_another_stack_wrote(tmp_path: Path) -> None:
    # Given a local.json written by another stack of this very process (the same pid)
    ours, theirs = _stack(tmp_path), _stack(tmp_path)
    theirs.api_url = "http://127.0.0.1:8798"
    theirs._write_state()
    written = (tmp_path / "local.json").read_text()
    assert json.loads(written)["pid"] == os.getpid()
    # When the other stack stops
    ours.stop()
    # Then the file is still the one the other stack wrote
    assert (tmp_path / "local.json").read_text() == written


def test_a_stack_stopping_removes_the_state_file_it_wrote(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    stack.api_url = "http://127.0.0.1:8798"
    stack._write_state()
    stack.stop()
    assert not (tmp_path / "local.json").exists()
