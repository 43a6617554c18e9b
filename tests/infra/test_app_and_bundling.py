"""The app's entry point and the core layer's bundle recipe (no synthesis)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.infra.conftest import CDK_MISSING

pytest.importorskip("aws_cdk", reason=CDK_MISSING)

from infra.app import CDK_JSON, parse_context_args  # noqa: E402
from infra.bundling import NOT_BUNDLED, layer_requirements, pip_command, requirement_name  # noqa: E402

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
