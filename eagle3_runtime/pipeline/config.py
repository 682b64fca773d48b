"""What `eagle3 pipeline` runs: a DraftTraining manifest (or its bare spec) in YAML, and where its
volumes are on this machine.

The file is validated with the API models the operator uses (eagle3_api), and the stage
commands come from eagle3_api.stage_plan, as the operator's Jobs' do: a manifest that runs
here runs the same commands on a cluster, and vice versa. Only the places differ: the
workspace PVC is the `--workspace` folder, and every other claim the spec names (a
`pvc://CLAIM/PATH` model, the `claimName` + `path` of a data source, of an evaluation prompt
source, of the export) is the folder given with `--volume CLAIM=DIR` (default: a folder named
CLAIM next to the file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from eagle3_api import API_VERSION, stage_plan
from eagle3_api.draft_training import KIND, DraftTraining


@dataclass
class LocalLocations:
    """stage_plan.Locations on this machine: claims are folders, the workspace is a folder."""

    root: Path  # the workspace
    volumes: dict[str, Path]
    default_volumes: Path  # a claim without --volume is the folder of its name here

    @property
    def workspace(self) -> str:
        return str(self.root)

    def _claim(self, claim: str, path: str) -> Path:
        return (self.volumes.get(claim, self.default_volumes / claim) / path).resolve()

    def model(self, ref: str, role: str) -> str:
        if not ref.startswith("pvc://"):
            return ref  # a Hugging Face id, read from the local hub cache
        claim, _, path = ref.removeprefix("pvc://").partition("/")
        return self.dataset(claim, path)

    def dataset(self, claim: str, path: str) -> str:
        resolved = self._claim(claim, path)
        if not resolved.exists():
            raise FileNotFoundError(
                f"{claim}/{path} resolves to {resolved}, which does not exist (use --volume {claim}=DIR)"
            )
        return str(resolved)

    def output(self, claim: str, path: str) -> str:
        return str(self._claim(claim, path))


@dataclass
class PipelineConfig:
    """A DraftTraining and the folders its claims map to."""

    training: DraftTraining
    volumes: dict[str, Path]
    default_volumes: Path

    def locations(self, workspace: Path) -> LocalLocations:
        return LocalLocations(workspace, self.volumes, self.default_volumes)


def load_config(path: str | Path, volumes: dict[str, Path] | None = None) -> PipelineConfig:
    """A DraftTraining manifest or spec YAML, validated by the operator's API models, whose
    inputs all exist under `volumes`."""
    path = Path(path)
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a YAML mapping (a {KIND} manifest or its spec)")
    if "local" in document or "local" in (document.get("spec") or {}):
        raise ValueError(
            f"{path}: the `local` section is gone; its settings are spec fields that the cluster runs too "
            "(target.maxModelLen, training.seqLen, evaluation.promptsPerDomain/maxTokens/concurrency)"
        )
    if "kind" not in document:  # a bare spec
        document = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": path.stem},
            "spec": document,
        }
    if (document["kind"], document.get("apiVersion")) != (KIND, API_VERSION):
        raise ValueError(
            f"{path}: {document.get('apiVersion')}/{document['kind']}, expected {API_VERSION}/{KIND}"
        )
    if not (document.get("metadata") or {}).get("name"):
        raise ValueError(f"{path}: metadata.name is missing")
    try:
        training = DraftTraining.model_validate(document)
    except ValidationError as exc:
        raise ValueError(f"{path}: not a valid {KIND} spec:\n{exc}") from None
    config = PipelineConfig(training, volumes or {}, path.parent)
    # Resolve every input now (the commands that name them), so a missing folder stops the run
    # before it starts a server, not an hour into it.
    at = config.locations(Path("."))
    for stage in ("generate", "train", "evaluate"):
        stage_plan.stage_argv(training, stage, at, server="http://unused", step=0)
    return config


def parse_volumes(values: list[str]) -> dict[str, Path]:
    volumes = {}
    for value in values:
        claim, sep, directory = value.partition("=")
        if not sep or not claim or not directory:
            raise ValueError(f"--volume {value!r}: expected CLAIM=DIR")
        volumes[claim] = Path(directory)
    return volumes
