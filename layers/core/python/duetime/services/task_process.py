"""A task's process: spawned as the leader of a session of its own, the part of ``subprocess.Popen`` the worker
uses (``pid``, ``returncode``, ``poll``, ``wait``), at a fraction of Popen's cost in the worker.

Why not Popen: on CPython 3.11 Popen forks through Python code (its PATH search builds every candidate path in
Python, its environment is encoded in Python; about 0.2 ms of CPU per start) and holds the GIL while the
vforked child execs. A worker runs its starts, ends and polls in other threads of the same process, so in a
burst of short tasks every spawn stalled all of them: sampled with the GIL, the spawn was the biggest single
item of a worker (a sixth of its time). Here the spawn is libc's ``posix_spawnp`` (vfork and exec in C)
called through ``ctypes``, which releases the GIL for the call; where that is not available (not glibc or
musl), ``os.posix_spawn``, which does the same in C but holds the GIL.

What the task gets, as Popen gives it: ``stdin`` and ``out`` (stdout and stderr) as descriptors 0, 1 and 2;
no other descriptor of the worker (``close_fds``: Python and SQLite open theirs close-on-exec, and the few a
parent passed down inheritable are closed by name); SIGPIPE and SIGXFSZ, which Python ignores, back to their
defaults (``restore_signals``); a session and process group of its own (``start_new_session``); a bare
command name looked up on the ``PATH`` of its environment.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

#: signals the task gets back at their default disposition (Python ignores them)
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


class _Libc:
    """libc's posix_spawn family through ctypes (a ``CDLL`` call releases the GIL). The attributes (a new
    session, DEFAULT_SIGNALS at their defaults) are built once and shared by every spawn."""

    #: room for posix_spawn_file_actions_t / posix_spawnattr_t / sigset_t (glibc x86-64: 80, 336, 128 bytes)
    _OPAQUE_BYTES = 1024
    #: <spawn.h> flags, the same in glibc and musl
    _SETSIGDEF = 0x04
    _SETSID = 0x80

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in (
            "posix_spawnp",
            "posix_spawn",
            "posix_spawn_file_actions_init",
            "posix_spawn_file_actions_adddup2",
            "posix_spawn_file_actions_addclose",
            "posix_spawn_file_actions_destroy",
            "posix_spawnattr_init",
            "posix_spawnattr_setflags",
            "posix_spawnattr_setsigdefault",
            "sigemptyset",
            "sigaddset",
        ):
            getattr(libc, name)  # AttributeError: not this libc
        self.libc = libc
        self.attr = ctypes.create_string_buffer(self._OPAQUE_BYTES)
        signals = ctypes.create_string_buffer(self._OPAQUE_BYTES)
        ok = libc.posix_spawnattr_init(self.attr) == 0 and libc.sigemptyset(signals) == 0
        ok = ok and all(libc.sigaddset(signals, int(sig)) == 0 for sig in DEFAULT_SIGNALS)
        ok = ok and libc.posix_spawnattr_setsigdefault(self.attr, signals) == 0
        ok = (
            ok
            and libc.posix_spawnattr_setflags(self.attr, ctypes.c_short(self._SETSID | self._SETSIGDEF)) == 0
        )
        if not ok:
            raise OSError("posix_spawnattr setup failed")

    def spawn(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        dup2: list[tuple[int, int]],
        close: list[int],
        *,
        search: bool,
    ) -> int:
        libc = self.libc
        actions = ctypes.create_string_buffer(self._OPAQUE_BYTES)
        if libc.posix_spawn_file_actions_init(actions) != 0:
            raise OSError(errno.ENOMEM, "posix_spawn_file_actions_init failed")
        try:
            for fd, target in dup2:
                libc.posix_spawn_file_actions_adddup2(actions, fd, target)
            for fd in close:
                libc.posix_spawn_file_actions_addclose(actions, fd)
            encoding = sys.getfilesystemencoding()
            args = (ctypes.c_char_p * (len(argv) + 1))(
                *[a.encode(encoding, "surrogateescape") for a in argv], None
            )
            envp = (ctypes.c_char_p * (len(env) + 1))(
                *[f"{k}={v}".encode(encoding, "surrogateescape") for k, v in env.items()], None
            )
            pid = ctypes.c_int()
            call = libc.posix_spawnp if search else libc.posix_spawn
            code = call(
                ctypes.byref(pid), path.encode(encoding, "surrogateescape"), actions, self.attr, args, envp
            )
        finally:
            libc.posix_spawn_file_actions_destroy(actions)
        if code != 0:
            raise OSError(code, os.strerror(code), argv[0])
        return pid.value


def _libc() -> _Libc | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return _Libc()
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _inheritable_fds() -> list[int]:
    """This process's open descriptors above 2 that a child would inherit (not close-on-exec)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: the descriptors up to a bound
        names = [str(fd) for fd in range(3, min(os.sysconf("SC_OPEN_MAX"), 1024))]
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:  # closed meanwhile (or the listing's own descriptor)
                pass
    return found


