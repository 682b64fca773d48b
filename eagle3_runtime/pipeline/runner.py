"""Runs the DraftTraining stages on one machine, with the exact `eagle3 <stage>` commands the
operator's pods run (each through its own argument parser), plus the vLLM servers they need.

Every stage is a no-op when its output is complete, so re-running a killed pipeline resumes it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from eagle3_runtime import cli
from eagle3_runtime.layout import StageResult, Workspace, write_json_atomic
from eagle3_runtime.pipeline.config import PipelineConfig
from eagle3_runtime.stages.train import finished_training
from eagle3_runtime.train.checkpoint import complete_checkpoints
from eagle3_runtime.vllm_server import VLLMServer

log = logging.getLogger(__name__)
SERVED_NAME = "target"


class StageFailed(RuntimeError):
    def __init__(self, result: StageResult):
        super().__init__(f"stage {result.stage} failed: {result.message}")
        self.result = result


def run_stage(stage: str, argv: list[str], results_dir: Path) -> StageResult:
    """Parse `eagle3 <stage> argv` like the CLI does and run it in this process."""
    full = [stage, *argv, "--result-file", str(results_dir / f"{stage}.json")]
    log.info("$ eagle3 %s", " ".join(full))
    args = cli.build_parser(full).parse_args(full)
    started = time.monotonic()
    try:
        result = cli._stage_module(stage).run(args)
    except Exception as exc:
        log.exception("eagle3 %s failed", stage)
        result = StageResult(stage=stage, ok=False, message=f"{type(exc).__name__}: {exc}")
        write_json_atomic(results_dir / f"{stage}.json", json.loads(result.to_message()))
        raise StageFailed(result) from exc
    write_json_atomic(results_dir / f"{stage}.json", json.loads(result.to_message()))
    log.info("eagle3 %s: %s (%.0f s)", stage, result.message, time.monotonic() - started)
    return result


def _source_arg(spec) -> str:
    parts = [spec.path, f"mode={spec.mode}", f"weight={spec.weight}", f"prompt-field={spec.prompt_field}",
             f"messages-field={spec.messages_field}"]  # fmt: skip
    if spec.domain:
        parts.append(f"domain={spec.domain}")
    return ",".join(parts)


def checkpoints_to_evaluate(steps: list[int], every: int) -> list[int]:
    """The first checkpoint, every `every`-th after it, and the last one."""
    chosen = {s for i, s in enumerate(steps) if i % every == 0}
    return sorted(chosen | ({steps[-1]} if steps else set()))


class PipelineRunner:
    def __init__(self, config: PipelineConfig, workspace: str | Path):
        self.config = config
        self.workspace = Workspace(workspace)
        self.results_dir = self.workspace.root / "results"
        self.logs_dir = self.workspace.root / "logs"
        self.results: dict[str, StageResult] = {}

    def _stage(self, stage: str, argv: list[str]) -> StageResult:
        if "--workspace" not in argv:
            argv = ["--workspace", str(self.workspace.root), *argv]
        result = run_stage(stage, argv, self.results_dir)
        self.results[stage] = result
        return result

    def run(self) -> StageResult:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        c = self.config
        started = time.monotonic()
        self.generate()
        if c.hidden_states == "offline":
            self._stage("extract", ["--mode", "offline", "--target", c.target, "--layer-ids", c.layer_ids,
                                    "--concurrency", str(c.local.extract_concurrency)])  # fmt: skip
        self.train()
        evaluated = self.evaluate()
        selection = self._stage("select", [])
        self._stage("export", ["--checkpoint", "best", "--format", c.export_format, "--output",
                               str(self.workspace.export_dir), "--target", c.target])  # fmt: skip
        if c.quantize != "none":
            self._stage("quantize", ["--input", str(self.workspace.export_dir), "--output",
                                     str(self.workspace.root / f"export-{c.quantize}"), "--scheme", c.quantize])  # fmt: skip
        from eagle3_runtime.pipeline.report import write_report

        report = write_report(self.workspace, c)
        best = selection.metrics["acceptance_length"]
        ok = c.min_acceptance_length is None or best >= c.min_acceptance_length
        message = (
            f"best checkpoint step {selection.metrics['step']} (acceptance length {best:.3f}, "
            f"{len(evaluated)} evaluated) exported to {self.workspace.export_dir}; report {report}"
        )
        if not ok:
            message = (
                f"acceptance length {best:.3f} is below the required {c.min_acceptance_length}: " + message
            )
        return StageResult(
            stage="pipeline",
            ok=ok,
            message=message,
            metrics={"step": selection.metrics["step"], "acceptance_length": best,
                     "seconds": round(time.monotonic() - started, 1)},
            artifacts={"export": "export", "report": str(report.relative_to(self.workspace.root))},
        )  # fmt: skip

    def generate(self) -> None:
        c = self.config
        argv = ["--model", SERVED_NAME, "--num-samples", str(c.num_samples), "--max-tokens", str(c.max_tokens),
                "--temperature", str(c.temperature), "--top-p", str(c.top_p), "--concurrency", str(c.concurrency),
                "--seed", str(c.seed), "--on-bad-row", c.on_bad_row]  # fmt: skip
        for source in c.sources:
            argv += ["--source", _source_arg(source)]
        if (self.workspace.data_dir / "manifest.json").exists():
            self._stage("generate", ["--server", "http://unused", *argv])  # complete: no server needed
            return
        with VLLMServer(c.target, log_path=self.logs_dir / "generate-vllm.log", served_model_name=SERVED_NAME,
                        max_model_len=c.local.max_model_len) as server:  # fmt: skip
            self._stage("generate", ["--server", server.url, *argv])
            # The same server without speculation gives evaluate its baseline: one vLLM start fewer.
            from eagle3_runtime.stages.evaluate import measure_baseline

            args = cli.build_parser(["evaluate"]).parse_args(["evaluate", *self.evaluate_argv("step-0")])
            measure_baseline(self.workspace, server.url, SERVED_NAME, args)

    def train(self) -> None:
        c = self.config
        length = ["--epochs", str(c.epochs)] if c.epochs is not None else ["--steps", str(c.steps)]
        argv = ["--target", c.target, "--hidden-states", c.hidden_states, "--layer-ids", c.layer_ids,
                "--draft-vocab-size", str(c.draft_vocab_size), "--draft-layers", str(c.draft_layers), *length,
                "--learning-rate", str(c.learning_rate), "--batch-tokens", str(c.batch_tokens),
                "--ttt-steps", str(c.ttt_steps), "--loss-decay", str(c.loss_decay),
                "--checkpoint-every", str(c.checkpoint_every), "--seed", str(c.train_seed),
                "--seq-len", str(c.local.seq_len)]  # fmt: skip
        if c.init_checkpoint:
            argv += ["--init-checkpoint", c.init_checkpoint]
        finished = finished_training(self.workspace, None if c.epochs is not None else c.steps, c.epochs)
        if c.hidden_states != "streaming" or finished is not None:
            self._stage("train", argv)
            return
        from eagle3_runtime.conversations import DEFAULT_MAX_LENGTH
        from eagle3_runtime.extract.server import start_extraction_server
        from eagle3_runtime.model.config import resolve_layer_ids
        from eagle3_runtime.target import load_target_config
        from eagle3_runtime.vllm_server import free_port

        target_config = load_target_config(c.target)
        layer_ids = resolve_layer_ids(c.layer_ids, target_config.num_hidden_layers)
        server = start_extraction_server(
            c.target, layer_ids, target_config.num_hidden_layers, log_path=self.logs_dir / "stream-vllm.log",
            endpoint=f"tcp://127.0.0.1:{free_port()}", max_model_len=DEFAULT_MAX_LENGTH + 1,
        )  # fmt: skip
        try:
            self._stage("train", [*argv, "--server", server.url])
        finally:
            server.stop()

    def evaluate(self) -> list[int]:
        c = self.config
        steps = checkpoints_to_evaluate(complete_checkpoints(self.workspace), c.evaluate_every)
        if not steps:
            raise RuntimeError(f"training left no checkpoint in {self.workspace.checkpoints_dir}")
        for step in steps:
            self._stage("evaluate", self.evaluate_argv(f"step-{step:08d}"))
        return steps

    def evaluate_argv(self, checkpoint: str, *, baseline: str = "cached", rounds: int = 1) -> list[str]:
        """`eagle3 evaluate` arguments for a checkpoint (step-N or a draft directory) under this config.

        The pipeline's checkpoints share one cached baseline, measured on the generate server (one
        vLLM start per checkpoint instead of two); their results say when it was measured."""
        c = self.config
        prompts = [arg for spec in c.eval_prompts for arg in ("--prompts", _source_arg(spec))]
        return [
            "--workspace", str(self.workspace.root), "--target", c.target, "--checkpoint", checkpoint, *prompts,
            "--num-speculative-tokens", str(c.num_speculative_tokens),
            "--prompts-per-domain", str(c.local.eval_prompts_per_domain),
            "--max-tokens", str(c.local.eval_max_tokens), "--concurrency", str(c.local.eval_concurrency),
            "--max-model-len", str(c.local.max_model_len), "--baseline", baseline, "--rounds", str(rounds),
        ]  # fmt: skip
