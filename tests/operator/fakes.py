"""Builders of API objects as the API server returns them, what the tests' stage pods report, and
lookups into planned objects: for the planner unit tests, and the cluster and chart tests that play
the stage pods."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from eagle3_api.stage_result import StageResult

NOW = datetime(2026, 11, 29, 9, 0, 0, tzinfo=UTC)


def draft_training(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpus": 1},
        "data": {"sources": [{"claimName": "prompts", "path": "chat.jsonl"}], "numSamples": 100},
        "training": {"steps": 100, "checkpointEvery": 50},
    }
    for key, value in spec_overrides.items():
        spec[key] = value
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": spec,
    }


def spec_decode(**spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpus": 2, "tensorParallelSize": 2},
        "draft": {"model": "pvc://drafts/llama-eagle3"},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": "chat", "namespace": "ml", "uid": "uid-2", "generation": 1},
        "spec": spec,
    }


def ready_deployment(desired: dict[str, Any], ready: int | None = None) -> dict[str, Any]:
    obj = copy.deepcopy(desired)
    replicas = obj["spec"]["replicas"]
    ready = replicas if ready is None else ready
    obj["metadata"]["generation"] = 1
    obj["status"] = {
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
    }
    return obj


def finished_job(desired: dict[str, Any], *, ok: bool, at: datetime = NOW) -> dict[str, Any]:
    obj = copy.deepcopy(desired)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    kind = "Complete" if ok else "Failed"
    condition = {"type": kind, "status": "True", "lastTransitionTime": stamp}
    if not ok:
        condition |= {
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
        }
    obj["status"] = {"conditions": [condition]} | ({"completionTime": stamp} if ok else {})
    return obj


def job_pod(
    job: dict[str, Any],
    *,
    phase: str,
    message: str | None,
    reason: str = "Completed",
    exit_code: int = 0,
    index: int = 0,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    name = job["metadata"]["name"]
    terminated = {"exitCode": exit_code, "reason": reason, "finishedAt": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if message is not None:
        terminated["message"] = message
    state = {"terminated": terminated} if phase in ("Succeeded", "Failed") else {"running": {}}
    return {
        "metadata": {
            "name": f"{name}-{index}-abcde",
            "namespace": job["metadata"]["namespace"],
            "labels": {"batch.kubernetes.io/job-name": name, "job-name": name},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)} | (annotations or {}),
            "creationTimestamp": (NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "status": {"phase": phase, "containerStatuses": [{"name": "stage", "state": state}]},
    }


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition of `type_` in a planned status."""
    return next(c for c in status["conditions"] if c["type"] == type_)


def command(job: dict[str, Any]) -> list[str]:
    """The command of a Job's (or a Deployment's) first container."""
    return job["spec"]["template"]["spec"]["containers"][0]["command"]


def flag(argv: list[str], name: str) -> str | None:
    """The value that follows flag `name` in a command line (None when it is not there)."""
    return argv[argv.index(name) + 1] if name in argv else None


def result(stage: str, ok: bool = True, message: str = "", **metrics: Any) -> str:
    return StageResult(stage=stage, ok=ok, message=message, metrics=metrics).to_message()


# The stages an offline DraftTraining walks, in order.
OFFLINE_STAGES = ["generate", "extract", "train", "evaluate", "select", "export"]


# What each stage "reports" when the tests play its pods: one formula for the unit, cluster and chart
# tests (numbers are arbitrary but checked). Checkpoints at half and all of the training's steps;
# acceptance grows with the step, so the last checkpoint is the best.
def stage_report(stage: str, job: str, *, ok: bool = True, total_steps: int = 100) -> str:
    """The result message the pod of stage Job `job` ends with."""
    return result(stage, ok, **stage_metrics(stage, job, total_steps))


# export and quantize report the published draft's content digest: two, to tell which one a status took.
EXPORT_DIGEST = "sha256:" + "0123456789abcdef" * 4
QUANTIZE_DIGEST = "sha256:" + "cd" * 32


def acceptance_at(step: int, total_steps: int) -> float:
    return round(2.0 + 0.4 * step / total_steps, 6)


# evaluation.contextLengths: acceptance falls a little with the context; the longest bucket is unfilled.
CONTEXT_LENGTHS, UNFILLED_CONTEXT_LENGTHS = [1024, 2048], [4096]


def context_metrics(step: int, total_steps: int) -> dict[str, list[float]]:
    return {
        "context_lengths": CONTEXT_LENGTHS,
        "context_acceptance_length": [
            round(acceptance_at(step, total_steps) - 0.05 * i, 6) for i in range(2)
        ],
        "context_drafts": [300.0, 280.0],
        "context_lengths_unfilled": UNFILLED_CONTEXT_LENGTHS,
    }


def stage_metrics(stage: str, job: str, total_steps: int = 100) -> dict[str, Any]:
    """The metrics of the stage Job `job` (an evaluate Job's name ends in its step)."""
    if stage == "generate":
        return {"samples": 100, "tokens": 51200, "tokens_per_second": 900.0, "bad_rows": 0}
    if stage == "extract":
        return {"samples": 100, "tokens": 51200}
    if stage == "train":
        return {
            "step": total_steps,
            "total_steps": total_steps,
            "loss": 1.25,
            "accuracy_per_position": [0.7, 0.5, 0.4],
            "simulated_acceptance_length": 2.1,
            "checkpoints": [str(total_steps // 2), str(total_steps)],
        }
    if stage == "evaluate":
        step = int(job.split("-eval-")[-1].split("-")[0])  # NAME-eval-STEP[-rATTEMPT]
        return {
            "step": step,
            "acceptance_length": acceptance_at(step, total_steps),
            "acceptance_per_position": [0.6, 0.4],
            "tokens_per_second": 120.0,
            "speedup": 1.8,
            **context_metrics(step, total_steps),
        }
    if stage == "select":
        return {
            "step": total_steps,
            "acceptance_length": acceptance_at(total_steps, total_steps),
            **context_metrics(total_steps, total_steps),
        }
    if stage == "export":
        return {"digest": EXPORT_DIGEST}
    if stage == "quantize":
        return {"digest": QUANTIZE_DIGEST}
    if stage == "sweep":
        return {
            "schedule": [[1, 2, 4], [3, 16, 0]],
            "num_speculative_tokens": 4,
            "best_concurrency": [1, 2, 4, 16],
            "best_k": [4, 4, 0, 0],
            "best_speedup": [1.7, 1.4, 1.0, 1.0],
        }
    return {}
