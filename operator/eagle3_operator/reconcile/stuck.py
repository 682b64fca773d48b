"""Why a child makes no progress, in the words of whoever knows: the scheduler, the kubelet, the Job
and Deployment controllers, or the API server that refused the operator's own write.

None of these ends the work by itself (a node may be added, an image pushed, a Secret created), so
they become condition reasons and Warning Events while the object keeps its phase. Only a stage
deadline (spec.runtime.stageDeadlineSeconds) turns waiting into a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Waiting reasons of a container that is on its way; every other one is a problem the kubelet
# reports (ImagePullBackOff, ErrImagePull, CrashLoopBackOff, CreateContainerConfigError, ...).
STARTING_REASONS = {"ContainerCreating", "PodInitializing"}
# The scheduler's word for a pod whose claim the PV controller has not bound yet: it retries once the
# claim binds (seconds, on a cluster whose provisioner binds immediately), so this is a wait, not a
# problem worth a Warning on every new object.
UNBOUND_CLAIMS = "unbound immediate PersistentVolumeClaims"
FAILED_CREATE = "FailedCreate"  # the Job/ReplicaSet controllers' Event and condition reason
APPLY_FAILED = "ApplyFailed"  # the API server refused a child the operator wrote
MAX_MESSAGE = 1000
# A refused write (quota, admission) is tried again after this long even without a watch event.
REFUSAL_RETRY_S = 30.0


@dataclass(frozen=True)
class Problem:
    reason: str  # CamelCase, as its source reports it
    message: str


@dataclass(frozen=True)
class Refusal:
    """A child write the API server refused (admission, quota, validation, ...)."""

    kind: str
    name: str
    component: str  # the child's app.kubernetes.io/component label
    message: str

    def problem(self) -> Problem:
        return Problem(APPLY_FAILED, _clip(f"the API server refused {self.kind} {self.name}: {self.message}"))


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _last_exit(status: dict[str, Any]) -> str:
    """`; last exit code 1 (Error): <termination message tail>` of a restarting container."""
    terminated = (status.get("lastState") or {}).get("terminated")
    if not terminated:
        return ""
    text = f"; last exit code {terminated.get('exitCode')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    tail = (terminated.get("message") or "").strip()
    return text + (f": {tail[-300:]}" if tail else "")


def pod_problem(pod: dict[str, Any]) -> Problem | None:
    """What keeps a live pod from running: the scheduler's verdict or a container's waiting reason."""
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    name = meta["name"]
    for condition in status.get("conditions") or []:
        # SchedulingGated (e.g. Kueue) is a deliberate wait, not a problem.
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
            and UNBOUND_CLAIMS not in (condition.get("message") or "")
        ):
            return Problem(
                "Unschedulable", _clip(f"pod {name} cannot be scheduled: {condition.get('message')}")
            )
    containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason not in STARTING_REASONS:
            detail = waiting.get("message") or reason
            message = f"pod {name}, container {container.get('name')}: {detail}{_last_exit(container)}"
            return Problem(reason, _clip(message))
    return None


def first_pod_problem(pods: list[dict[str, Any]]) -> Problem | None:
    """The problem of the first stuck pod (by name, so that repeated reconciles agree)."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if problem := pod_problem(pod):
            return problem
    return None


def deployment_problem(deployment: dict[str, Any] | None) -> Problem | None:
    """ReplicaFailure (pods cannot be created) or ProgressDeadlineExceeded, from a current status."""
    if not deployment:
        return None
    status = deployment.get("status") or {}
    if (status.get("observedGeneration") or 0) < (deployment["metadata"].get("generation") or 0):
        return None  # the conditions describe an older spec
    name = deployment["metadata"]["name"]
    for condition in status.get("conditions") or []:
        kind, state, reason = condition.get("type"), condition.get("status"), condition.get("reason")
        if kind == "ReplicaFailure" and state == "True":
            return Problem(reason or FAILED_CREATE, _clip(f"Deployment {name}: {condition.get('message')}"))
        if kind == "Progressing" and state == "False" and reason == "ProgressDeadlineExceeded":
            return Problem(reason, _clip(f"Deployment {name}: {condition.get('message')}"))
    return None


def job_creation_problem(job: dict[str, Any], events: list[dict[str, Any]]) -> Problem | None:
    """The newest FailedCreate Event of this Job: the Job controller could not create its pods."""
    uid = job["metadata"].get("uid")
    mine = [
        e
        for e in events
        if e.get("reason") == FAILED_CREATE and (e.get("involvedObject") or {}).get("uid") == uid
    ]
    if not mine:
        return None
    newest = max(mine, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    message = (newest.get("message") or "").removeprefix("Error creating: ")
    return Problem(FAILED_CREATE, _clip(f"Job {job['metadata']['name']} cannot create its pods: {message}"))
