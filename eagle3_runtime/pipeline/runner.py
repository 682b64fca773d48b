"""Runs the DraftTraining stages on one machine, with the exact `eagle3 <stage>` commands the
operator's pods run (eagle3_api.stage_plan, each through the CLI's own argument parser),
plus the vLLM servers they need.

Every stage is a no-op when its output is complete, so re-running a killed pipeline resumes it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from eagle3_api import stage_plan
from eagle3_api.stage_result import StageResult
from eagle3_api.workspace import Workspace
from eagle3_runtime import cli
from eagle3_runtime.command_line import config_from_args
from eagle3_runtime.evaluate.baseline import measure_baseline
from eagle3_runtime.evaluate.config import EvaluateConfig
from eagle3_runtime.files import write_json_atomic
from eagle3_runtime.pipeline.config import PipelineConfig
from eagle3_runtime.train.checkpoint import finished_training
from eagle3_runtime.vllm_server import VLLMServer

log = logging.getLogger(__name__)


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


class PipelineRunner:
    """Runs a PipelineConfig's stages (stage_plan) in a workspace folder."""

    def __init__(self, config: PipelineConfig, workspace: str | Path):
        self.training = config.training
        self.workspace = Workspace(workspace)
        self.locations = config.locations(self.workspace.root)
        self.results_dir = self.workspace.root / "results"
        self.logs_dir = self.workspace.root / "logs"
        self.results: dict[str, StageResult] = {}

    def argv(self, stage: str, *, server: str | None = None, step: int | None = None) -> list[str]:
        """The stage's command here: the operator's, with this machine's folders and servers."""
        return stage_plan.stage_argv(self.training, stage, self.locations, server=server, step=step)

    def _stage(self, argv: list[str]) -> StageResult:
        result = run_stage(argv[0], argv[1:], self.results_dir)
        self.results[argv[0]] = result
        return result

    def run(self) -> StageResult:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        evaluated: list[int] = []
        for stage in stage_plan.stages(self.training):
            if stage == "generate":
                self.generate()
            elif stage == "train":
                self.train()
            elif stage == "evaluate":
                evaluated = stage_plan.checkpoints_to_evaluate(self.training, self.results["train"].metrics)
                for step in evaluated:
                    self._stage(self.argv("evaluate", step=step))
            else:
                self._stage(self.argv(stage))
        from eagle3_runtime.pipeline.report import write_report

        report = write_report(self.workspace, self.training)
        selection = self.results["select"].metrics
        exported = self.results[stage_plan.stages(self.training)[-1]].artifacts["path"]
        best = selection["acceptance_length"]
        minimum = self.training.spec.evaluation.min_acceptance_length
        ok = minimum is None or best >= minimum
        message = (
            f"best checkpoint step {selection['step']} (acceptance length {best:.3f}, "
            f"{len(evaluated)} evaluated) exported to "
            f"{exported}; report {report}"
        )
        if not ok:
            message = f"acceptance length {best:.3f} is below the required {minimum}: " + message
        return StageResult(
            stage="pipeline",
            ok=ok,
            message=message,
            metrics={
                "step": selection["step"],
                "acceptance_length": best,
                "seconds": round(time.monotonic() - started, 1),
            },
            artifacts={"export": exported, "report": str(report.relative_to(self.workspace.root))},
        )

    def generate(self) -> None:
        spec = self.training.spec
        if (self.workspace.data_dir / "manifest.json").exists():
            self._stage(self.argv("generate", server="http://unused"))  # complete: no server needed
            return
        with self.target_server() as server:
            self._stage(self.argv("generate", server=server.url))
            # The same server without speculation gives evaluate its baseline: one vLLM start fewer.
            argv = self.argv("evaluate", step=0)
            evaluation = config_from_args(EvaluateConfig, cli.build_parser(argv).parse_args(argv))
            measure_baseline(evaluation, server.url, spec.target.model)

    def target_server(self) -> VLLMServer:
        """The target's server for generate, as the operator's target Deployment serves it: under the
        name `target.model` (so the generate command is the same) with the target's settings."""
        spec = self.training.spec
        settings = {"max_model_len": spec.target.max_model_len} if spec.target.max_model_len else {}
        return VLLMServer(
            self.locations.model(spec.target.model, "target"),
            log_path=self.logs_dir / "generate-vllm.log",
            served_model_name=spec.target.model,
            extra_args=spec.target.vllm_server_args,
            **settings,
        )

    def train(self) -> None:
        spec = self.training.spec
        if spec.hidden_states.mode != "streaming":
            self._stage(self.argv("train"))
            return
        if finished_training(self.workspace, spec.training.total_steps, spec.training.epochs) is not None:
            self._stage(self.argv("train", server="http://unused"))  # complete: no server needed
            return
        from eagle3_runtime.extract.server import start_extraction_server
        from eagle3_runtime.model.config import resolve_layer_ids
        from eagle3_runtime.target import load_target_config
        from eagle3_runtime.vllm_server import free_port

        target = self.locations.model(spec.target.model, "target")
        target_config = load_target_config(target)
        layer_ids = resolve_layer_ids(spec.hidden_states.layer_ids or "auto", target_config.num_hidden_layers)
        server = start_extraction_server(
            target,
            layer_ids,
            target_config.num_hidden_layers,
            log_path=self.logs_dir / "stream-vllm.log",
            endpoint=f"tcp://127.0.0.1:{free_port()}",
            max_model_len=spec.data.max_length + 1,
            vllm_args=spec.target.vllm_stage_server_args,
        )
        try:
            self._stage(self.argv("train", server=server.url))
        finally:
            server.stop()
