"""Where a pipeline's files live: every stage reads and writes under one workspace directory (a PVC
in the cluster, a local folder for `eagle3 pipeline`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


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


def content_hash(obj: Any) -> str:
    """A short, stable hash of a JSON-serialisable value (key order does not matter)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
