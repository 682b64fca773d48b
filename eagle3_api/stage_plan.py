"""One DraftTraining, one stage plan: the stages in order, which checkpoints to evaluate, and each
stage's `eagle3` command.

The operator's Job builder (eagle3_operator.reconcile.training_children) and `eagle3 pipeline`
(eagle3_runtime.pipeline.runner) both take their commands from here, so a manifest runs the
same commands in pods and on one machine. Only where things live differs, and a `Locations`
says it: in a pod, the workspace and the spec's claims are mounted volumes; locally they are
folders. Pure: imports the rest of eagle3_api only (no kopf, kubernetes, torch or vLLM).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Protocol

from eagle3_api.command_line import flags
from eagle3_api.draft_training import DraftTraining, PromptSource
from eagle3_api.stages import TRAINING_STAGES
from eagle3_api.workspace import Workspace

# Per-object workspace directories live under this folder of the claim (workspace_path).
WORKSPACE_RUNS = "runs"


class StageInputError(ValueError):
    """A stage cannot be planned from what earlier stages reported."""


class Datasets(Protocol):
    """Where a pod finds the data claims a spec names (a verify Job needs no more)."""

    def dataset(self, claim: str, path: str) -> str:
        """A file or directory a stage reads, `path` inside the PVC `claim`."""
        ...


class Locations(Datasets, Protocol):
    """Where a stage finds what the spec names."""

    @property
    def workspace(self) -> str:
        """The workspace directory."""
        ...

    def model(self, ref: str, role: str) -> str:
        """A model the spec names (`role`: target, init): a Hugging Face id as it is, a
        `pvc://CLAIM/PATH` as the path it has here."""
        ...

    def output(self, claim: str, path: str) -> str:
        """A directory a stage writes, `path` inside the PVC `claim` (not the workspace's)."""
        ...


def workspace_claim(dt: DraftTraining) -> str:
    return dt.spec.storage.existing_claim or f"{dt.metadata['name']}-workspace"


def workspace_path(dt: DraftTraining) -> str:
    """The object's own directory inside the workspace claim ("": the claim's root).

    Keyed by the object's uid, so a DraftTraining deleted and created again under the same name,
    or another one on the same `storage.existingClaim`, never reads this one's files. The operator
    records it in `status.workspacePath` when the object starts and keeps it from then on (objects
    started before there was one keep working in the claim's root); a manifest run by `eagle3
    pipeline` has no uid and uses its workspace folder as it is.
    """
    if dt.status.workspace_path is not None:
        return dt.status.workspace_path
    uid = dt.metadata.get("uid")
    return f"{WORKSPACE_RUNS}/{uid}" if uid else ""


def stages(dt: DraftTraining) -> list[str]:
    """The stages in the order they run: eagle3_api.stages's, less those the spec leaves out."""
    spec = dt.spec
    skipped = {
        "extract": spec.hidden_states.mode != "offline",
        "sweep": not spec.evaluation.sweep,
        "quantize": spec.export.quantize == "none",
    }
    return [stage for stage in TRAINING_STAGES if not skipped.get(stage, False)]


def server_for(dt: DraftTraining, stage: str | None) -> str | None:
    """The long-running server a stage talks to: the target vLLM for generation, the streaming
    extraction server (`eagle3 extract --mode streaming`) for streaming training; None otherwise
    (the other stages load the target themselves or need no model)."""
    if stage == "generate":
        return "target"
    if stage == "train" and dt.spec.hidden_states.mode == "streaming":
        return "stream"
    return None


def _workspace_export(dt: DraftTraining) -> str:
    """Where the final draft goes inside the object's workspace directory, without export.claimName."""
    quantize = dt.spec.export.quantize
    return "export" if quantize == "none" else f"export-{quantize}"


def export_destination(dt: DraftTraining) -> tuple[str, str]:
    """(claim, path inside the claim) of the final draft (after quantization, when asked)."""
    export = dt.spec.export
    if export.claim_name:
        return export.claim_name, export.path or dt.metadata["name"]
    return workspace_claim(dt), str(PurePosixPath(workspace_path(dt), _workspace_export(dt)))


def checkpoints_to_evaluate(dt: DraftTraining, train_metrics: Mapping[str, Any]) -> list[int]:
    """The first checkpoint the trainer reported, every `evaluation.everyCheckpoints`-th after
    it, and the last: the first shows how far the draft got early, the last is usually best."""
    steps = sorted({int(s) for s in train_metrics.get("checkpoints") or []})
    if not steps and train_metrics.get("step") is not None:
        steps = [int(train_metrics["step"])]
    if not steps:
        raise StageInputError("the train stage reported no checkpoints")
    every = dt.spec.evaluation.every_checkpoints
    return sorted({s for i, s in enumerate(steps) if i % every == 0} | {steps[-1]})


def _num(value: float) -> str:
    return format(value, "g")


def _layer_ids(dt: DraftTraining) -> str:
    ids = dt.spec.hidden_states.layer_ids
    return ",".join(str(i) for i in ids) if ids else "auto"


def source_arg(source: PromptSource, at: Datasets, weight: float | None = None) -> str:
    """A `--source` or `--prompts` value: PATH,mode=M[,weight=W][,prompt-field=F][,messages-field=F]."""
    arg = f"{at.dataset(source.claim_name, source.path)},mode={source.mode}"
    if weight is not None:
        arg += f",weight={_num(weight)}"
    if source.prompt_field:
        arg += f",prompt-field={source.prompt_field}"
    if source.messages_field:
        arg += f",messages-field={source.messages_field}"
    return arg


def _final_dir(dt: DraftTraining, at: Locations) -> str:
    if not dt.spec.export.claim_name:
        return str(Workspace(at.workspace).root / _workspace_export(dt))
    return at.output(*export_destination(dt))


def _target_flags(dt: DraftTraining, at: Locations) -> dict[str, object]:
    """The target a stage reads itself, at the revision the target server serves."""
    return {
        "--target": at.model(dt.spec.target.model, "target"),
        "--target-revision": dt.spec.target.revision or None,
    }


def _generate_argv(dt: DraftTraining, at: Locations, server: str) -> list[str]:
    """`eagle3 generate` against the target server at `server`, which serves the model under the
    name `target.model`."""
    data, target = dt.spec.data, dt.spec.target
    argv = ["generate"]
    argv += flags(
        {
            "--workspace": at.workspace,
            "--server": server,
            "--model": target.model,
            "--target-revision": target.revision or None,
        }
    )
    for source in data.sources:
        tools = f",tools-field={source.tools_field}" if source.tools_field else ""
        argv += ["--source", source_arg(source, at, source.weight) + tools]
    kwargs = data.chat_template_kwargs
    argv += flags(
        {
            "--num-samples": data.num_samples,
            "--max-tokens": data.max_tokens,
            "--temperature": _num(data.temperature),
            "--top-p": _num(data.top_p),
            "--concurrency": data.concurrency,
            "--seed": data.seed,
            "--on-bad-row": data.on_bad_row,
            "--regenerate-turns": data.regenerate_turns,
            "--max-length": data.max_length,
            "--long-samples": data.long_samples,
            "--chat-template-kwargs": None if kwargs is None else json.dumps(kwargs, sort_keys=True),
        }
    )
    return argv


def _extract_argv(dt: DraftTraining, at: Locations) -> list[str]:
    """`eagle3 extract --mode offline`: hidden states into the workspace (it starts its own server)."""
    argv = ["extract"] + flags(
        {
            "--workspace": at.workspace,
            "--mode": "offline",
            **_target_flags(dt, at),
            "--layer-ids": _layer_ids(dt),
            # The samples generate kept (data.maxLength) are extracted whole, not cut at the default.
            "--max-length": dt.spec.data.max_length,
        }
    )
    return argv + _vllm_arg_flags(dt)


def stream_server_argv(dt: DraftTraining, at: Locations, port: int, stream_port: int) -> list[str]:
    """`eagle3 extract --mode streaming`: the extraction server a streaming trainer reads from."""
    argv = ["extract"] + flags(
        {
            "--workspace": at.workspace,
            "--mode": "streaming",
            **_target_flags(dt, at),
            "--layer-ids": _layer_ids(dt),
            "--max-length": dt.spec.data.max_length,
            "--port": port,
            "--stream-port": stream_port,
        }
    )
    return argv + _vllm_arg_flags(dt)


def _train_argv(dt: DraftTraining, at: Locations, stream_server: str | None) -> list[str]:
    """`eagle3 train`; in streaming mode it reads the states from `stream_server`."""
    spec, training = dt.spec, dt.spec.training
    mode, initialization = spec.hidden_states.mode, spec.draft.initialization
    init_checkpoint = at.model(initialization.path, "init") if initialization.source == "checkpoint" else None
    argv = ["train"]
    argv += flags(
        {
            "--workspace": at.workspace,
            **_target_flags(dt, at),
            "--hidden-states": mode,
            "--server": stream_server if mode == "streaming" else None,
            "--layer-ids": _layer_ids(dt),
            "--draft-vocab-size": spec.draft.vocab_size,
            "--draft-layers": spec.draft.layers,
        }
    )
    argv += training.length_args
    argv += flags(
        {
            "--learning-rate": _num(training.learning_rate),
            "--batch-tokens": training.batch_tokens,
            "--seq-len": training.seq_len,
            "--ttt-steps": training.ttt_steps,
            "--loss-decay": _num(training.loss_decay),
            "--checkpoint-every": training.checkpoint_every,
            "--seed": training.seed,
            "--loss-chunk-rows": training.loss_chunk_rows,
            "--init-checkpoint": init_checkpoint,
        }
    )
    return argv


def _evaluate_argv(dt: DraftTraining, at: Locations, step: int) -> list[str]:
    """`eagle3 evaluate` of the checkpoint at `step`.

    `--baseline cached`: one no-speculation baseline per prompt set, shared by every
    checkpoint; a second vLLM start per checkpoint would double the evaluators' time for a
    number that does not pick the checkpoint (acceptance length does)."""
    spec, evaluation = dt.spec, dt.spec.evaluation
    argv = ["evaluate"]
    argv += flags(
        {
            "--workspace": at.workspace,
            **_target_flags(dt, at),
            "--checkpoint": Workspace(at.workspace).checkpoint_dir(step).name,
        }
    )
    # Prompts borrowed from the first data source are read the way generation read them.
    for source in evaluation.prompts or spec.data.sources[:1]:
        argv += ["--prompts", source_arg(source, at)]
    argv += flags(
        {
            "--num-speculative-tokens": evaluation.num_speculative_tokens,
            "--prompts-per-domain": evaluation.prompts_per_domain,
            "--max-tokens": evaluation.max_tokens,
            "--concurrency": evaluation.concurrency,
            "--baseline": "cached",
            "--max-model-len": spec.target.max_model_len or None,
        }
    )
    if evaluation.context_lengths:
        argv += ["--context-lengths", *map(str, evaluation.context_lengths)]
        argv += ["--context-prompts", str(evaluation.context_prompts)]
    return argv + _vllm_arg_flags(dt)


def _vllm_arg_flags(dt: DraftTraining) -> list[str]:
    """The servers extract, evaluate and sweep start run the target as its server does (tensor
    parallelism, quantization, attention backend, extraArgs): states are taken from, and a draft is
    measured on, the target as it is served."""
    return [f"--vllm-arg={arg}" for arg in dt.spec.target.vllm_stage_server_args]


def _select_argv(dt: DraftTraining, at: Locations) -> list[str]:
    return ["select", "--workspace", at.workspace]


def _sweep_argv(dt: DraftTraining, at: Locations) -> list[str]:
    """`eagle3 sweep` of the selected checkpoint, on evaluate's prompts and answer length."""
    spec, evaluation = dt.spec, dt.spec.evaluation
    sweep = evaluation.sweep
    assert sweep is not None, "stages() plans sweep only with evaluation.sweep"
    argv = ["sweep"] + flags({"--workspace": at.workspace, **_target_flags(dt, at), "--checkpoint": "best"})
    for source in evaluation.prompts or spec.data.sources[:1]:
        argv += ["--prompts", source_arg(source, at)]
    argv += flags({"--max-speculative-tokens": sweep.max_speculative_tokens})
    argv += ["--concurrency", *map(str, sweep.concurrency)]
    argv += flags(
        {
            "--rounds": sweep.rounds,
            "--prompts-per-domain": evaluation.prompts_per_domain,
            "--max-tokens": evaluation.max_tokens,
            "--max-model-len": spec.target.max_model_len or None,
        }
    )
    return argv + _vllm_arg_flags(dt)


def _export_argv(dt: DraftTraining, at: Locations) -> list[str]:
    """`eagle3 export` of the selected checkpoint: to its destination, or into the workspace for
    the quantize stage to read."""
    spec = dt.spec
    output = _final_dir(dt, at) if spec.export.quantize == "none" else str(Workspace(at.workspace).export_dir)
    # The speculators format records its verifier, so `vllm serve DRAFT` finds the target.
    records_verifier = spec.export.format == "speculators" and not spec.target.model.startswith("pvc://")
    return ["export"] + flags(
        {
            "--workspace": at.workspace,
            "--checkpoint": "best",
            "--format": spec.export.format,
            "--output": output,
            "--target": spec.target.model if records_verifier else None,
            "--num-speculative-tokens": spec.evaluation.num_speculative_tokens if records_verifier else None,
        }
    )


def _quantize_argv(dt: DraftTraining, at: Locations) -> list[str]:
    return ["quantize"] + flags(
        {
            "--input": Workspace(at.workspace).latest_export_dir,
            "--output": _final_dir(dt, at),
            "--scheme": dt.spec.export.quantize,
        }
    )


def stage_argv(
    dt: DraftTraining, stage: str, at: Locations, *, server: str | None = None, step: int | None = None
) -> list[str]:
    """The command of one stage after `eagle3`. `server`: the URL of the server the stage talks
    to (`server_for`); `step`: the checkpoint an evaluation measures."""
    if server_for(dt, stage) and not server:
        raise StageInputError(f"{stage} needs the URL of the {server_for(dt, stage)} server")
    if stage == "generate":
        return _generate_argv(dt, at, server)
    if stage == "train":
        return _train_argv(dt, at, server)
    if stage == "evaluate":
        if step is None:
            raise StageInputError("evaluate needs the checkpoint's step")
        return _evaluate_argv(dt, at, step)
    by_stage = {
        "extract": _extract_argv,
        "select": _select_argv,
        "sweep": _sweep_argv,
        "export": _export_argv,
        "quantize": _quantize_argv,
    }
    if stage not in by_stage:
        raise ValueError(f"unknown stage {stage}")
    return by_stage[stage](dt, at)