def spawn(argv: list[str], *, env: dict[str, str], stdin: int, out: int) -> int:
    """Start ``argv`` as described in the module docstring; returns its pid.

    Raises:
        OSError: it cannot be started (FileNotFoundError: not found on the PATH of ``env``; PermissionError).
        ValueError: an argument or a variable holds a NUL byte, or a variable's name is empty or holds "="
            (as ``os.posix_spawn`` and Popen refuse them).
    """
    for arg in argv:
        if "\0" in arg:
            raise ValueError("embedded null byte in an argument")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"illegal environment variable {key!r}")
    moved: list[int] = []
    try:
        # a descriptor at 0..2 (a worker started with stdin closed) would be overwritten by the dup2 of
        # another before its own: moved above 2 first, as _posixsubprocess does
        if stdin < 3:
            stdin = fcntl.fcntl(stdin, fcntl.F_DUPFD_CLOEXEC, 3)
            moved.append(stdin)
        if out < 3:
            out = fcntl.fcntl(out, fcntl.F_DUPFD_CLOEXEC, 3)
            moved.append(out)
        return _spawn(argv, env, stdin, out)
    finally:
        for fd in moved:
            os.close(fd)


def _spawn(argv: list[str], env: dict[str, str], stdin: int, out: int) -> int:
    dup2 = [(stdin, 0), (out, 1), (out, 2)]
    close = _inheritable_fds()
    path = env.get("PATH", os.defpath)
    name = argv[0]
    # posix_spawnp searches the worker's own PATH: the task's unless its environment sets another
    search = os.sep not in name
    if search and path != os.environ.get("PATH", os.defpath):
        found = shutil.which(name, path=path)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, f"not found on the task's PATH {path!r}", name)
        name, search = found, False
    if _LIBC is not None:
        return _LIBC.spawn(name, argv, env, dup2, close, search=search)
    actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_DUP2, fd, target) for fd, target in dup2]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in close]
    call = os.posix_spawnp if search else os.posix_spawn
    return call(name, argv, env, file_actions=actions, setsid=True, setsigdef=DEFAULT_SIGNALS)


class TaskProcess:
    """A task's process (see the module docstring), started at once.

    Args:
        argv: the command; a bare name is looked up on the ``PATH`` of ``env`` (as Popen does).
        env: the task's whole environment.
        stdin, out: open file descriptors (fds 0, and 1 and 2, of the task).

    Raises:
        OSError: the command cannot be started (FileNotFoundError: not found on that PATH; PermissionError).
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], stdin: int, out: int) -> None:
        self.pid = spawn(argv, env=env, stdin=stdin, out=out)
        #: the exit code once reaped (negative: killed by that signal), else None
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit code if the process has exited (reaping it), else None."""
        return self._reap(block=False)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting for the exit (up to ``timeout`` seconds).

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout``.
        """
        if timeout is None:
            code = self._reap(block=True)
            assert code is not None
            return code
        deadline, step = time.monotonic() + timeout, 0.0005
        while (code := self._reap(block=False)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(min(step, left))
            step = min(2 * step, 0.05)
        return code

    def _reap(self, *, block: bool) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
                except ChildProcessError:
                    pid, status = self.pid, 0  # reaped elsewhere: its code is lost (as Popen's 0)
                if pid == self.pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
