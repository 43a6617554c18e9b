"""schemathesis against the local stack's own /openapi.json: no server error, no response off its schema.

A CI-sized run (few examples per operation, fixed seed, stateful phase included); `make fuzz` runs longer.
Not checked on purpose: `positive_data_acceptance` (the schema cannot express every rule, e.g. that a cron
expression can fire or that a token came from this API, so valid-looking data can rightly get a 400) and
`use_after_free` (a DELETED job stays readable: its run history outlives it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,unsupported_method"


def run_schemathesis(api: str, *, examples: int, seed: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    return subprocess.run(
        [
            exe,
            "run",
            f"{api}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(examples),
            "--workers",
            "1",  # hypothesis parses sources with ast.parse; CPython 3.11's parser races across threads
            "--seed",
            str(seed),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )


#: a CPython 3.11 race inside hypothesis' source parsing (not Duetime's): such a run is repeated, up to 3 times
KNOWN_TOOL_FLAKE = "AST constructor recursion depth mismatch"


def test_schemathesis_finds_no_server_error_and_no_schema_violation(stack: Stack) -> None:
    examples = int(os.environ.get("DUETIME_FUZZ_EXAMPLES", "8"))
    for seed in (1, 2, 3):
        result = run_schemathesis(stack.api, examples=examples, seed=seed, cwd=stack.workdir)
        out = result.stdout + result.stderr
        # check failures (a 5xx, an undocumented status, a body off its schema) always fail the test
        assert "Failures:" not in out, out[-6000:]
        if result.returncode == 0 or KNOWN_TOOL_FLAKE not in out:
            break
    assert result.returncode == 0, out[-6000:]
    assert "passed" in result.stdout
