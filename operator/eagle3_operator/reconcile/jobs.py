"""Reading Jobs and their pods: outcome, StageResult from the termination message, progress."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from eagle3_operator.reconcile.meta import PROGRESS_ANNOTATION
from eagle3_runtime.layout import StageResult

STAGE_CONTAINER = "stage"


@dataclass
class JobOutcome:
    state: str  # "Running" | "Succeeded" | "Failed"
    result: StageResult | None = None
    reason: str = ""
    message: str = ""
    finished_at: str | None = None


def _job_condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == STAGE_CONTAINER:
            return (status.get("state") or {}).get("terminated")
    return None


def _parse_result(text: str | None) -> StageResult | None:
    if not text:
        return None
    try:
        return StageResult.parse_message(text.strip())
    except (ValidationError, ValueError):
        return None


def _pod_order(pod: dict[str, Any]) -> tuple[str, str]:
    annotations = pod["metadata"].get("annotations") or {}
    index = annotations.get("batch.kubernetes.io/job-completion-index", "")
    return (index.zfill(6), pod["metadata"].get("creationTimestamp", ""))


def job_outcome(job: dict[str, Any], pods: list[dict[str, Any]]) -> JobOutcome:
    """What a stage Job ended with; the StageResult comes from its pods' termination messages."""
    complete = _job_condition(job, "Complete")
    failed = _job_condition(job, "Failed")
    if complete:
        finished = (job.get("status") or {}).get("completionTime") or complete.get("lastTransitionTime")
        for pod in sorted(pods, key=_pod_order):
            if pod.get("status", {}).get("phase") != "Succeeded":
                continue
            result = _parse_result((_terminated(pod) or {}).get("message"))
            if result is not None:
                return JobOutcome("Succeeded", result=result, finished_at=finished)
        return JobOutcome("Succeeded", result=None, finished_at=finished)
    if failed:
        outcome = JobOutcome(
            "Failed",
            reason=failed.get("reason") or "JobFailed",
            message=failed.get("message") or "the stage Job failed",
            finished_at=failed.get("lastTransitionTime"),
        )
        failed_pods = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
        failed_pods.sort(key=lambda p: (_terminated(p) or {}).get("finishedAt") or "")
        if failed_pods:
            last = failed_pods[-1]
            terminated = _terminated(last) or {}
            result = _parse_result(terminated.get("message"))
            outcome.result = result
            outcome.reason = terminated.get("reason") or last["status"].get("reason") or outcome.reason
            raw = terminated.get("message") or last["status"].get("message") or ""
            detail = result.message if result and result.message else raw.strip()[-1000:]
            exit_code = terminated.get("exitCode")
            outcome.message = f"pod {last['metadata']['name']}" + (
                f" exited with code {exit_code}" if exit_code is not None else " failed"
            )
            if detail:
                outcome.message += f": {detail}"
        return outcome
    return JobOutcome("Running")


def latest_progress(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest `eagle3.ai/progress` record among the pods (docs/contracts.md)."""
    best: dict[str, Any] | None = None
    for pod in pods:
        text = (pod["metadata"].get("annotations") or {}).get(PROGRESS_ANNOTATION)
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict) and (
            best is None or str(record.get("updatedAt", "")) > str(best.get("updatedAt", ""))
        ):
            best = record
    return best
