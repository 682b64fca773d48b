"""`eagle3 train`: train the draft on the target's hidden states (docs/contracts.md).

The three `--hidden-states` modes only differ in where the HiddenStateSample stream comes
from; see `sample_source`. Under torchrun every rank runs this same command.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open

from eagle3_runtime.hidden_states import iter_shard_samples, read_manifest
from eagle3_runtime.layout import StageResult, Workspace
from eagle3_runtime.model.config import MAX_DRAFT_LAYERS, draft_config_from_target, resolve_layer_ids
from eagle3_runtime.model.vocab import build_draft_vocab, count_tokens
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.target import TargetHead, load_target_config, load_target_embeddings
from eagle3_runtime.train.checkpoint import finished_training
from eagle3_runtime.train.data import rows_per_epoch, steps_for_epochs
from eagle3_runtime.train.distributed import init_distributed
from eagle3_runtime.train.trainer import DraftTrainer, TrainSettings

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workspace", required=True, type=Path)
    parser.add_argument("--target", required=True, help="target model: Hugging Face id or local directory")
    parser.add_argument("--hidden-states", required=True, choices=["offline", "online", "streaming"])
    parser.add_argument("--server", help="vLLM extraction server URL (streaming mode)")
    parser.add_argument("--layer-ids", default="auto", help="auto or three target layer ids, e.g. 2,16,29")
    parser.add_argument("--draft-vocab-size", type=int, default=32000)
    parser.add_argument(
        "--draft-layers", type=int, default=1, help=f"decoder layers of the draft (1..{MAX_DRAFT_LAYERS})"
    )
    parser.add_argument(
        "--init-checkpoint",
        default=None,
        help="warm start from this EAGLE-3 draft (directory or Hugging Face id); default: from scratch",
    )
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument(
        "--epochs", type=int, help="passes over the dataset; the step count is derived from its size"
    )
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument(
        "--batch-tokens", type=int, default=16384, help="tokens per optimizer step, all ranks"
    )
    parser.add_argument("--ttt-steps", type=int, default=3, help="training-time-test unroll depth")
    parser.add_argument("--loss-decay", type=float, default=0.8)
    parser.add_argument(
        "--checkpoint-every", type=int, default=500, help="and always at the end; 0: only at the end"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seq-len", type=int, default=2048, help="packed row length")
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--attention", choices=["auto", "eager", "flex"], default="auto")
    parser.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="torch.compile the TTT loss; auto: on GPU, and on CPU for runs of 100+ steps (it pays back there)",
    )


def _offline_token_records(directory: Path) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Token ids and loss masks of the shards without loading their hidden states."""
    manifest = read_manifest(directory)
    for shard in manifest.shards:
        with safe_open(str(directory / shard["file"]), framework="pt") as handle:
            ids, mask, lengths = (handle.get_tensor(k) for k in ("input_ids", "loss_mask", "lengths"))
        yield from zip(ids.split(lengths.tolist()), mask.split(lengths.tolist()), strict=True)


def sample_source(args, workspace: Workspace, layer_ids: list[int], device: torch.device):
    """(token records for the draft vocabulary, a factory of HiddenStateSample passes) for the mode."""
    if args.hidden_states == "offline":
        directory = workspace.hidden_states_dir
        return (lambda: _offline_token_records(directory)), (lambda: iter_shard_samples(directory))
    from eagle3_runtime import conversations  # the pipeline's tokenised data (generate's output)

    def records():
        return conversations.iter_token_records(workspace.data_dir, args.target)

    if args.hidden_states == "online":
        from eagle3_runtime.target import OnlineHiddenStates

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        online = OnlineHiddenStates(args.target, layer_ids, device=device, dtype=dtype)
        return records, (lambda: online.samples(records()))
    if not args.server:
        raise ValueError("--hidden-states streaming needs --server (a vLLM extraction server)")
    from eagle3_runtime.extract import streaming

    return records, (lambda: streaming.stream_samples(args.server, records(), layer_ids=layer_ids))


