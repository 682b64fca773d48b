"""Writing a stage's files: JSON atomically, and the StageResult where its supervisor reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3_api.stage_result import StageResult


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
