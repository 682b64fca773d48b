"""The watch cache keeps of Pods and Jobs only what the planners read: every plan made from the
projected objects equals the plan made from the objects as the API server returns them."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from typing import Any

import pytest
from eagle3_operator.apply import contains
from eagle3_operator.cache import Store
from eagle3_operator.reconcile.stuck import first_pod_problem
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

from tests.operator import fakes
from tests.operator import kubelet_statuses as kubelet

STAMP = fakes.NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
IMAGE = "ghcr.io/eagle3/runtime:dev"
MANAGED_FIELDS = [
    {"manager": "kube-controller-manager", "operation": "Update", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:status": {"f:conditions": {}, "f:active": {}}}, "time": STAMP},
]  # fmt: skip


def _served(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    """`obj` with the metadata the API server adds."""
    out = copy.deepcopy(obj)
    out["metadata"] |= {"uid": uid, "resourceVersion": "17", "generation": 1, "creationTimestamp": STAMP,
                        "managedFields": MANAGED_FIELDS}  # fmt: skip
    return out


def _job(desired: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """A Job as the API server and the Job controller return it: defaulted template, selector, counts."""
    job = _served(desired, "job-uid")
    job["spec"] |= {"completions": 1, "parallelism": 1, "backoffLimit": 0, "completionMode": "NonIndexed",
                    "activeDeadlineSeconds": 3600, "suspend": False, "podReplacementPolicy": "TerminatingOrFailed",
                    "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}}}  # fmt: skip
    job["spec"]["template"]["spec"] |= {"dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"}
    job["metadata"]["creationTimestamp"] = (fakes.NOW - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job["status"] = {"startTime": STAMP, "active": 1, "ready": 0, "uncountedTerminatedPods": {}} | status
    return job


def _pod(
    job: dict[str, Any], status: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A stage pod as the API server returns it: the Job's template, scheduled, with the kubelet's status."""
    name = job["metadata"]["name"]
    template = job["spec"]["template"]
    labels = template["metadata"].get("labels", {}) | {"batch.kubernetes.io/job-name": name, "job-name": name}
    created = (fakes.NOW - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    metadata = {
        "name": f"{name}-x7k2p", "namespace": job["metadata"]["namespace"], "labels": labels,
        "annotations": (template["metadata"].get("annotations") or {}) | (annotations or {}),
        "creationTimestamp": created,
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "job-uid",
                             "controller": True, "blockOwnerDeletion": True}],
    }  # fmt: skip
    spec = copy.deepcopy(template["spec"]) | {"nodeName": "gpu-node-1", "priority": 0}
    return _served({"metadata": metadata, "spec": spec, "status": status}, "pod-uid")


