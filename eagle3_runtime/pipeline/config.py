"""What `eagle3 pipeline` runs: from a DraftTraining manifest (or its bare spec) in YAML, or a preset.

The file is validated with the operator's own API models (eagle3_operator.api), so a manifest
that runs locally is one the cluster accepts, and vice versa. Cluster references become local
paths: `pvc://CLAIM/PATH` and a data source's `claimName` + `path` resolve under the directory
given for that claim with `--volume CLAIM=DIR` (default: a folder named CLAIM next to the file).
An optional top-level `local:` section (ignored by the cluster) tunes the local run: the vLLM
max model length, the evaluation prompts per domain, the answer length during evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from eagle3_runtime.generate import SourceSpec


@dataclass
class LocalSettings:
    max_model_len: int = 1024
    eval_prompts_per_domain: int = 16
    eval_max_tokens: int = 128
    eval_concurrency: int = 1
    seq_len: int = 2048
    extract_concurrency: int = 4


@dataclass
class PipelineConfig:
    target: str
    sources: list[SourceSpec]
    eval_prompts: list[SourceSpec]
    num_samples: int = 5000
    max_tokens: int = 1024
    temperature: float = 0.7
    top_p: float = 0.95
    concurrency: int = 64
    seed: int = 0
    on_bad_row: str = "skip"
    hidden_states: str = "offline"
    layer_ids: str = "auto"
    draft_vocab_size: int = 32000
    draft_layers: int = 1
    init_checkpoint: str | None = None  # warm start (a local directory or a Hugging Face id)
    steps: int | None = 2000
    epochs: int | None = None  # instead of steps
    learning_rate: float = 1e-4
    batch_tokens: int = 16384
    ttt_steps: int = 3
    loss_decay: float = 0.8
    checkpoint_every: int = 500
    train_seed: int = 0
    evaluate_every: int = 1
    num_speculative_tokens: int = 3
    min_acceptance_length: float | None = None
    export_format: str = "eagle3"
    quantize: str = "none"
    local: LocalSettings = field(default_factory=LocalSettings)


def _resolve(claim: str, path: str, volumes: dict[str, Path], base: Path) -> Path:
    root = volumes.get(claim, base / claim)
    resolved = (root / path).resolve()
    if not resolved.exists():
        raise FileNotFoundError(
            f"{claim}/{path} resolves to {resolved}, which does not exist (use --volume {claim}=DIR)"
        )
    return resolved


def _model_path(model: str, volumes: dict[str, Path], base: Path) -> str:
    if model.startswith("pvc://"):
        claim, _, path = model.removeprefix("pvc://").partition("/")
        return str(_resolve(claim, path, volumes, base))
    return model  # a Hugging Face id, read from the local hub cache


def load_config(path: str | Path, volumes: dict[str, Path] | None = None) -> PipelineConfig:
    """A DraftTraining manifest or spec YAML -> PipelineConfig (validated by the operator's API models)."""
    from eagle3_operator.api.draft_training import KIND, DraftTrainingSpec
    from pydantic import ValidationError

    path = Path(path)
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected a YAML mapping (a {KIND} manifest or its spec)")
    if document.get("kind") not in (None, KIND):
        raise ValueError(f"{path}: kind {document['kind']!r}, expected {KIND}")
    raw_spec = document.get("spec", document) if "kind" in document else document
    local = LocalSettings(**(raw_spec.get("local") or document.get("local") or {}))
    try:
        spec = DraftTrainingSpec.model_validate({k: v for k, v in raw_spec.items() if k != "local"})
    except ValidationError as exc:
        raise ValueError(f"{path}: not a valid {KIND} spec:\n{exc}") from None
    return from_spec(spec, volumes or {}, path.parent, local)


def from_spec(spec: Any, volumes: dict[str, Path], base: Path, local: LocalSettings) -> PipelineConfig:
    sources = [
        SourceSpec(
            path=str(_resolve(s.claim_name, s.path, volumes, base)),
            mode=s.mode,
            weight=s.weight,
            **({"prompt_field": s.prompt_field} if s.prompt_field else {}),
            **({"messages_field": s.messages_field} if s.messages_field else {}),
        )
        for s in spec.data.sources
    ]
    evaluation = spec.evaluation
    if evaluation.prompts is not None:
        prompts_path = _resolve(evaluation.prompts.claim_name, evaluation.prompts.path, volumes, base)
        eval_prompts = [SourceSpec(path=str(prompts_path), mode=sources[0].mode)]
    else:
        eval_prompts = [sources[0]]
    layer_ids = spec.hidden_states.layer_ids
    if spec.target.max_model_len:
        local.max_model_len = spec.target.max_model_len
    return PipelineConfig(
        target=_model_path(spec.target.model, volumes, base),
        sources=sources,
        eval_prompts=eval_prompts,
        num_samples=spec.data.num_samples,
        max_tokens=spec.data.max_tokens,
        temperature=spec.data.temperature,
        top_p=spec.data.top_p,
        concurrency=spec.data.concurrency,
        seed=spec.data.seed,
        on_bad_row=spec.data.on_bad_row,
        hidden_states=spec.hidden_states.mode,
        layer_ids=",".join(map(str, layer_ids)) if layer_ids else "auto",
        draft_vocab_size=spec.draft.vocab_size,
        draft_layers=spec.draft.layers,
        init_checkpoint=(
            _model_path(init.path, volumes, base) if (init := spec.draft.initialization).path else None
        ),
        steps=spec.training.total_steps,
        epochs=spec.training.epochs,
        learning_rate=spec.training.learning_rate,
        batch_tokens=spec.training.batch_tokens,
        ttt_steps=spec.training.ttt_steps,
        loss_decay=spec.training.loss_decay,
        checkpoint_every=spec.training.checkpoint_every,
        train_seed=spec.training.seed,
        evaluate_every=evaluation.every_checkpoints,
        num_speculative_tokens=evaluation.num_speculative_tokens,
        min_acceptance_length=evaluation.min_acceptance_length,
        export_format=spec.export.format,
        quantize=spec.export.quantize,
        local=local,
    )


def parse_volumes(values: list[str]) -> dict[str, Path]:
    volumes = {}
    for value in values:
        claim, sep, directory = value.partition("=")
        if not sep or not claim or not directory:
            raise ValueError(f"--volume {value!r}: expected CLAIM=DIR")
        volumes[claim] = Path(directory)
    return volumes
