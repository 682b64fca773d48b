"""images/: the Dockerfiles parse, and the commands the operator puts in pods exist in the runtime image.

No container engine runs here, so the images are not built: the Dockerfiles are parsed with
dockerfile-parse, and what the image would run is checked against the sources it installs (the
console scripts of pyproject.toml, the `eagle3` CLI's stages, the pinned vLLM base image). The
commands of the pods the real operator creates are checked the same way in test_install.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest
from dockerfile_parse import DockerfileParser

from tests.support.cluster import REPO_ROOT

IMAGES = REPO_ROOT / "images"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}
STAGE_COMMAND = re.compile(r"^eagle3 ([a-z]+) ", re.MULTILINE)


def parse(name: str) -> DockerfileParser:
    parser = DockerfileParser(path=str(IMAGES / name / "Dockerfile"))
    parser.build_args = {}  # resolve ARG defaults only
    return parser


def structure(parser: DockerfileParser) -> list[dict]:
    return [item for item in parser.structure if item["instruction"] != "COMMENT"]


def instructions(parser: DockerfileParser, kind: str) -> list[str]:
    return [item["value"] for item in structure(parser) if item["instruction"] == kind]


def final_stage(parser: DockerfileParser) -> list[dict]:
    items = structure(parser)
    starts = [i for i, item in enumerate(items) if item["instruction"] == "FROM"]
    return items[starts[-1] :]


def exec_form(value: str) -> list[str]:
    """ENTRYPOINT/CMD must use the JSON exec form (signals reach the process, no shell in between)."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed), value
    return parsed


@pytest.mark.parametrize("name", ["operator", "runtime"])
def test_dockerfile_parses_into_known_instructions(name):
    parser = parse(name)
    kinds = [item["instruction"] for item in structure(parser)]
    assert kinds and kinds[0] in {"ARG", "FROM"}
    assert set(kinds) <= INSTRUCTIONS, set(kinds) - INSTRUCTIONS
    # Every file the build copies from the context is in the repository and let through the ignore file.
    allowed = (IMAGES / name / "Dockerfile.dockerignore").read_text().split()
    for value in instructions(parser, "COPY"):
        if value.startswith("--from="):
            continue
        *sources, _dest = value.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert f"!{source.rstrip('/')}" in {entry.rstrip("/") for entry in allowed}, (
                f"{source} is ignored"
            )


@pytest.mark.parametrize("name", ["operator", "runtime"])
def test_final_stage_runs_as_non_root(name):
    users = [item["value"] for item in final_stage(parse(name)) if item["instruction"] == "USER"]
    assert users, "the final stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} is not a numeric non-root uid"


def test_operator_image_installs_only_the_operator_extra():
    parser = parse("operator")
    base = parser.baseimage
    assert re.fullmatch(r"python:3\.11[\w.-]*-slim[\w.-]*", base), base
    installs = " ".join(instructions(parser, "RUN"))
    assert '".[operator]"' in installs
    assert "runtime" not in installs and "torch" not in installs
    (entrypoint,) = [item["value"] for item in final_stage(parser) if item["instruction"] == "ENTRYPOINT"]
    assert exec_form(entrypoint) == ["eagle3-operator"]
    assert "eagle3-operator" in PYPROJECT["project"]["scripts"]


def test_runtime_image_is_a_pinned_vllm_rocm_image_with_the_runtime_extra():
    from eagle3_api.common import DEFAULT_VLLM_IMAGE

    parser = parse("runtime")
    repository, _, tag = parser.baseimage.partition(":")
    assert repository == "vllm/vllm-openai-rocm"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), f"base image tag {tag!r} is not a pinned release"
    # The serving/target pods default to the same vLLM release the runtime image is built on.
    assert parser.baseimage == DEFAULT_VLLM_IMAGE
    installs = " ".join(instructions(parser, "RUN"))
    assert '".[runtime]"' in installs
    assert any(
        dep.startswith("amd-quark") for dep in PYPROJECT["project"]["optional-dependencies"]["runtime"]
    )
    (entrypoint,) = [item["value"] for item in final_stage(parser) if item["instruction"] == "ENTRYPOINT"]
    assert exec_form(entrypoint) == ["eagle3"]
    assert PYPROJECT["project"]["scripts"]["eagle3"] == "eagle3_runtime.cli:main"


def test_every_stage_command_of_the_contract_runs_in_the_runtime_cli():
    """`eagle3 <stage> --help` works for every stage docs/contracts.md puts into pods."""
    contract = (REPO_ROOT / "docs" / "contracts.md").read_text()
    stages = sorted(set(STAGE_COMMAND.findall(contract)))
    assert {"generate", "extract", "train", "evaluate", "select", "export", "quantize"} <= set(stages)
    for stage in stages:
        result = subprocess.run(
            [sys.executable, "-m", "eagle3_runtime.cli", stage, "--help"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, f"eagle3 {stage} --help failed:\n{result.stderr[-2000:]}"
        # quantize reads an export and verify a target and a draft; every other stage works in the workspace.
        assert "--workspace" in result.stdout or stage in ("quantize", "verify"), result.stdout
