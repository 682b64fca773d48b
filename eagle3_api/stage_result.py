"""What a stage reports when it ends: one small JSON `StageResult`, written to `--result-file` (in
a pod the termination message, `/dev/termination-log`, which the operator reads)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from eagle3_api.stages import StageName

# Kubernetes truncates termination messages at 4096 bytes.
TERMINATION_MESSAGE_LIMIT = 4096
DEFAULT_RESULT_FILE = "/dev/termination-log"


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
