"""Stuck work reaches status and Events: the planners on pod, Job and Deployment statuses as the
scheduler, the kubelet and the controllers write them (tests/operator/kubelet_statuses.py)."""

from __future__ import annotations

import copy
from datetime import timedelta

from eagle3_operator.reconcile.jobs import lacks_pods
from eagle3_operator.reconcile.serving import ServingObserved, plan_serving
from eagle3_operator.reconcile.stuck import Refusal, pod_problem
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

from tests.operator import fakes
from tests.operator import kubelet_statuses as kubelet
from tests.operator.test_training_unit import Cluster

RUNTIME_IMAGE = "ghcr.io/eagle3-ai/eagle3-runtime:0.1.0"
VLLM_IMAGE = "vllm/vllm-openai-rocm:v0.32.0"
STAMP = kubelet.STAMP


def _warnings(plan) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in plan.events if e.type == "Warning"]


def _template_pod(owner: dict, name: str, status: dict) -> dict:
    """A pod of a Job or Deployment: its template's labels, the given status."""
    labels = dict(owner["spec"]["template"]["metadata"]["labels"])
    if owner["kind"] == "Job":
        labels |= {
            "batch.kubernetes.io/job-name": owner["metadata"]["name"],
            "job-name": owner["metadata"]["name"],
        }
    pod = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "0b6b7c1e-5d1f-4b7e-9a51-3f2d8c6a9e10",
            "labels": labels,
        },
        "spec": copy.deepcopy(owner["spec"]["template"]["spec"]),
    }
    return kubelet.with_status(pod, status)


def _generating(**spec) -> Cluster:
    """A DraftTraining whose generate Job has just been created (its pod is the test's to shape)."""
    cluster = Cluster(fakes.draft_training(**spec))
    cluster.reconcile()
    cluster.reconcile()
    job = cluster.observed.jobs["llama-generate"]
    job["metadata"] |= {"uid": "job-uid-1", "creationTimestamp": STAMP}
    return cluster


def test_an_unschedulable_stage_pod_is_the_stage_reason_with_one_warning():
    cluster = _generating()
    job = cluster.observed.jobs["llama-generate"]
    cluster.observed.pods.append(_template_pod(job, "llama-generate-x7k2p", kubelet.unschedulable()))
    plan = cluster.reconcile()
    generated = fakes.condition(plan.status, "Generated")
    assert (generated["status"], generated["reason"]) == ("False", "Unschedulable")
    assert (
        generated["message"] == f"pod llama-generate-x7k2p cannot be scheduled: {kubelet.SCHEDULER_MESSAGE}"
    )
    assert _warnings(plan) == [("Unschedulable", generated["message"])]
    assert plan.status["phase"] == "Running", "a node may still come: not a failure"
    again = cluster.reconcile()
    assert again.events == [] and again.status == plan.status, "no Event, no write while nothing changes"
    cluster.observed.pods[0]["status"] = {"phase": "Running"}
    recovered = cluster.reconcile()
    assert fakes.condition(recovered.status, "Generated")["reason"] == "Running"


def test_kubelet_waiting_reasons_of_a_stage_pod_become_the_stage_reason():
    statuses = {
        "ErrImagePull": kubelet.err_image_pull("stage", RUNTIME_IMAGE),
        "ImagePullBackOff": kubelet.image_pull_back_off("stage", RUNTIME_IMAGE),
        "CreateContainerConfigError": kubelet.create_container_config_error(
            "stage", RUNTIME_IMAGE, "hf-token"
        ),
    }
    for reason, status in statuses.items():
        cluster = _generating()
        job = cluster.observed.jobs["llama-generate"]
        cluster.observed.pods.append(_template_pod(job, "llama-generate-x7k2p", status))
        plan = cluster.reconcile()
        generated = fakes.condition(plan.status, "Generated")
        waiting = status["containerStatuses"][0]["state"]["waiting"]["message"]
        assert generated["reason"] == reason
        assert generated["message"] == f"pod llama-generate-x7k2p, container stage: {waiting}"
        assert _warnings(plan) == [(reason, generated["message"])]
    assert (
        'Back-off pulling image "ghcr.io/eagle3-ai/eagle3-runtime:0.1.0": ErrImagePull: rpc error'
        in (statuses["ImagePullBackOff"]["containerStatuses"][0]["state"]["waiting"]["message"])
    )


