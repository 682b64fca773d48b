"""Pod Security Admission on the test bed: the operator's children in namespaces that enforce the
`baseline` and `restricted` levels, and the API server's verdict on every pod they make.

The children are what the planners build for a streaming DraftTraining that quantizes its draft
(every kind of pod: target and streaming servers, each stage's Jobs) and for a SpecDecodeDeployment,
owned by real objects of those kinds in the namespace. They are created as they are and their pods
are made by the real Job, Deployment and ReplicaSet controllers, so a refusal is the API server's
own: a FailedCreate event of the Job or ReplicaSet. Admission happens when a pod is created, so no
pod needs to be scheduled or run.
"""

from __future__ import annotations

import copy
from typing import Any

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes
from tests.operator.harness import draft_training_path, spec_decode_path
from tests.operator.test_training_unit import Cluster
from tests.support.cluster import LocalCluster, wait_until

# Multi-GPU servers and trainers: where RCCL might want the Unconfined seccomp profile.
MULTI_GPU = {
    "target": {"model": "org/m", "gpus": 2, "tensorParallelSize": 2},
    "training": {"steps": 100, "checkpointEvery": 50, "gpusPerNode": 2},
}
VLLM_IMAGE_PODS = {"llama-target", "chat"}  # the vLLM image runs as root
RUNTIME_CPU_PODS = {"llama-generate", "llama-select", "llama-export", "llama-quantize"}
RUNTIME_GPU_PODS = {"llama-stream", "llama-train", "llama-eval-50", "llama-eval-100"}


def _children(cluster: LocalCluster, namespace: str, **spec: Any) -> list[dict[str, Any]]:
    """Create a DraftTraining and a SpecDecodeDeployment (no operator runs here) and return the Jobs
    and Deployments the planners make for them, owned by them."""
    training = fakes.draft_training(
        hiddenStates={"mode": "streaming", "layerIds": [2, 8, 13]}, export={"quantize": "fp8"}, **spec
    )
    serving = fakes.spec_decode(
        target=spec["target"], **{k: v for k, v in spec.items() if k == "podSecurity"}
    )
    owners = []
    for body, path in ((training, draft_training_path(namespace)), (serving, spec_decode_path(namespace))):
        sent = copy.deepcopy(body)
        sent["metadata"] = {"name": body["metadata"]["name"]}
        created = cluster.request("POST", path, sent)
        body["metadata"] |= {"namespace": namespace, "uid": created["metadata"]["uid"]}
        owners.append(body)
    run = Cluster(owners[0])
    assert run.run_to_end().status["phase"] == "Succeeded"
    objects = list(run.observed.jobs.values()) + list(run.observed.deployments.values())
    objects += [
        o for o in plan_serving(owners[1], ServingObserved(now=fakes.NOW)).sync if o["kind"] == "Deployment"
    ]
    children = []
    for obj in objects:
        child = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
        child["metadata"].pop("generation", None)
        child["spec"].pop("replicas", None)  # 1: a scaled-down server would make no pod to judge
        children.append(child)
    return children


def _verdicts(cluster: LocalCluster, namespace: str, children: list[dict[str, Any]]) -> dict[str, str]:
    """Create the children; per child, "admitted" once it has a pod, else its FailedCreate message."""
    for child in children:
        plural = {"Job": "jobs", "Deployment": "deployments"}[child["kind"]]
        cluster.request("POST", f"/apis/{child['apiVersion']}/namespaces/{namespace}/{plural}", child)
    names = {c["metadata"]["name"] for c in children}

    def judged() -> dict[str, str] | None:
        replica_sets = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]
        # A pod's or event's object -> the child it belongs to (ReplicaSet -> its Deployment).
        child_of = {n: n for n in names} | {
            rs["metadata"]["name"]: rs["metadata"]["ownerReferences"][0]["name"] for rs in replica_sets
        }
        verdicts: dict[str, str] = {}
        for event in cluster.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]:
            if event["reason"] == "FailedCreate" and event["involvedObject"]["name"] in child_of:
                verdicts[child_of[event["involvedObject"]["name"]]] = event["message"]
        for pod in cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]:
            owner = pod["metadata"]["ownerReferences"][0]["name"]
            if owner in child_of:
                verdicts[child_of[owner]] = "admitted"
        return verdicts if set(verdicts) == names else None

    return wait_until(
        judged, timeout=90, interval=1, what=f"a pod or FailedCreate event of each of {sorted(names)}"
    )


def _enforcing(cluster: LocalCluster, level: str) -> str:
    namespace = cluster.create_namespace()
    cluster.kubectl("label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}")
    return namespace


def _refused(verdicts: dict[str, str]) -> dict[str, str]:
    return {name: message for name, message in verdicts.items() if message != "admitted"}


def test_every_pod_passes_baseline_and_runtime_pods_pass_restricted(crds):
    cluster = crds
    baseline, restricted = _enforcing(cluster, "baseline"), _enforcing(cluster, "restricted")
    try:
        verdicts = _verdicts(cluster, baseline, _children(cluster, baseline, **MULTI_GPU))
        assert set(verdicts) == VLLM_IMAGE_PODS | RUNTIME_CPU_PODS | RUNTIME_GPU_PODS
        assert _refused(verdicts) == {}

        # restricted: every pod of the runtime image (CPU-side stages, and GPU ones too) is admitted;
        # the vLLM image runs as root, so its server pods are refused for that alone.
        refused = _refused(_verdicts(cluster, restricted, _children(cluster, restricted, **MULTI_GPU)))
        assert set(refused) == VLLM_IMAGE_PODS, refused
        for name, message in refused.items():
            assert 'violates PodSecurity "restricted:latest": runAsNonRoot != true' in message, (
                name,
                message,
            )
    finally:
        cluster.delete_namespace(baseline)
        cluster.delete_namespace(restricted)


def test_unconfined_seccomp_for_multi_gpu_pods_leaves_baseline(crds):
    cluster = crds
    baseline = _enforcing(cluster, "baseline")
    try:
        spec = MULTI_GPU | {"podSecurity": {"multiGpuSeccompProfile": "Unconfined"}}
        refused = _refused(_verdicts(cluster, baseline, _children(cluster, baseline, **spec)))
        # Every GPU pod has 2 GPUs here; the CPU-side stages keep RuntimeDefault and pass.
        assert set(refused) == VLLM_IMAGE_PODS | RUNTIME_GPU_PODS, refused
        for name, message in refused.items():
            assert 'violates PodSecurity "baseline:latest": seccompProfile' in message, (name, message)
    finally:
        cluster.delete_namespace(baseline)
