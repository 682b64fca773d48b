"""The training loop: AdamW, warmup + cosine, grad clipping, bf16 autocast on GPU, FSDP2
under torchrun, checkpoints with exact resume, progress bar and JSON metrics."""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from eagle3_api.workspace import Workspace
from eagle3_runtime.model.draft import Eagle3Draft, init_weights
from eagle3_runtime.model.loss import TTTBatch, TTTStats, compiled_ttt_loss, ttt_loss
from eagle3_runtime.model.vocab import DraftVocab
from eagle3_runtime.pinned_target import PinnedTarget
from eagle3_runtime.progress import ProgressReporter
from eagle3_runtime.target import TargetHead
from eagle3_runtime.train.checkpoint import complete_checkpoints, read_checkpoint, write_checkpoint
from eagle3_runtime.train.data import RowStream, SampleSource, stack_rows
from eagle3_runtime.train.distributed import DistributedContext, shard_model
from eagle3_runtime.train.initialization import warm_start

log = logging.getLogger(__name__)
METRICS_FILE = "train-metrics.jsonl"


@dataclass
class TrainSettings:
    steps: int
    learning_rate: float
    batch_tokens: int  # tokens per optimizer step, over all ranks
    seq_len: int = 2048
    # Defaults are the DraftTraining CRD's (eagle3_api.draft_training.TrainingSpec).
    ttt_steps: int = 3
    loss_decay: float = 0.8
    checkpoint_every: int = 500  # 0: only at the end
    seed: int = 0
    warmup_steps: int | None = None  # default: 5 % of the steps
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    attention: str = "auto"  # eager | flex | auto (flex on GPU)
    compile: bool | None = None  # torch.compile the whole TTT unroll and loss; None: `compile_by_default`
    freeze_lm_head: bool = False  # speculators' recipe: lm_head stays the target's rows
    # lm_head and the KL over this many rows at a time (model.loss.chunked_head_kl): long rows
    # need less memory at the same speed (docs/benchmarks.md, 16K rows). None: all rows at once.
    loss_chunk_rows: int | None = None
    init_checkpoint: str | None = None  # warm start from this draft (train/initialization.py)
    epochs: int | None = None  # what `steps` was derived from, when given in epochs (recorded only)

    @property
    def rows_per_step(self) -> int:
        return max(1, self.batch_tokens // self.seq_len)

    def learning_rate_factor(self, step: int) -> float:
        warmup = self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 20)
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, self.steps - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


# On 2 CPU cores the compile takes about a minute and makes a step about 1.3x faster
# (docs/benchmarks.md): it pays back after about 60 steps, so shorter runs (most tests) stay eager.
CPU_COMPILE_MIN_STEPS = 100


def compile_by_default(settings: TrainSettings, device: torch.device) -> bool:
    return device.type == "cuda" or settings.steps >= CPU_COMPILE_MIN_STEPS