def test_a_crash_looping_target_is_the_target_reason_with_its_exit_code_and_log_tail():
    cluster = Cluster(fakes.draft_training())
    plan = cluster.reconcile()
    target = next(o for o in plan.sync if o["kind"] == "Deployment")
    cluster.observed.deployments["llama-target"] = fakes.ready_deployment(target, ready=0)
    pod = _template_pod(target, "llama-target-6d4f9c7b8-x2x9q", {})
    log_tail = "INFO loading model\nRuntimeError: No HIP GPUs are available\n"
    pod["status"] = kubelet.crash_loop_back_off(pod, "vllm", VLLM_IMAGE, log_tail)
    cluster.observed.pods.append(pod)
    plan = cluster.reconcile()
    ready = fakes.condition(plan.status, "TargetReady")
    assert (ready["status"], ready["reason"]) == ("False", "CrashLoopBackOff")
    assert ready["message"].startswith(
        "pod llama-target-6d4f9c7b8-x2x9q, container vllm: back-off 1m20s restarting failed container=vllm "
        "pod=llama-target-6d4f9c7b8-x2x9q_ml(0b6b7c1e-5d1f-4b7e-9a51-3f2d8c6a9e10); last exit code 1 (Error)"
    )
    assert ready["message"].endswith("RuntimeError: No HIP GPUs are available")
    assert ("CrashLoopBackOff", ready["message"]) in _warnings(plan)
    assert fakes.condition(plan.status, "Generated")["reason"] == "WaitingForTarget"


def test_target_deployment_replica_failure_and_progress_deadline():
    cluster = Cluster(fakes.draft_training())
    plan = cluster.reconcile()
    target = fakes.ready_deployment(next(o for o in plan.sync if o["kind"] == "Deployment"), ready=0)
    forbidden = (
        'pods "llama-target-6d4f9c7b8-" is forbidden: exceeded quota: gpus, requested: requests.amd.com/gpu=1, '
        "used: requests.amd.com/gpu=8, limited: requests.amd.com/gpu=8"
    )
    target["status"]["conditions"] = [
        {
            "type": "Available",
            "status": "False",
            "reason": "MinimumReplicasUnavailable",
            "message": "Deployment does not have minimum availability.",
        },
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": forbidden},
        {
            "type": "Progressing",
            "status": "True",
            "reason": "ReplicaSetUpdated",
            "message": 'ReplicaSet "llama-target-6d4f9c7b8" is progressing.',
        },
    ]
    cluster.observed.deployments["llama-target"] = target
    ready = fakes.condition(plan_training(cluster.body, cluster.observed).status, "TargetReady")
    assert (ready["reason"], ready["message"]) == ("FailedCreate", f"Deployment llama-target: {forbidden}")
    target["status"]["conditions"][1:] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "llama-target-6d4f9c7b8" has timed out progressing.',
        },
    ]
    ready = fakes.condition(plan_training(cluster.body, cluster.observed).status, "TargetReady")
    assert ready["reason"] == "ProgressDeadlineExceeded"
    assert (
        ready["message"]
        == 'Deployment llama-target: ReplicaSet "llama-target-6d4f9c7b8" has timed out progressing.'
    )
    assert target["spec"]["progressDeadlineSeconds"] >= 1800, "longer than the startup probe's 30 minutes"


