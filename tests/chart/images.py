"""What the images in images/ can run, for checking the commands the operator puts into pods."""

from __future__ import annotations

import tomllib

from eagle3_runtime.cli import STAGES
from tests.support.cluster import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# The vLLM ROCm base image brings `vllm` and torch's `torchrun`; the runtime image adds the project's
# console scripts (pyproject [project.scripts]).
VLLM_EXECUTABLES = {"vllm", "python3"}
RUNTIME_EXECUTABLES = VLLM_EXECUTABLES | {"torchrun"} | set(PYPROJECT["project"]["scripts"])


def command_problem(command: list[str]) -> str | None:
    """Why a pod command would not run in the runtime image, or None when it would."""
    if not command or command[0] not in RUNTIME_EXECUTABLES:
        return f"{command[:1]} is not installed in the runtime image"
    if command[0] == "torchrun":
        if "--no-python" not in command:
            return "torchrun must launch the eagle3 console script with --no-python"
        command = command[command.index("--no-python") + 1 :]
    if command[0] == "eagle3" and (len(command) < 2 or command[1] not in STAGES):
        return f"eagle3 has no stage {command[1:2]}"
    if command[0] == "vllm" and command[1:2] != ["serve"]:
        return "vllm is started with `vllm serve`"
    return None
