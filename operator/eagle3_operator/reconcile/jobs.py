"""Reading Jobs and their pods: outcome, StageResult from the termination message, progress."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from eagle3_api.progress import PROGRESS_ANNOTATION, Progress
from eagle3_api.stage_result import StageResult
from eagle3_operator.reconcile.plan import parse_iso

STAGE_CONTAINER = "stage"
DEADLINE_EXCEEDED = "DeadlineExceeded"  # the Job controller's reason for activeDeadlineSeconds
# A Job gets its first pod within moments; one without any after this long may fail to create them.
POD_CREATION_GRACE_S = 5.0


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
    if failed and failed.get("reason") == DEADLINE_EXCEEDED:
        # Its pods were stopped (or never started): the deadline, not their exit, is the cause.
        deadline = job["spec"].get("activeDeadlineSeconds")
        return JobOutcome(
            "Failed",
            reason=DEADLINE_EXCEEDED,
            message=f"Job {job['metadata']['name']} was still running after its deadline of {deadline} s "
            "(spec.runtime.stageDeadlineSeconds)",
            finished_at=failed.get("lastTransitionTime"),
        )
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


def job_age_s(job: dict[str, Any], now: datetime) -> float:
    created = job["metadata"].get("creationTimestamp")
    return (now - parse_iso(created)).total_seconds() if created else 0.0


def lacks_pods(job: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """An active, unsuspended Job without a live pod: the Job controller may be failing to create
    them (its FailedCreate Events say why), or waiting out the back-off after a failed pod."""
    if _job_condition(job, "Complete") or _job_condition(job, "Failed") or job["spec"].get("suspend"):
        return False
    return not any(
        p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
        for p in pods
    )


def latest_progress(pods: list[dict[str, Any]]) -> Progress | None:
    """The newest `eagle3.ai/progress` record among the pods (docs/contracts.md). A record the
    Progress model refuses (not JSON, a wrong type) is left out: progress is informational only."""
    best: Progress | None = None
    for pod in pods:
        text = (pod["metadata"].get("annotations") or {}).get(PROGRESS_ANNOTATION)
        if not text:
            continue
        try:
            record = Progress.model_validate_json(text)
        except ValidationError:
            continue
        if best is None or (record.updated_at or "") > (best.updated_at or ""):
            best = record
    return best
