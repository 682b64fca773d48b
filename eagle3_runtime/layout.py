"""The contract between the operator and the runtime stages.

Every stage reads and writes files under one workspace directory (a PVC in the
cluster, a local folder for `eagle3 pipeline`), and ends by writing a small JSON
`StageResult` to `--result-file` (the pod's termination message in the cluster,
`/dev/termination-log`). The operator imports only this module, so it must not
import torch or vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Kubernetes truncates termination messages at 4096 bytes.
TERMINATION_MESSAGE_LIMIT = 4096
DEFAULT_RESULT_FILE = "/dev/termination-log"

StageName = Literal[
    "generate", "extract", "train", "evaluate", "select", "sweep", "export", "quantize", "verify", "pipeline"
]


class Workspace:
    """Paths of one pipeline's workspace; every stage derives its files from here."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    @property
    def data_dir(self) -> Path:
        """`generate` output: sharded JSONL conversations plus manifest.json."""
        return self.root / "data"

    @property
    def hidden_states_dir(self) -> Path:
        """`extract --mode offline` output: safetensors shards plus manifest.json."""
        return self.root / "hidden-states"

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints_dir / f"step-{step:08d}"

    @property
    def evaluations_dir(self) -> Path:
        return self.root / "evaluations"

    def evaluation_file(self, step: int) -> Path:
        return self.evaluations_dir / f"step-{step:08d}.json"

    @property
    def selection_file(self) -> Path:
        return self.root / "selection.json"

    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    @property
    def latest_export_dir(self) -> Path:
        """The newest draft exported into the workspace (a link to its versioned directory)."""
        return self.export_dir / LATEST_EXPORT

    @property
    def reports_dir(self) -> Path:
        return self.root / "reports"


# A published draft is never overwritten: each export lands in DESTINATION/<export_version(digest)>,
# and DESTINATION/latest links to the newest (for people and scripts; vLLM is given the version).
LATEST_EXPORT = "latest"


def export_version(digest: str) -> str:
    """The directory name of the export whose content digest is `digest` ("sha256:<hex>")."""
    algorithm, _, hex_digest = digest.partition(":")
    if algorithm != "sha256" or len(hex_digest) != 64:
        raise ValueError(f"not a sha256 content digest: {digest!r}")
    return f"sha256-{hex_digest[:16]}"


class StageResult(BaseModel):
    """What a stage reports when it ends; small enough for a termination message."""

    model_config = ConfigDict(extra="forbid")

    stage: StageName
    ok: bool = True
    message: str = ""
    # Stage-specific numbers, e.g. {"samples": 512} or {"step": 900, "loss": 1.9}; rows of ints
    # for sweep's schedule.
    metrics: dict[str, float | int | str | list[float | int | str] | list[list[int]] | None] = Field(
        default_factory=dict
    )
    # Files the stage produced, relative to the workspace root.
    artifacts: dict[str, str] = Field(default_factory=dict)

    def to_message(self) -> str:
        text = self.model_dump_json(exclude_defaults=False)
        if len(text.encode()) <= TERMINATION_MESSAGE_LIMIT:
            return text
        # Keep the verdict and drop the bulky parts rather than emit invalid JSON.
        slim = self.model_copy(update={"metrics": {}, "message": self.message[:1000]})
        return slim.model_dump_json()

    @classmethod
    def parse_message(cls, text: str) -> StageResult:
        return cls.model_validate_json(text)


def write_result(result: StageResult, path: str | os.PathLike[str] | None) -> None:
    """Write the result where the supervisor reads it; no-op when no path is given."""
    if not path:
        return
    Path(path).write_text(result.to_message())


def write_json_atomic(path: str | os.PathLike[str], payload: Any) -> None:
    """Write JSON so a crash never leaves a half-written manifest behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)


def content_hash(obj: Any) -> str:
    """A short, stable hash of a JSON-serialisable value (key order does not matter)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
