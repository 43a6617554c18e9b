"""Processes `duetime local` starts die with it, even when it is killed with SIGKILL.

`duetime local` starts moto's server, the workers and the local Lambda runtime's function processes, each in
its own session (so Ctrl-C reaches only the stack, which stops them in order). A stack that is SIGKILLed runs
no cleanup, so each child asks the kernel to send it SIGTERM when its parent dies: Linux's
``prctl(PR_SET_PDEATHSIG)`` (man 2 prctl); on other systems a daemon thread watches ``getppid()`` once a
second. A worker treats that SIGTERM like any other: it stops its task and hands the run back
(``worker_stopped``), as a Fargate task stopped with its service would. That SIGTERM may come on top of the
stack's own (or a second lifeline's): signal handlers of these processes only set a flag, so the extra
signals are harmless (:func:`duetime.services.worker.handle_stop_signals`). A worker whose hand-back cannot reach the
stack's moto server any more (it got its SIGTERM too) gives up after its stop budget and exits.

Every process started this way carries ``DUETIME_PARENT_PID`` in its environment (``/proc/<pid>/environ``),
which is how a test finds all of a stack's processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading

#: set by `duetime local` in its children's environment: the pid whose death they must follow
PARENT_PID_ENV = "DUETIME_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def child_env() -> dict[str, str]:
    """The variable to add to a child's environment so that :func:`die_with_parent` follows this process."""
    return {PARENT_PID_ENV: str(os.getpid())}


def _set_pdeathsig(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0
    return False


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """If ``DUETIME_PARENT_PID`` names this process's parent, get ``signum`` when the parent dies.

    Returns True if a lifeline was set (False when not started by `duetime local`). If the parent is already
    gone (it died before this call), the signal is sent at once.
    """
    try:
        parent = int(os.environ.get(PARENT_PID_ENV, ""))
    except ValueError:
        return False
    if not _set_pdeathsig(signum):

        def watch() -> None:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
            os.kill(os.getpid(), signum)

        threading.Thread(target=watch, name="lifeline", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the lifeline was in place
        os.kill(os.getpid(), signum)
    return True
