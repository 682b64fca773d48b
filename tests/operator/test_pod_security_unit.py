"""Security of every pod the planners build: Pod Security settings, ServiceAccount tokens, pull secrets."""

from __future__ import annotations

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes
from tests.operator.test_training_unit import Cluster

PULL = [{"name": "registry-a"}, {"name": "registry-b"}]
VLLM_PODS = {"llama-target", "chat"}


def _pod_specs(training_spec: dict, serving_spec: dict) -> dict[str, dict]:
    """Pod spec of every Job and Deployment of a streaming, quantizing training and of a serving."""
    cluster = Cluster(
        fakes.draft_training(
            hiddenStates={"mode": "streaming", "layerIds": [2, 8, 13]},
            export={"quantize": "fp8"},
            **training_spec,
        )
    )
    assert cluster.run_to_end().status["phase"] == "Succeeded"
    objects = {**cluster.observed.jobs, **cluster.observed.deployments}
    serving = plan_serving(fakes.spec_decode(**serving_spec), ServingObserved(now=fakes.NOW)).sync
    objects |= {o["metadata"]["name"]: o for o in serving if o["kind"] == "Deployment"}
    return {name: obj["spec"]["template"]["spec"] for name, obj in objects.items()}


def test_every_container_drops_capabilities_and_privilege_escalation_and_gets_pull_secrets():
    specs = _pod_specs({"imagePullSecrets": PULL}, {"imagePullSecrets": PULL})
    assert len(specs) == 10
    for name, pod in specs.items():
        for container in pod["containers"]:
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }, name
        assert pod["imagePullSecrets"] == PULL, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert "hostIPC" not in pod and "hostNetwork" not in pod, name
        assert pod["enableServiceLinks"] is False, name  # VLLM_PORT=tcp://... from a Service `vllm`
        # vLLM servers need no Kubernetes API; stage pods post progress with their token.
        assert pod.get("automountServiceAccountToken", True) is (name not in VLLM_PODS), name
    assert "imagePullSecrets" not in _pod_specs({}, {})["llama-select"]


def test_unconfined_seccomp_only_for_multi_gpu_pods_when_asked():
    unconfined = {"podSecurity": {"multiGpuSeccompProfile": "Unconfined"}}
    training = {
        "target": {"model": "org/m", "gpus": 1},
        "training": {"steps": 100, "checkpointEvery": 50, "gpusPerNode": 4},
    } | unconfined
    serving = {"target": {"model": "org/m", "gpus": 2, "tensorParallelSize": 2}} | unconfined
    profiles = {
        name: pod["securityContext"]["seccompProfile"]["type"]
        for name, pod in _pod_specs(training, serving).items()
    }
    multi_gpu = {"llama-train", "chat"}
    assert {name for name, profile in profiles.items() if profile == "Unconfined"} == multi_gpu, profiles
    assert set(profiles.values()) == {"Unconfined", "RuntimeDefault"}
