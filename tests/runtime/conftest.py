"""Fixtures of the runtime tests: the tiny target and one vLLM server on it per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eagle3_runtime.tiny_target import ensure_tiny_target
from eagle3_runtime.vllm_server import VLLMServer
from tests.support.vllm_server import running_vllm

# The test machine has 2 cores shared with other work.
torch.set_num_threads(2)

SERVED_NAME = "tiny"


@pytest.fixture(scope="session")
def tiny_target() -> Path:
    return ensure_tiny_target()


@pytest.fixture(scope="module")
def target_server(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    with running_vllm(tiny_target, tmp_path_factory.mktemp("vllm"), served_model_name=SERVED_NAME) as server:
        yield server