@dataclass
class LaunchedStep:
    """An optimizer step queued on the device; `summary()` waits for its numbers."""

    step: int
    learning_rate: float
    loss_decay: float
    values: torch.Tensor  # TTT stats (5 x k), tokens over all ranks, grad norm

    def __post_init__(self) -> None:
        # Start the copy to (pinned) host memory now; only `summary()` waits for it.
        self.ready = None
        if self.values.is_cuda:
            self.values = self.values.to("cpu", non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()

    def summary(self) -> dict[str, Any]:
        if self.ready is not None:
            self.ready.synchronize()
        stats, tokens, grad_norm = self.values[:-2], self.values[-2], self.values[-1]
        summary = TTTStats.from_tensor(stats.view(5, -1)).summary(self.loss_decay)
        summary.update(
            step=self.step, learning_rate=self.learning_rate, grad_norm=float(grad_norm), tokens=int(tokens)
        )
        return summary


class _Reporter:
    """What `train()` does with each finished step: metrics, progress bar, progress annotation."""

    def __init__(self, trainer: DraftTrainer, total: int):
        self.trainer, self.total = trainer, total
        self.bar = None
        if trainer.show_progress_bar and trainer.step < total:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=trainer.step, desc="train", unit="step", dynamic_ncols=True)
        self.started = self.last = time.monotonic()
        self.after_first: tuple[float, int] | None = None  # (time, step) once the first step is read

    def __call__(self, launched: LaunchedStep) -> None:
        trainer, total = self.trainer, self.total
        summary = launched.summary()
        now = time.monotonic()
        summary["tokens_per_second"] = summary["tokens"] / max(now - self.last, 1e-9)
        self.last = now
        trainer.last_summary = summary
        trainer._log_metrics(summary)
        step = launched.step
        if self.after_first is None:
            self.after_first = (now, step)
            eta = (now - self.started) * (total - step)
        else:
            # The first step carries the compile (a minute or more on GPU): the rate excludes it.
            eta = (now - self.after_first[0]) / (step - self.after_first[1]) * (total - step)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(
                f"loss {summary['loss']:.3f} acc "
                + "/".join(f"{a:.2f}" for a in summary["accuracy_per_position"])
                + f" sim-AL {summary['simulated_acceptance_length']:.2f}"
            )
        if trainer.progress is not None and trainer.context.is_main:
            trainer.progress.report(
                force=step == total,
                step=step,
                total_steps=total,
                loss=round(summary["loss"], 4),
                accuracy_per_position=[round(a, 4) for a in summary["accuracy_per_position"]],
                eta_seconds=round(eta),
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class DraftTrainer:
    def __init__(
        self,
        *,
        settings: TrainSettings,
        draft_config: Any,
        vocab: DraftVocab,
        embeddings: torch.Tensor,
        target_head: TargetHead,
        source: SampleSource,
        context: DistributedContext,
        workspace: Workspace | None = None,
        progress: ProgressReporter | None = None,
        show_progress_bar: bool = True,
        target: PinnedTarget | None = None,
    ):
        if settings.steps <= 0:
            raise ValueError(f"--steps must be positive, got {settings.steps}")
        if settings.rows_per_step % context.world_size:
            raise ValueError(
                f"{settings.rows_per_step} rows of {settings.seq_len} tokens per step cannot be split "
                f"over {context.world_size} processes: choose --batch-tokens as a multiple of "
                f"{settings.seq_len * context.world_size}"
            )
        if embeddings.shape != (draft_config.vocab_size, draft_config.hidden_size):
            raise ValueError(
                f"target embeddings are {tuple(embeddings.shape)}, the draft config expects "
                f"({draft_config.vocab_size}, {draft_config.hidden_size})"
            )
        self.settings, self.context, self.workspace, self.progress = settings, context, workspace, progress
        self.show_progress_bar = show_progress_bar and context.is_main
        self.draft_config, self.vocab, self.target = draft_config, vocab, target
        device = context.device
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
        )
        self.attention = (
            settings.attention
            if settings.attention != "auto"
            else ("flex" if device.type == "cuda" else "eager")
        )

        self.checkpoints: list[int] = complete_checkpoints(workspace) if workspace is not None else []
        torch.manual_seed(settings.seed)
        draft = Eagle3Draft(draft_config)
        init_weights(draft, settings.seed)
        with torch.no_grad():
            draft.embed_tokens.weight.copy_(embeddings)
            draft.d2t.copy_(vocab.d2t)
            draft.t2d.copy_(vocab.t2d)
            # The target's own output rows for the draft vocabulary are a much better start than noise.
            draft.lm_head.weight.copy_(target_head.lm_head_weight[vocab.used_ids].float())
        self.initialization: dict[str, Any] = {"initialized_from": "scratch"}
        if settings.init_checkpoint and not self.checkpoints:  # a resumed run has its own weights
            self.initialization = warm_start(draft, settings.init_checkpoint, vocab)
            log.info("warm start: %s", self.initialization)
        draft.lm_head.weight.requires_grad_(not settings.freeze_lm_head)
        compile_loss = (
            settings.compile if settings.compile is not None else compile_by_default(settings, device)
        )
        self.loss_fn = compiled_ttt_loss() if compile_loss else ttt_loss
        if compile_loss:
            log.info("the first step compiles the training step (a minute or two)")
        # A collective inside the compiled loss would be traced; keep it a clean graph break instead.
        self.reduce_counts = (
            torch.compiler.disable(context.all_reduce_sum) if context.enabled else lambda counts: counts
        )
        self.model = shard_model(draft.to(device), context)
        self.target_head = target_head.to(device)
        self.draft_ids = None if vocab.is_full else vocab.used_ids.to(device)
        # For rows that carry the target's top-1: its logits over the draft vocabulary's rows are all
        # the loss reads (a quarter of the full head's matmul at 32k of 128k rows, and no full argmax).
        self.draft_target_head = (
            self.target_head
            if vocab.is_full
            else TargetHead(
                target_head.norm_weight, target_head.lm_head_weight[vocab.used_ids], target_head.eps
            )
        ).to(device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=settings.learning_rate,
            betas=(0.9, 0.95),
            weight_decay=settings.weight_decay,
            fused=device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, settings.learning_rate_factor)
        self.stream = RowStream(
            source,
            settings.seq_len,
            hidden_size=draft_config.target_hidden_size,
            vocab_size=draft_config.vocab_size,
        )
        self.step = 0
        self.last_summary: dict[str, Any] = {}
        if self.checkpoints:
            self._resume(self.checkpoints[-1])

    # --- one step ---------------------------------------------------------------------------

    def _batch(self) -> tuple[TTTBatch, int]:
        rows = self.stream.take(
            self.settings.rows_per_step, rank=self.context.rank, world_size=self.context.world_size
        )
        dtype = torch.bfloat16 if self.context.device.type == "cuda" else torch.float32
        tensors = stack_rows(rows, self.context.device, dtype)
        top1 = tensors.get("target_top1")
        head = self.target_head if top1 is None else self.draft_target_head
        batch = TTTBatch(
            input_ids=tensors["input_ids"],
            aux_hidden_states=tensors["aux_hidden_states"],
            target_logits=head(tensors["last_hidden_state"]),
            predict_mask=tensors["predict_mask"],
            document_ids=tensors["document_ids"],
            positions=tensors["positions"],
            target_top1=top1,
        )
        return batch, sum(r.num_tokens for r in rows)

    def train_step(self) -> dict[str, Any]:
        """One optimizer step on the next batch; waits for its numbers."""
        started = time.perf_counter()
        summary = self.launch_step().summary()
        summary["tokens_per_second"] = summary["tokens"] / (time.perf_counter() - started)
        return summary

    def launch_step(self) -> LaunchedStep:
        batch, tokens = self._batch()
        return self.launch(batch, tokens)

    def launch(self, batch: TTTBatch, tokens: int) -> LaunchedStep:
        """Forward, backward and optimizer step on one batch already on the device, queued
        without waiting for the device: the step's numbers come back with `summary()`."""
        with self.autocast:
            loss, stats = self.model(
                batch,
                steps=self.settings.ttt_steps,
                decay=self.settings.loss_decay,
                draft_ids=self.draft_ids,
                attention_backend=self.attention,
                reduce_counts=self.reduce_counts,
                loss_fn=self.loss_fn,
                gather_counted=self.context.device.type != "cuda",
                loss_chunk_rows=self.settings.loss_chunk_rows,
            )
        # FSDP averages gradients over ranks; the loss is already normalised globally.
        (loss * self.context.world_size).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        if isinstance(grad_norm, torch.distributed.tensor.DTensor):
            grad_norm = grad_norm.full_tensor()
        learning_rate = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # torch.full, not torch.tensor: a copy from host memory would wait for the queued step.
        token_count = torch.full((1,), float(tokens), device=loss.device)
        reduced = self.context.all_reduce_sum(torch.cat([stats.as_tensor().flatten(), token_count]))
        values = torch.cat([reduced, grad_norm.reshape(1).float()])
        return LaunchedStep(self.step, learning_rate, self.settings.loss_decay, values)

    # --- loop ---------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Runs to `settings.steps`. Step N's numbers are read after step N+1 is queued, so the
        device never idles while the host logs (a checkpoint step is read before the next one)."""
        total = self.settings.steps
        report = _Reporter(self, total)
        pending: LaunchedStep | None = None
        while self.step < total:
            launched = self.launch_step()
            if pending is not None:
                report(pending)
            pending = launched
            every = self.settings.checkpoint_every
            if self.workspace is not None and (self.step == total or (every and self.step % every == 0)):
                report(pending)
                pending = None
                self.save_checkpoint()
        if pending is not None:
            report(pending)
        report.close()
        return self.last_summary

    def _log_metrics(self, summary: dict[str, Any]) -> None:
        if self.workspace is None or not self.context.is_main:
            return
        self.workspace.reports_dir.mkdir(parents=True, exist_ok=True)
        with open(self.workspace.reports_dir / METRICS_FILE, "a") as handle:
            handle.write(json.dumps(summary) + "\n")

    # --- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(self.model, options=options)
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self.context.is_main:
            training_state = {
                "step": self.step,
                "rows_consumed": self.stream.rows_consumed,
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "settings": asdict(self.settings),
                "world_size": self.context.world_size,
            }
            manifest = {
                "metrics": {k: v for k, v in self.last_summary.items() if k != "step"},
                "settings": asdict(self.settings),
                **(self.target.manifest_fields() if self.target else {}),
                "initialization": self.initialization,
            }
            model_state = {k: v for k, v in model_state.items() if not k.startswith("embed_tokens.")}
            write_checkpoint(
                self.workspace,
                self.step,
                model_state=model_state,
                draft_config=self.draft_config,
                training_state=training_state,
                manifest=manifest,
            )
        self.context.barrier()
        self.checkpoints.append(self.step)

    def _resume(self, step: int) -> None:
        from eagle3_runtime.export import read_eagle3_dir

        manifest, state = read_checkpoint(self.workspace, step)
        if self.target:
            self.target.check(manifest, f"checkpoint step-{step:08d}")
        config, weights = read_eagle3_dir(self.workspace.checkpoint_dir(step))
        if config.get("num_hidden_layers", 1) != self.draft_config.num_hidden_layers:
            raise ValueError(
                f"checkpoint step-{step:08d} has {config.get('num_hidden_layers', 1)} decoder layer(s), this run "
                f"{self.draft_config.num_hidden_layers}: train the new shape in a new workspace"
            )
        if "d2t" in weights and not torch.equal(weights["d2t"], self.vocab.d2t):
            raise ValueError(f"checkpoint step-{step:08d} was trained with another draft vocabulary")
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, weights, options=options)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"], options=options)
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.skip(state["rows_consumed"])
        self.step = state["step"]
        self.last_summary = {"step": self.step, **manifest.get("metrics", {})}
        self._truncate_metrics(self.step)
        log.info("resumed from checkpoint step-%08d", step)

    def _truncate_metrics(self, step: int) -> None:
        """Drop metrics an interrupted run logged after the checkpoint it resumes from."""
        if not self.context.is_main:
            return
        path = self.workspace.reports_dir / METRICS_FILE
        if path.exists():
            lines = [
                line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step
            ]
            path.write_text("".join(line + "\n" for line in lines))