def _finished(container: str, *, exit_code: int, reason: str, message: str) -> dict[str, Any]:
    """The kubelet's status of a pod whose only container ended."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    terminated = {"exitCode": exit_code, "reason": reason, "message": message, "startedAt": STAMP,
                  "finishedAt": STAMP, "containerID": "containerd://4f1c2b9e0d7a"}  # fmt: skip
    status = kubelet.err_image_pull(container, IMAGE)  # the fields a started pod has, then ended
    (container_status,) = status["containerStatuses"]
    container_status |= {"state": {"terminated": terminated}, "imageID": f"{IMAGE}@sha256:{'ab' * 32}"}
    return status | {"phase": phase}


def _through_store(kind: str, api_version: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    store = Store()
    for obj in objects:
        store.upsert(kind, api_version, obj)
    kept = [store.get(kind, o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects]
    assert all(k is not None and "managedFields" not in k["metadata"] for k in kept)
    return kept


def _generate_job() -> tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]:
    """A DraftTraining, its desired generate Job and its target Deployment, up."""
    body = fakes.draft_training()
    observed = TrainingObserved(now=fakes.NOW)
    plan = plan_training(copy.deepcopy(body), observed)
    body["status"] = plan.status
    for obj in plan.sync:
        if obj["kind"] == "Deployment":
            observed.deployments[obj["metadata"]["name"]] = fakes.ready_deployment(obj)
    plan = plan_training(copy.deepcopy(body), observed)
    body["status"] = plan.status
    (job,) = [o for o in plan.create if o["kind"] == "Job"]
    return body, job, observed.deployments


RESULT = fakes.stage_report("generate", "llama-generate")
PROGRESS = {"stage": "generate", "samples": 40, "etaSeconds": 12, "updatedAt": "2026-11-29T09:00:10Z"}
FAILED = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                          "message": "Job has reached the specified backoff limit", "lastTransitionTime": STAMP}],
          "failed": 1, "active": 0}  # fmt: skip
SCENARIOS: dict[str, tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, str] | None]]]] = {
    # (Job status, [(pod status, pod annotations)])
    "stage result": (
        {
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": STAMP}],
            "completionTime": STAMP,
            "succeeded": 1,
            "active": 0,
        },
        [(_finished("stage", exit_code=0, reason="Completed", message=RESULT), None)],
    ),  # fmt: skip
    "failed pod": (
        FAILED,
        [
            (
                _finished(
                    "stage", exit_code=2, reason="Error", message="OSError: /sources/prompts: no such file"
                ),
                None,
            )
        ],
    ),
    "deadline": (
        {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                    "lastTransitionTime": STAMP,
                }
            ],
            "failed": 1,
            "active": 0,
        },
        [],
    ),  # fmt: skip
    "progress": (
        {},
        [({"phase": "Running", "podIP": "10.244.1.7"}, {"eagle3.ai/progress": json.dumps(PROGRESS)})],
    ),
    "unschedulable": ({}, [(kubelet.unschedulable(), None)]),
    "image pull": ({}, [(kubelet.image_pull_back_off("stage", IMAGE), None)]),
    "missing secret": ({}, [(kubelet.create_container_config_error("stage", IMAGE, "hf-token"), None)]),
    "no pods": ({"active": 0}, []),
    "suspended": ({"active": 0}, []),  # lacks pods on purpose
}


# What each scenario's Generated condition says: proof that the planner read the kept fields.
GENERATED_REASON = {
    "stage result": "Completed", "failed pod": "Failed", "deadline": "Failed", "progress": "Running",
    "unschedulable": "Unschedulable", "image pull": "CrashLoopBackOff",
    "missing secret": "CreateContainerConfigError", "no pods": "Running", "suspended": "Running",
}  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_plans_from_projected_children_equal_plans_from_whole_children(scenario):
    body, desired, deployments = _generate_job()
    job_status, pod_states = SCENARIOS[scenario]
    job = _job(desired, job_status)
    job["spec"]["suspend"] = scenario == "suspended"
    pods = [_pod(job, status, annotations) for status, annotations in pod_states]
    if (
        scenario == "image pull"
    ):  # and a crash-looping sibling, first by name: its last exit is in the message
        crash = _pod(job, {}, None)
        crash["metadata"]["name"] = "llama-generate-a1b2c"
        pods.append(
            kubelet.with_status(crash, kubelet.crash_loop_back_off(crash, "stage", IMAGE, "OOM at step 3"))
        )
    name = job["metadata"]["name"]

    def plan(jobs: list[dict[str, Any]], stage_pods: list[dict[str, Any]]):
        observed = TrainingObserved(
            now=fakes.NOW, jobs={name: jobs[0]}, pods=stage_pods, deployments=deployments
        )
        # What the reconciler reads before planning: Jobs lacking pods (then their FailedCreate Events).
        lacking = [j["metadata"]["name"] for j in observed.jobs_lacking_pods()]
        return lacking, first_pod_problem(stage_pods), plan_training(copy.deepcopy(body), observed)

    kept_jobs = _through_store("Job", "batch/v1", [job])
    kept_pods = _through_store("Pod", "v1", pods)
    assert all("spec" not in p for p in kept_pods), "pod specs are never read"
    assert "template" not in kept_jobs[0]["spec"], "Job templates are never read"
    whole, projected = plan([job], pods), plan(kept_jobs, kept_pods)
    assert projected == whole
    lacking, problem, planned = whole
    if scenario == "image pull":
        assert "last exit code" in problem.message and "OOM at step 3" in problem.message
    assert fakes.condition(planned.status, "Generated")["reason"] == GENERATED_REASON[scenario]
    assert lacking == (["llama-generate"] if scenario == "no pods" else [])
    assert ("progress" in planned.status) == (scenario == "progress")


def test_apply_and_live_acceptance_read_the_same_from_projected_children():
    """Deployments stay whole (apply compares the desired spec with them); a vLLM pod keeps what
    the live-acceptance reads select on: its IP, Ready condition and revision annotation."""
    body, _, deployments = _generate_job()
    plan = plan_training(copy.deepcopy(body), TrainingObserved(now=fakes.NOW, deployments=deployments))
    (desired,) = [o for o in plan.sync if o["kind"] == "Deployment"]
    live = _served(fakes.ready_deployment(desired), "deploy-uid")
    (kept,) = _through_store("Deployment", "apps/v1", [live])
    wanted = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    assert contains(kept, wanted) and kept["spec"] == live["spec"] and kept["status"] == live["status"]

    ready = {"phase": "Running", "podIP": "10.244.1.9", "conditions": [{"type": "Ready", "status": "True"}]}
    pod = _served({"metadata": {"name": "llama-target-0", "namespace": "ml",
                                "annotations": {"eagle3.ai/revision": "r1"}},
                   "spec": {"containers": [{"name": "vllm", "image": IMAGE}]}, "status": ready}, "vllm-uid")  # fmt: skip
    (kept_pod,) = _through_store("Pod", "v1", [pod])
    assert (
        kept_pod["status"] == ready and kept_pod["metadata"]["annotations"] == pod["metadata"]["annotations"]
    )
