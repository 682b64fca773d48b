"""Disrupted trainer pods: the Job podFailurePolicy that keeps an eviction or a preemption apart from
a crash, and how a failed trainer Job shows that one of its ranks was disrupted.

The API server's Eviction subresource (a node drain), the scheduler's preemption and taint eviction
give the pod the DisruptionTarget condition before they delete it."""

from __future__ import annotations

from typing import Any

DISRUPTION_TARGET = "DisruptionTarget"
# The Job controller's reason when a podFailurePolicy rule with action FailJob matched.
POD_FAILURE_POLICY = "PodFailurePolicy"


def trainer_pod_failure_policy(nodes: int) -> dict[str, Any]:
    """One pod: a disrupted pod is recreated without spending backoffLimit (`Ignore`). Several ranks:
    a recreated rank cannot rejoin the static torchrun group, whose other ranks would wait for it until
    the collective timeout, so a disrupted rank fails the Job at once (`FailJob`), and the Job's Failed
    condition says it was a disruption (the operator restarts the group without spending
    training.groupRestarts)."""
    action = "FailJob" if nodes > 1 else "Ignore"
    return {"rules": [{"action": action, "onPodConditions": [{"type": DISRUPTION_TARGET, "status": "True"}]}]}


def _disruption_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
            return cond
    return None


def disrupted_rank(job: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
    """What disrupted a rank of this failed Job, or None when no rank was disrupted (a crash): the
    Job's Failed condition from the FailJob rule, else a pod that still carries DisruptionTarget
    (when another rank failed first, before the disrupted pod ended)."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") == "Failed"
            and cond.get("status") == "True"
            and cond.get("reason") == POD_FAILURE_POLICY
            and f"condition {DISRUPTION_TARGET}" in (cond.get("message") or "")
        ):
            return cond["message"]
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if cond := _disruption_condition(pod):
            detail = ": ".join(part for part in (cond.get("reason"), cond.get("message")) if part)
            return f"pod {pod['metadata']['name']} was disrupted" + (f" ({detail})" if detail else "")
    return None