def test_a_job_that_cannot_create_pods_shows_the_job_controllers_failed_create():
    cluster = _generating(runtime={"serviceAccountName": "eagle3-runtime"})
    cluster.observed.now = fakes.NOW + timedelta(seconds=2)
    young = cluster.reconcile()
    assert young.requeue_after == 5.0, "a Job without pods is looked at again"
    assert cluster.observed.jobs_lacking_pods() == [], "its Events are read only after a grace period"
    cluster.observed.now = fakes.NOW + timedelta(seconds=10)
    assert [j["metadata"]["name"] for j in cluster.observed.jobs_lacking_pods()] == ["llama-generate"]
    message = (
        'Error creating: pods "llama-generate-" is forbidden: error looking up service account '
        'ml/eagle3-runtime: serviceaccount "eagle3-runtime" not found'
    )
    cluster.observed.job_events = [
        {
            "reason": "FailedCreate",
            "type": "Warning",
            "message": message,
            "lastTimestamp": STAMP,
            "involvedObject": {"kind": "Job", "name": "llama-generate", "uid": "job-uid-1"},
        },
        {
            "reason": "FailedCreate",
            "type": "Warning",
            "message": "another Job's",
            "lastTimestamp": STAMP,
            "involvedObject": {"kind": "Job", "name": "other", "uid": "job-uid-2"},
        },
    ]
    plan = cluster.reconcile()
    generated = fakes.condition(plan.status, "Generated")
    assert generated["reason"] == "FailedCreate"
    assert generated["message"] == (
        'Job llama-generate cannot create its pods: pods "llama-generate-" is forbidden: error looking up '
        'service account ml/eagle3-runtime: serviceaccount "eagle3-runtime" not found'
    )
    assert _warnings(plan) == [("FailedCreate", generated["message"])]
    assert plan.requeue_after is None, "known now: the pod's creation will trigger the next reconcile"


def test_lacks_pods_only_for_active_unsuspended_jobs_without_live_pods():
    job = {"metadata": {"name": "j"}, "spec": {}, "status": {}}
    assert lacks_pods(job, [])
    assert not lacks_pods(job, [{"metadata": {"name": "p"}, "status": {"phase": "Pending"}}])
    assert lacks_pods(job, [{"metadata": {"name": "p"}, "status": {"phase": "Failed"}}]), "between retries"
    assert not lacks_pods({**job, "spec": {"suspend": True}}, []), "Kueue has not admitted it"
    done = {**job, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert not lacks_pods(done, [])


def test_pod_problem_ignores_starting_gated_and_finished_pods():
    creating = kubelet._waiting("stage", RUNTIME_IMAGE, "ContainerCreating", "")
    gated = {
        "phase": "Pending",
        "conditions": [
            kubelet._condition(
                "PodScheduled",
                "False",
                "SchedulingGated",
                "Scheduling is blocked due to non-empty scheduling gates",
            )
        ],
    }
    # The scheduler's message while the PV controller has not bound the workspace claim yet
    # (seen on the test bed: a Warning on a fresh DraftTraining that went away a second later).
    binding = {
        "phase": "Pending",
        "conditions": [
            kubelet._condition(
                "PodScheduled",
                "False",
                "Unschedulable",
                "0/6 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.",
            )
        ],
    }
    for status in (creating, gated, binding, {"phase": "Succeeded"}):
        assert pod_problem({"metadata": {"name": "p"}, "status": status}) is None


def test_a_refused_child_is_its_condition_reason_and_is_retried():
    cluster = Cluster(fakes.draft_training())
    plan = cluster.reconcile()
    quota = (
        'deployments.apps "llama-target" is forbidden: exceeded quota: no-deployments, requested: '
        "count/deployments.apps=1, used: count/deployments.apps=0, limited: count/deployments.apps=0"
    )
    cluster.observed.refused = [Refusal("Deployment", "llama-target", "target", quota)]
    cluster.observed.deployments.clear()
    plan = cluster.reconcile()
    ready = fakes.condition(plan.status, "TargetReady")
    assert (ready["reason"], ready["message"]) == (
        "ApplyFailed",
        f"the API server refused Deployment llama-target: {quota}",
    )
    assert _warnings(plan) == [("ApplyFailed", ready["message"])]
    assert plan.requeue_after == 30.0
    # The workspace PVC belongs to no stage: its refusal holds up the stage that waits for it.
    cluster.observed.refused = [
        Refusal("PersistentVolumeClaim", "llama-workspace", "workspace", "exceeded quota")
    ]
    plan = cluster.reconcile()
    assert fakes.condition(plan.status, "Generated")["reason"] == "ApplyFailed"
    assert fakes.condition(plan.status, "TargetReady")["reason"] == "Serving"


def test_stage_deadline_is_the_jobs_active_deadline_and_fails_with_what_it_was_stuck_on():
    cluster = _generating(runtime={"stageDeadlineSeconds": 3600})
    job = cluster.observed.jobs["llama-generate"]
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    cluster.observed.pods.append(_template_pod(job, "llama-generate-x7k2p", kubelet.unschedulable()))
    cluster.reconcile()
    cluster.observed.pods.clear()  # the Job controller removes the pods at the deadline
    job["status"] = {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "DeadlineExceeded",
                "message": "Job was active longer than specified deadline",
                "lastTransitionTime": STAMP,
            },
        ]
    }
    plan = cluster.reconcile()
    failed = fakes.condition(plan.status, "Failed")
    assert plan.status["phase"] == "Failed" and failed["reason"] == "DeadlineExceeded"
    assert failed["message"] == (
        "stage generate failed: Job llama-generate was still running after its deadline of 3600 s "
        "(spec.runtime.stageDeadlineSeconds); it was stuck: pod llama-generate-x7k2p cannot be scheduled: "
        + kubelet.SCHEDULER_MESSAGE
    )
    assert (
        "StageFailed",
        f"generate: DeadlineExceeded: {failed['message'].removeprefix('stage generate failed: ')}",
    ) in _warnings(plan)
    no_deadline = plan_training(fakes.draft_training(), TrainingObserved(now=fakes.NOW))
    assert all("activeDeadlineSeconds" not in o["spec"] for o in no_deadline.create if o["kind"] == "Job")


