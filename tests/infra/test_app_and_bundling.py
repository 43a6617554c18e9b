"""The app's entry point and the core layer's bundle recipe (no synthesis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.conftest import CDK_MISSING

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from infra.app import CDK_JSON, parse_context_args  # noqa: E402
from infra.bundling import (  # noqa: E402
    LAYER_EXCLUDES,
    LAYER_SOURCE,
    NOT_BUNDLED,
    PACKAGE_EXCLUDES,
    copy_package,
    layer_bundling,
    layer_requirements,
    pip_command,
    requirement_name,
)

# one xdist group: with `--dist loadgroup` the CDK app is synthesized by one worker only
pytestmark = [pytest.mark.infra, pytest.mark.xdist_group("cdk")]


def test_cdk_json_runs_the_app_module() -> None:
    assert json.loads(CDK_JSON.read_text())["app"] == "python -m infra.app"


def test_context_arguments_parse_like_the_cdk_clis() -> None:
    assert parse_context_args(["-c", "stage=prod", "--context", "aws:cdk:bundling-stacks=[]"]) == {
        "stage": "prod",
        "aws:cdk:bundling-stacks": [],
    }
    with pytest.raises(SystemExit):
        parse_context_args(["stage=prod"])


def test_the_layer_bundles_the_runtime_dependencies_pinned_but_not_boto3_or_the_cli() -> None:
    requirements = layer_requirements()
    names = {requirement_name(r).lower() for r in requirements}

    assert {"pydantic", "aws-lambda-powertools", "tzdata"} <= names
    assert not names & NOT_BUNDLED
    assert all(
        "==" in r for r in requirements if requirement_name(r) in ("pydantic", "aws-lambda-powertools")
    )


def test_pip_installs_manylinux_arm64_wheels_for_the_runtime(tmp_path: Path) -> None:
    command = pip_command(["pydantic==2.0"], str(tmp_path))

    assert command[command.index("--platform") + 1] == "manylinux2014_aarch64"
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "--only-binary=:all:" in command


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_the_layer_ships_the_package_without_the_local_stack_the_cli_or_compiled_files(
    tmp_path: Path,
) -> None:
    source = LAYER_SOURCE / "python" / "duetime"
    copied = copy_package(tmp_path / "python")
    shipped = _files(copied)

    assert copied == tmp_path / "python" / "duetime"
    assert {"__init__.py", "py.typed", "lambda_target.py", "config/deps.py", "api/resolver.py"} <= shipped
    assert not {f for f in shipped if f.startswith(("local/", "cli/")) or f == "__main__.py"}
    assert not {f for f in shipped if "__pycache__" in f or f.endswith(".pyc")}
    # everything else of the package is there: the source's files less the excluded parts
    expected = {
        f
        for f in _files(source)
        if f.split("/")[0] not in PACKAGE_EXCLUDES and "__pycache__" not in f and not f.endswith(".pyc")
    }
    assert shipped == expected


def test_the_shipped_modules_import_without_the_local_stack_or_the_cli(tmp_path: Path) -> None:
    """Every module of the layer's copy imports in a fresh interpreter that finds ``duetime`` only there (the
    import-linter contracts say the same statically, this checks it at run time)."""
    python_dir = tmp_path / "python"
    copied = copy_package(python_dir)
    modules = sorted(
        ".".join(("duetime", *p.relative_to(copied).with_suffix("").parts)).removesuffix(".__init__")
        for p in copied.rglob("*.py")
    )
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"assert sys.modules['duetime'].__file__.startswith({str(copied)!r}), sys.modules['duetime'].__file__\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('duetime.local', 'duetime.cli')))\n"
        "assert not loaded, loaded\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DUETIME_"))}
    env["PYTHONPATH"] = str(python_dir)
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_docker_bundling_leaves_the_same_parts_out() -> None:
    """Docker mounts the asset's source whole (its excludes do not apply): the command removes the parts."""
    command = layer_bundling().command
    assert command is not None
    shell = command[-1]
    for part in PACKAGE_EXCLUDES:
        assert f"/asset-output/python/duetime/{part}" in shell
        assert f"python/duetime/{part}" in LAYER_EXCLUDES
    assert (
        shell.index("cp -r /asset-input/python/duetime") < shell.index("rm -rf") < shell.index("pip install")
    )