def _layer_ids(args, workspace: Workspace, num_hidden_layers: int) -> list[int]:
    layer_ids = resolve_layer_ids(args.layer_ids, num_hidden_layers)
    if args.hidden_states == "offline":
        manifest = read_manifest(workspace.hidden_states_dir)
        if args.layer_ids == "auto":
            layer_ids = resolve_layer_ids(manifest.layer_ids, num_hidden_layers)
        elif manifest.layer_ids != layer_ids:
            raise ValueError(
                f"--layer-ids {layer_ids} but the extracted states are of layers {manifest.layer_ids}"
            )
    return layer_ids


def _result(
    workspace: Workspace, step: int, settings: dict, summary: dict, checkpoints: list[int]
) -> StageResult:
    total, epochs = settings["steps"], settings.get("epochs")
    metrics = {"step": step, "total_steps": total}
    if epochs is not None:
        metrics["epochs"] = epochs
    metrics.update(
        loss=summary.get("loss"),
        accuracy_per_position=summary.get("accuracy_per_position", []),
        simulated_acceptance_length=summary.get("simulated_acceptance_length"),
        checkpoints=[str(s) for s in checkpoints],
        initialized_from=settings.get("init_checkpoint") or "scratch",
    )
    return StageResult(
        stage="train",
        message=f"trained {step}/{total} steps" + (f" ({epochs} epochs)" if epochs is not None else ""),
        metrics=metrics,
        artifacts={"checkpoint": str(workspace.checkpoint_dir(step).relative_to(workspace.root))},
    )


def _total_steps(args, lengths: list[int], settings: TrainSettings) -> int:
    if args.steps is not None:
        return args.steps
    if args.epochs <= 0:
        raise ValueError(f"--epochs must be positive, got {args.epochs}")
    rows = rows_per_epoch(lengths, settings.seq_len)
    total = steps_for_epochs(args.epochs, rows, settings.rows_per_step)
    log.info(
        "%d epochs of %d samples (%d tokens, %d rows of %d) at %d rows per step: %d steps",
        args.epochs,
        len(lengths),
        sum(lengths),
        rows,
        settings.seq_len,
        settings.rows_per_step,
        total,
    )
    return total


def run(args: argparse.Namespace) -> StageResult:
    workspace = Workspace(args.workspace)
    finished = finished_training(workspace, args.steps, args.epochs)
    if finished is not None:
        step = finished["step"]
        return _result(
            workspace, step, finished["settings"], finished.get("metrics", {}), finished["checkpoints"]
        )

    context = init_distributed()
    target_config = load_target_config(args.target)
    layer_ids = _layer_ids(args, workspace, target_config.num_hidden_layers)
    draft_config = draft_config_from_target(
        target_config,
        layer_ids=layer_ids,
        draft_vocab_size=args.draft_vocab_size,
        num_layers=args.draft_layers,
    )
    token_records, source = sample_source(args, workspace, layer_ids, context.device)
    lengths: list[int] = []

    def measured(records):
        for input_ids, loss_mask in records:
            lengths.append(int(input_ids.shape[0]))
            yield input_ids, loss_mask

    counts = count_tokens(measured(token_records()), target_config.vocab_size)
    vocab = build_draft_vocab(counts, args.draft_vocab_size)
    settings = TrainSettings(
        steps=0,  # set below from --steps or --epochs
        epochs=args.epochs,
        init_checkpoint=args.init_checkpoint,
        learning_rate=args.learning_rate,
        batch_tokens=args.batch_tokens,
        seq_len=min(args.seq_len, args.batch_tokens),
        ttt_steps=args.ttt_steps,
        loss_decay=args.loss_decay,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        warmup_steps=args.warmup_steps,
        attention=args.attention,
        compile={"auto": None, "on": True, "off": False}[args.compile],
    )
    settings.steps = _total_steps(args, lengths, settings)
    trainer = DraftTrainer(
        settings=settings,
        draft_config=draft_config,
        vocab=vocab,
        embeddings=load_target_embeddings(args.target),
        target_head=TargetHead.from_pretrained(args.target, target_config),
        source=source,
        context=context,
        workspace=workspace,
        progress=ProgressReporter("train", workspace.root) if context.is_main else None,
        target_name=args.target,
    )
    summary = trainer.train()
    return _result(workspace, trainer.step, asdict(settings), summary, trainer.checkpoints)