# ---- SpecDecodeDeployment ------------------------------------------------------------------------


def _serving(pod_status: dict | None = None, **spec) -> tuple[dict, ServingObserved, dict]:
    body = fakes.spec_decode(**spec)
    desired = next(
        o for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync if o["kind"] == "Deployment"
    )
    observed = ServingObserved(now=fakes.NOW, deployment=fakes.ready_deployment(desired, ready=0))
    if pod_status is not None:
        observed.pods = [_template_pod(desired, "chat-7d9c5b8f4-abcde", pod_status)]
    return body, observed, desired


def test_serving_pods_that_cannot_start_make_the_reason_of_available_and_progressing():
    body, observed, _ = _serving(kubelet.image_pull_back_off("vllm", VLLM_IMAGE))
    plan = plan_serving(body, observed)
    available, progressing = (
        fakes.condition(plan.status, "Available"),
        fakes.condition(plan.status, "Progressing"),
    )
    waiting = observed.pods[0]["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    problem = f"pod chat-7d9c5b8f4-abcde, container vllm: {waiting}"
    assert (available["status"], available["reason"]) == ("False", "ImagePullBackOff")
    assert available["message"] == f"0/1 vLLM replicas ready: {problem}"
    assert (progressing["status"], progressing["reason"], progressing["message"]) == (
        "True",
        "ImagePullBackOff",
        problem,
    )
    assert _warnings(plan) == [("ImagePullBackOff", problem)], "one Warning for one problem"
    body["status"] = plan.status
    again = plan_serving(body, observed)
    assert again.events == [] and again.status == plan.status


def test_serving_progress_deadline_and_refusals_stop_progressing():
    body, observed, _ = _serving(kubelet.unschedulable())
    observed.deployment["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "chat-7d9c5b8f4" has timed out progressing.',
        },
    ]
    plan = plan_serving(body, observed)
    progressing = fakes.condition(plan.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert fakes.condition(plan.status, "Available")["reason"] == "Unschedulable", "the pod says more"
    assert {r for r, _ in _warnings(plan)} == {"ProgressDeadlineExceeded", "Unschedulable"}

    body, observed, _ = _serving()
    observed.deployment = None
    observed.refused = [Refusal("Deployment", "chat", "server", 'Deployment.apps "chat" is invalid: ...')]
    plan = plan_serving(body, observed)
    progressing = fakes.condition(plan.status, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "ApplyFailed")
    assert progressing["message"].startswith("the API server refused Deployment chat: ")
    assert _warnings(plan) == [("ApplyFailed", progressing["message"])]
    assert plan.requeue_after == 30.0
