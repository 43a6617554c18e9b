"""Load and invoke the real Lambda handlers of ``functions/<role>/handler.py`` in-process, as Lambda would."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from aws_lambda_powertools.metrics.functions import is_metrics_disabled

import duetime
from duetime.config.observability import metrics


def functions_dir() -> Path:
    """Where the handlers live: ``$DUETIME_FUNCTIONS_DIR``, else the ``functions/`` beside the project root.

    Raises:
        FileNotFoundError: if no ``functions/`` directory with an ``api`` handler is found.
    """
    env = os.environ.get("DUETIME_FUNCTIONS_DIR")
    candidates = [Path(env)] if env else []
    package_dir = Path(duetime.__file__).resolve().parent
    candidates += [parent / "functions" for parent in package_dir.parents]
    candidates.append(Path.cwd() / "functions")
    for candidate in candidates:
        if (candidate / "api" / "handler.py").is_file():
            return candidate
    raise FileNotFoundError("cannot find functions/api/handler.py; set DUETIME_FUNCTIONS_DIR")


def project_root() -> Path:
    """The directory holding ``functions/`` (and ``examples/``)."""
    return functions_dir().parent


@cache
def load_module(role: str, instance: int = 0) -> ModuleType:
    """Import ``functions/<role>/handler.py`` as module ``duetime_function_<role>`` (``_<instance>`` for
    further copies: each copy is one "execution environment" with its own globals)."""
    path = functions_dir() / role / "handler.py"
    name = f"duetime_function_{role}" + (f"_{instance}" if instance else "")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class LocalLambdaContext:
    """The parts of Lambda's context object that handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int = 512
    timeout_seconds: float = 60.0
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = "local"
    log_stream_name: str = "local"
    _started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:000000000000:function:{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self._started)) * 1000))


def handler(role: str, *, concurrency: int = 1) -> Callable[[dict[str, Any]], Any]:
    """A callable ``event -> result`` that invokes ``functions/<role>/handler.py:lambda_handler``.

    Like Lambda, one execution environment handles one event at a time; ``concurrency`` environments
    (separate module copies) serve concurrent callers, who wait for a free one. The ``api`` role is the
    exception: Powertools' HTTP resolver keeps the request being served on a class attribute shared by every
    copy (``BaseRouter.current_event``), so two API events at once could read each other's headers or
    tenant; its events are served one at a time whatever ``concurrency`` says.
    """
    environments: queue.Queue[Callable[..., Any]] = queue.Queue()
    for i in range(concurrency):
        environments.put(load_module(role, i).lambda_handler)
    one_at_a_time = threading.Lock() if role == "api" else contextlib.nullcontext()

    def invoke(event: dict[str, Any]) -> Any:
        fn = environments.get()
        try:
            with one_at_a_time:
                return fn(event, LocalLambdaContext(function_name=f"duetime-{role}"))
        finally:
            environments.put(fn)
            if is_metrics_disabled():
                # Powertools keeps disabled metrics in memory and prints them once 100 accumulate
                metrics.clear_metrics()

    return invoke
