"""The core layer's bundle, built on this machine (no docker): ``python/duetime`` + its dependencies.

Lambda puts a layer's ``python/`` folder on ``sys.path``, so the zip holds ``python/duetime/...`` (copied from
``layers/core/python``) next to the third-party packages the core imports, installed by pip as
manylinux wheels for the functions' runtime and architecture (``--platform manylinux2014_aarch64
--python-version 3.12 --only-binary=:all:``): pydantic-core is compiled, so the build machine's own
site-packages would not do. Everything comes from the layer; no public layer is used.

Versions are pinned to the ones installed where the CDK app runs (the project's virtualenv, where the tests
passed), falling back to pyproject's ranges. Left out, with the reason:

- ``boto3``/``botocore``: the Lambda Python runtime ships them (about 80 MB unpacked otherwise);
- ``typer``, ``rich``: only the ``duetime`` CLI uses them, never a handler.

Of the package itself, ``duetime/local/`` (the local stack), ``duetime/cli/`` (the command line) and
``duetime/__main__.py`` (``python -m duetime``) stay out (:data:`PACKAGE_EXCLUDES`): no handler imports them,
which pyproject's import-linter contracts check. ``duetime/lambda_target.py`` stays in.

``tzdata`` is added: ``zoneinfo`` needs a time zone database and the Lambda runtime image has none.

pip needs PyPI (or a wheel cache/``PIP_FIND_LINKS``). Bundling runs only for stacks being deployed or
when ``make synth BUNDLE=1`` asks; ``make synth`` and the tests skip it (context
``aws:cdk:bundling-stacks=[]``), which leaves the template unchanged: the asset hash is the source's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import jsii
from aws_cdk import BundlingOptions, DockerImage, ILocalBundling

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYER_SOURCE = REPO_ROOT / "layers" / "core"

#: Lambda runtime the layer is built for; keep in step with ``functions.RUNTIME``.
PYTHON_VERSION = "3.12"
PIP_PLATFORM = "manylinux2014_aarch64"

#: Runtime dependencies that are not bundled (see the module docstring).
NOT_BUNDLED = frozenset({"boto3", "botocore", "typer", "rich"})
#: Added to the bundle although pyproject does not list them.
EXTRA_REQUIREMENTS = ("tzdata",)
#: Parts of ``duetime/`` (relative to it) left out of the layer: the local stack, the CLI, ``python -m duetime``.
PACKAGE_EXCLUDES = ("local", "cli", "__main__.py")
#: Files never shipped in the layer (globs relative to ``layers/core``). CDK leaves them out of the asset's
#: source hash (an edit to the local stack makes no new layer version) but not out of bundling's input: the
#: copy in :func:`copy_package` and the docker command leave :data:`PACKAGE_EXCLUDES` out themselves.
LAYER_EXCLUDES = (
    "**/__pycache__",
    "**/*.pyc",
    "python/*.egg-info",
    "python/duetime.egg-info/**",
    *(f"python/duetime/{part}{tail}" for part in PACKAGE_EXCLUDES for tail in ("", "/**")),
)


def requirement_name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement (``"pydantic>=2,<3"`` -> ``"pydantic"``)."""
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    if found is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return found.group(0)


def _pinned(requirement: str) -> str:
    """``name==<installed version>`` when installed here, else the requirement as written."""
    name = requirement_name(requirement)
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return requirement


def layer_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """The pip requirements of the core layer, pinned (see the module docstring)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    wanted = [r for r in project["dependencies"] if requirement_name(r).lower() not in NOT_BUNDLED]
    return sorted(_pinned(r) for r in (*wanted, *EXTRA_REQUIREMENTS))


def pip_command(requirements: list[str], target: str) -> list[str]:
    """The pip invocation that installs ``requirements`` for the Lambda platform into ``target``."""
    return [
        "pip",
        "install",
        "--quiet",
        "--no-compile",
        "--disable-pip-version-check",
        "--platform",
        PIP_PLATFORM,
        "--implementation",
        "cp",
        "--python-version",
        PYTHON_VERSION,
        "--only-binary=:all:",
        "--target",
        target,
        *requirements,
    ]


def copy_package(python_dir: Path, source: Path = LAYER_SOURCE / "python" / "duetime") -> Path:
    """Copy the ``duetime`` package to ``python_dir/duetime`` as the layer ships it: without
    :data:`PACKAGE_EXCLUDES` and compiled files. Returns the copy."""
    source = source.resolve()

    def ignored(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
        if Path(directory).resolve() == source:
            skipped |= set(PACKAGE_EXCLUDES) & set(names)
        return skipped

    target = python_dir / "duetime"
    shutil.copytree(source, target, ignore=ignored)
    return target


@jsii.implements(ILocalBundling)
class LocalLayerBundler:
    """Builds the layer with this machine's Python and pip (CDK calls it instead of docker)."""

    def __init__(self, requirements: list[str]) -> None:
        self.requirements = requirements

    def try_bundle(self, output_dir: str, options: object) -> bool:  # noqa: ARG002 - jsii passes the options
        python_dir = Path(output_dir) / "python"
        copy_package(python_dir)
        command = [sys.executable, "-m", *pip_command(self.requirements, str(python_dir))]
        result = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
        if result.returncode != 0:
            raise RuntimeError(
                "bundling the core layer failed (pip needs PyPI or a wheel cache):\n"
                f"{' '.join(command)}\n{result.stderr[-4000:]}"
            )
        return True


def layer_bundling() -> BundlingOptions:
    """Bundling options for the core layer asset (source: ``layers/core``).

    The docker image and command are what CDK would run if local bundling were unavailable; they do the
    same thing in AWS SAM's build image. The pinned requirements are passed as an environment variable so
    that they are part of the asset hash: a new pin means a new layer version.
    """
    requirements = layer_requirements()
    target = "/asset-output/python"
    shell = " && ".join(
        [
            f"mkdir -p {target}",
            f"cp -r /asset-input/python/duetime {target}/",
            # docker mounts the asset's source as it is: the asset's excludes do not apply to /asset-input
            f"rm -rf {' '.join(f'{target}/duetime/{part}' for part in PACKAGE_EXCLUDES)}",
            " ".join(pip_command(requirements, target)),
        ]
    )
    return BundlingOptions(
        image=DockerImage.from_registry(f"public.ecr.aws/sam/build-python{PYTHON_VERSION}"),
        command=["bash", "-c", shell],
        environment={"DUETIME_LAYER_REQUIREMENTS": " ".join(requirements)},
        # jsii calls try_bundle(output_dir, options) positionally, unlike the generated Protocol's keywords
        local=LocalLayerBundler(requirements),  # type: ignore[arg-type]
    )
