"""The API: pydantic models of DraftTraining and SpecDecodeDeployment, the source of the CRDs."""

from eagle3_operator.api.draft_training import DraftTraining, DraftTrainingSpec, DraftTrainingStatus
from eagle3_operator.api.spec_decode_deployment import (
    SpecDecodeDeployment,
    SpecDecodeDeploymentSpec,
    SpecDecodeDeploymentStatus,
)

__all__ = [
    "DraftTraining",
    "DraftTrainingSpec",
    "DraftTrainingStatus",
    "SpecDecodeDeployment",
    "SpecDecodeDeploymentSpec",
    "SpecDecodeDeploymentStatus",
]
