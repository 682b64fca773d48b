"""What `eagle3 train` runs: the draft trained on the target's hidden states (docs/contracts.md).

The three `hidden_states` modes only differ in where the HiddenStateSample stream comes
from; see `sample_source`. Under torchrun every rank runs this same call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3_api.workspace import Workspace
from eagle3_runtime.hidden_states import iter_shard_samples, read_manifest
from eagle3_runtime.model.config import draft_config_from_target, resolve_layer_ids
from eagle3_runtime.model.vocab import build_draft_vocab, count_tokens
from eagle3_runtime.pinned_target import PinnedTarget, pin_target
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.target import TargetHead, load_target_config, load_target_embeddings
from eagle3_runtime.train.checkpoint import finished_training
from eagle3_runtime.train.data import rows_per_epoch, steps_for_epochs
from eagle3_runtime.train.distributed import init_distributed
from eagle3_runtime.train.trainer import DraftTrainer, TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """`eagle3 train`'s flags, one field each (their help says what they mean)."""

    workspace: Path
    target: str
    hidden_states: str  # offline, online or streaming
    server: str | None  # the vLLM extraction server (streaming)
    layer_ids: str
    draft_vocab_size: int
    draft_layers: int
    init_checkpoint: str | None
    steps: int | None  # one of steps and epochs
    epochs: int | None
    learning_rate: float
    batch_tokens: int
    ttt_steps: int
    loss_decay: float
    checkpoint_every: int
    seed: int
    seq_len: int
    loss_chunk_rows: int | None
    warmup_steps: int | None
    attention: str
    compile: str  # auto, on or off
    target_revision: str | None = None


@dataclass
class TrainingOutcome:
    step: int  # the last step trained
    settings: dict  # TrainSettings as a dict; `steps` is the total
    summary: dict  # the last step's metrics
    checkpoints: list[int]


def _offline_token_records(directory: Path) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Token ids and loss masks of the shards without loading their hidden states."""
    manifest = read_manifest(directory)
    for shard in manifest.shards:
        with safe_open(str(directory / shard["file"]), framework="pt") as handle:
            ids, mask, lengths = (handle.get_tensor(k) for k in ("input_ids", "loss_mask", "lengths"))
        yield from zip(ids.split(lengths.tolist()), mask.split(lengths.tolist()), strict=True)


def sample_source(config: TrainConfig, workspace: Workspace, layer_ids: list[int], device: torch.device):
    """(token records for the draft vocabulary, a factory of HiddenStateSample passes) for the mode."""
    if config.hidden_states == "offline":
        directory = workspace.hidden_states_dir
        return (lambda: _offline_token_records(directory)), (lambda: iter_shard_samples(directory))
    from eagle3_runtime import conversations  # the pipeline's tokenised data (generate's output)

    def records():
        return conversations.iter_token_records(workspace.data_dir, config.target)

    if config.hidden_states == "online":
        from eagle3_runtime.target import OnlineHiddenStates

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        online = OnlineHiddenStates(config.target, layer_ids, device=device, dtype=dtype)
        return records, (lambda: online.samples(records()))
    if not config.server:
        raise ValueError("--hidden-states streaming needs --server (a vLLM extraction server)")
    from eagle3_runtime.extract import streaming

    return records, (lambda: streaming.stream_samples(config.server, records(), layer_ids=layer_ids))


def _layer_ids(
    config: TrainConfig, workspace: Workspace, num_hidden_layers: int, target: PinnedTarget
) -> list[int]:
    layer_ids = resolve_layer_ids(config.layer_ids, num_hidden_layers)
    if config.hidden_states == "offline":
        manifest = read_manifest(workspace.hidden_states_dir)
        manifest.check_target(target, workspace.hidden_states_dir)
        if config.layer_ids == "auto":
            layer_ids = resolve_layer_ids(manifest.layer_ids, num_hidden_layers)
        elif manifest.layer_ids != layer_ids:
            raise ValueError(
                f"--layer-ids {layer_ids} but the extracted states are of layers {manifest.layer_ids}"
            )
    return layer_ids


def _total_steps(config: TrainConfig, lengths: list[int], settings: TrainSettings) -> int:
    if config.steps is not None:
        return config.steps
    if config.epochs <= 0:
        raise ValueError(f"--epochs must be positive, got {config.epochs}")
    rows = rows_per_epoch(lengths, settings.seq_len)
    total = steps_for_epochs(config.epochs, rows, settings.rows_per_step)
    log.info(
        "%d epochs of %d samples (%d tokens, %d rows of %d) at %d rows per step: %d steps",
        config.epochs,
        len(lengths),
        sum(lengths),
        rows,
        settings.seq_len,
        settings.rows_per_step,
        total,
    )
    return total


def run_training(config: TrainConfig) -> TrainingOutcome:
    workspace = Workspace(config.workspace)
    finished = finished_training(workspace, config.steps, config.epochs)
    if finished is not None:
        return TrainingOutcome(
            finished["step"], finished["settings"], finished.get("metrics", {}), finished["checkpoints"]
        )

    target = pin_target(config.target, config.target_revision)
    config = replace(config, target=target.path)  # every load below reads the pinned revision
    context = init_distributed()
    target_config = load_target_config(config.target)
    layer_ids = _layer_ids(config, workspace, target_config.num_hidden_layers, target)
    draft_config = draft_config_from_target(
        target_config,
        layer_ids=layer_ids,
        draft_vocab_size=config.draft_vocab_size,
        num_layers=config.draft_layers,
    )
    token_records, source = sample_source(config, workspace, layer_ids, context.device)
    lengths: list[int] = []

    def measured(records):
        for input_ids, loss_mask in records:
            lengths.append(int(input_ids.shape[0]))
            yield input_ids, loss_mask

    counts = count_tokens(measured(token_records()), target_config.vocab_size)
    vocab = build_draft_vocab(counts, config.draft_vocab_size)
    settings = TrainSettings(
        steps=0,  # set below from --steps or --epochs
        epochs=config.epochs,
        init_checkpoint=config.init_checkpoint,
        learning_rate=config.learning_rate,
        batch_tokens=config.batch_tokens,
        seq_len=min(config.seq_len, config.batch_tokens),
        ttt_steps=config.ttt_steps,
        loss_decay=config.loss_decay,
        checkpoint_every=config.checkpoint_every,
        seed=config.seed,
        warmup_steps=config.warmup_steps,
        attention=config.attention,
        loss_chunk_rows=config.loss_chunk_rows,
        compile={"auto": None, "on": True, "off": False}[config.compile],
    )
    settings.steps = _total_steps(config, lengths, settings)
    trainer = DraftTrainer(
        settings=settings,
        draft_config=draft_config,
        vocab=vocab,
        embeddings=load_target_embeddings(config.target, target_config),
        target_head=TargetHead.from_pretrained(config.target, target_config),
        source=source,
        context=context,
        workspace=workspace,
        progress=ProgressReporter("train", workspace.root) if context.is_main else None,
        target=target,
    )
    summary = trainer.train()
    context.close()
    return TrainingOutcome(trainer.step, asdict(settings), summary, trainer.checkpoints)
