"""Progress while a stage runs: the record a stage pod puts in its `eagle3.ai/progress` annotation
(and the workspace's progress/STAGE.json), which the operator copies to `status.progress`.

One model on both sides: the runtime's ProgressReporter builds it with `extra="forbid"` (a field
the model does not know is an error there, not a silent drop), and the operator parses the
annotation with it. Reading, it ignores unknown fields like every API part (eagle3_api.base): a
newer runtime image may still report to an older operator. See docs/contracts.md.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from eagle3_api.base import ApiModel
from eagle3_api.stages import TrainingStageName

PROGRESS_ANNOTATION = "eagle3.ai/progress"


class Progress(ApiModel):
    """The latest progress record of the running stage (the pods' eagle3.ai/progress annotation)."""

    stage: TrainingStageName = Field(description="Stage reporting.")
    step: int | None = Field(None, description="Training step (or evaluation item).")
    total_steps: int | None = Field(None, description="Total steps.")
    loss: float | None = Field(None, description="Latest training loss.")
    accuracy_per_position: list[float] | None = Field(
        None, description="Draft top-1 accuracy per TTT position."
    )
    samples: int | None = Field(None, description="Samples generated or extracted so far.")
    total_samples: int | None = Field(None, description="Samples the stage generates or extracts in all.")
    tokens_per_second: float | None = Field(None, description="Tokens generated per second so far.")
    eta_seconds: float | None = Field(None, description="Estimated seconds left in the stage.")
    updated_at: str | None = Field(None, description="When the record was written.")


def progress_patch(record: dict[str, Any]) -> dict[str, Any]:
    """The pod patch that puts a progress record (`Progress.to_json()`) in the pod's annotation."""
    return {"metadata": {"annotations": {PROGRESS_ANNOTATION: json.dumps(record, separators=(",", ":"))}}}
