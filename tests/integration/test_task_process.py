"""A task's process (``TaskProcess``, started by ``posix_spawn``): the leader of a session of its own, with the
task's environment and PATH, default signal dispositions, no descriptor of the worker but 0, 1 and 2, and
its exit code (negative for a signal) as ``Popen`` reports it. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import duetime.services.task_process as task_process
from duetime.services.task_process import TaskProcess
from duetime.services.worker import kill_group


@pytest.fixture(autouse=True, params=["libc", "os"])
def spawner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both spawners: libc's posix_spawnp through ctypes, and os.posix_spawn (the fallback)."""
    if request.param == "libc":
        assert task_process._LIBC is not None, "ctypes posix_spawn is not available on this Linux"
    else:
        monkeypatch.setattr(task_process, "_LIBC", None)
    return str(request.param)


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    with tempfile.TemporaryFile() as out, open(os.devnull, "rb") as stdin:
        proc = TaskProcess(
            argv, env=env or {"PATH": os.environ["PATH"]}, stdin=stdin.fileno(), out=out.fileno()
        )
        code = proc.wait(timeout=10)
        out.seek(0)
        return code, out.read().decode()


def test_the_exit_code_and_the_output_of_stdout_and_stderr_together() -> None:
    code, text = _run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert code == 7
    assert text.splitlines() == ["out", "err"]


def test_a_task_killed_by_a_signal_reports_minus_the_signal() -> None:
    code, _ = _run(["sh", "-c", "kill -TERM $$"])
    assert code == -signal.SIGTERM


def test_a_task_leads_a_session_and_process_group_of_its_own() -> None:
    # /proc/self/stat fields 5 and 6: the process group and the session
    code, text = _run(["sh", "-c", 'read -r _ _ _ _ pgrp sid _ < /proc/self/stat; echo "$$ $pgrp $sid"'])
    assert code == 0
    pid, pgrp, sid = text.split()
    assert pid == pgrp == sid
    assert int(sid) != os.getsid(0)


def test_sigpipe_is_back_to_its_default_in_the_task() -> None:
    # Python ignores SIGPIPE; a task must not inherit that (``yes | head`` would spin on EPIPE errors)
    code, text = _run(["sh", "-c", "grep SigIgn /proc/self/status"])
    assert code == 0
    ignored = int(text.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


def test_the_task_sees_only_its_environment_and_no_descriptor_of_the_worker(tmp_path: Path) -> None:
    # Given the worker holding an open file (close-on-exec, as Python opens them) and one it inherited
    # (made inheritable, as a parent process passes one down)
    with open(tmp_path / "held", "w") as held, open(tmp_path / "passed", "w") as passed:
        held_fd, passed_fd = held.fileno(), passed.fileno()
        os.set_inheritable(passed_fd, True)
        code, text = _run(
            ["sh", "-c", "env; ls /proc/self/fd"], env={"PATH": os.environ["PATH"], "ONLY": "me"}
        )
    assert code == 0
    lines = text.splitlines()
    assert "ONLY=me" in lines
    assert not any(line.startswith("HOME=") for line in lines)
    fds = {int(line) for line in lines if line.isdigit()}
    assert held_fd not in fds and passed_fd not in fds
    assert fds <= {0, 1, 2, 3}  # 3: the directory ls reads


def test_a_bare_name_is_found_on_the_tasks_own_path(tmp_path: Path) -> None:
    # Given a command only on a PATH the task's environment sets (not the worker's)
    tool = tmp_path / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    code, text = _run(["only-here"], env={"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert (code, text) == (0, "found\n")
    # and not on the worker's PATH
    with pytest.raises(FileNotFoundError):
        _run(["only-here"])


def test_a_missing_command_raises_file_not_found() -> None:
    with pytest.raises(FileNotFoundError):
        _run(["no-such-command-duetime"])
    with pytest.raises(FileNotFoundError):
        _run(["/no/such/path/duetime"])


def test_wait_with_a_timeout_raises_and_kill_group_ends_the_whole_group() -> None:
    with tempfile.TemporaryFile() as out, open(os.devnull, "rb") as stdin:
        proc = TaskProcess(
            ["sh", "-c", "sleep 30 & sleep 30"],
            env={"PATH": os.environ["PATH"]},
            stdin=stdin.fileno(),
            out=out.fileno(),
        )
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        assert proc.poll() is None
        kill_group(proc, 1.0)
        assert proc.returncode == -signal.SIGTERM
        assert _group_gone(proc.pid)  # nothing of its group is left


def _group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """Whether process group ``pgid`` has no live member within ``timeout`` (a killed member is a zombie
    until its new parent reaps it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = [
            stat.split()
            for stat in (_read(p / "stat") for p in Path("/proc").iterdir() if p.name.isdigit())
            if stat is not None
        ]
        # after the command's name: state, parent, process group
        if not any(int(fields[2]) == pgid and fields[0] != "Z" for fields in members if len(fields) > 2):
            return True
        time.sleep(0.05)
    return False


def _read(path: Path) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :] if ")" in text else None


def test_a_log_file_at_descriptor_0_still_gets_both_streams(tmp_path: Path, spawner: str) -> None:
    # Given a worker process started with stdin closed, so its log file is descriptor 0 (in a process of
    # its own: this one's stdin is pytest-xdist's channel)
    script = tmp_path / "lowfd.py"
    script.write_text(
        "import os, sys, tempfile\n"
        "import duetime.services.task_process as tp\n"
        "if sys.argv[1] == 'os':\n"
        "    tp._LIBC = None\n"
        "os.close(0)\n"
        "out = tempfile.TemporaryFile()\n"
        "assert out.fileno() == 0, out.fileno()\n"
        "stdin = open(os.devnull, 'rb')\n"
        "proc = tp.TaskProcess(['sh', '-c', 'echo to-stdout; echo to-stderr >&2'],"
        " env={'PATH': os.environ['PATH']}, stdin=stdin.fileno(), out=out.fileno())\n"
        "code = proc.wait(timeout=10)\n"
        "out.seek(0)\n"
        "print(code, repr(out.read()))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), spawner], capture_output=True, text=True, timeout=60, env=os.environ
    )
    # Then the task's stdout and stderr both went to it, as with Popen
    assert done.stdout.strip() == "0 b'to-stdout\\nto-stderr\\n'", done.stderr


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["echo", "a\0b"], {}),
        (["echo"], {"X": "a\0b"}),
        (["echo"], {"A=B": "c"}),
        (["echo"], {"": "c"}),
    ],
)
def test_a_nul_byte_or_a_bad_variable_name_is_refused_not_truncated(
    argv: list[str], env: dict[str, str]
) -> None:
    with pytest.raises(ValueError):
        _run(argv, env={"PATH": os.environ["PATH"], **env})
