"""What every container and pod the operator builds gets: the user's env merged by name, the runtime
image's non-root user with writable volumes, and the GPU device groups."""

from __future__ import annotations

from collections import Counter

from eagle3_operator.reconcile.pods import merge_env
from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes
from tests.operator.harness import WRITE_PROBE, workspace_write_pod
from tests.operator.test_training_unit import Cluster

AITER_OFF = {"name": "VLLM_ROCM_USE_AITER", "value": "0"}
EXTRA = {"name": "NCCL_DEBUG", "value": "INFO"}
TOKEN_FROM_CONFIG = {"name": "HF_TOKEN", "valueFrom": {"configMapKeyRef": {"name": "tokens", "key": "hf"}}}


def _pod_specs(cluster: Cluster) -> dict[str, dict]:
    """Pod spec of every Job and Deployment the planner made, by name."""
    objects = {**cluster.observed.jobs, **cluster.observed.deployments}
    return {name: obj["spec"]["template"]["spec"] for name, obj in objects.items()}


def _streaming_run(**spec) -> Cluster:
    """Every child of a streaming-mode training that exports a quantized draft (all pod kinds)."""
    cluster = Cluster(
        fakes.draft_training(
            hiddenStates={"mode": "streaming", "layerIds": [2, 8, 13]}, export={"quantize": "fp8"}, **spec
        )
    )
    assert cluster.run_to_end().status["phase"] == "Succeeded"
    return cluster


def test_merge_env_keeps_one_entry_per_name_and_the_users_wins_in_place():
    ours = [
        {"name": "A", "value": "1"},
        {"name": "VLLM_ROCM_USE_AITER", "value": "1"},
        {"name": "B", "value": "2"},
    ]
    merged = merge_env(ours, [AITER_OFF, EXTRA])
    assert merged == [{"name": "A", "value": "1"}, AITER_OFF, {"name": "B", "value": "2"}, EXTRA]


def test_users_env_reaches_every_container_of_a_training_once_per_name():
    env = [AITER_OFF, EXTRA, TOKEN_FROM_CONFIG]
    cluster = _streaming_run(target={"model": "org/m", "env": env, "hfTokenSecret": {"name": "hf"}})
    specs = _pod_specs(cluster)
    assert set(specs) == {
        "llama-target",
        "llama-stream",
        "llama-generate",
        "llama-train",
        "llama-eval-50",
        "llama-eval-100",
        "llama-select",
        "llama-export",
        "llama-quantize",
    }
    for name, pod in specs.items():
        (container,) = pod["containers"]
        names = Counter(e["name"] for e in container["env"])
        assert max(names.values()) == 1, f"{name}: duplicate env names {names}"
        by_name = {e["name"]: e for e in container["env"]}
        assert by_name["VLLM_ROCM_USE_AITER"] == AITER_OFF and by_name["NCCL_DEBUG"] == EXTRA, name
        assert by_name["HF_TOKEN"] == TOKEN_FROM_CONFIG, f"{name}: the user's HF_TOKEN replaces the Secret's"


def test_users_env_replaces_the_operators_in_the_serving_deployment():
    body = fakes.spec_decode(target={"model": "org/m", "env": [AITER_OFF, EXTRA]})
    deployment = next(
        o for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync if o["kind"] == "Deployment"
    )
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["VLLM_ROCM_USE_AITER", "HF_HOME", "NCCL_DEBUG"]
    assert env[0] == AITER_OFF


def test_runtime_pods_run_as_the_images_user_with_writable_volumes_and_gpu_groups():
    cluster = _streaming_run(scheduling={"supplementalGroups": [109]})
    specs = _pod_specs(cluster)
    runtime_user = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 0,
        "fsGroup": 0,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    seccomp = {"seccompProfile": {"type": "RuntimeDefault"}}
    gpu = {"supplementalGroups": [44, 109]} | seccomp
    cpu = {"supplementalGroups": [109]} | seccomp
    expected = {
        # the vLLM image runs as its own (root) user; it only reads models
        "llama-target": gpu,
        "llama-stream": runtime_user | gpu,
        "llama-train": runtime_user | gpu,
        "llama-eval-50": runtime_user | gpu,
        "llama-eval-100": runtime_user | gpu,
        "llama-generate": runtime_user | cpu,
        "llama-select": runtime_user | cpu,
        "llama-export": runtime_user | cpu,
        "llama-quantize": runtime_user | cpu,
    }
    assert {name: pod["securityContext"] for name, pod in specs.items()} == expected
    body = fakes.spec_decode(scheduling={"supplementalGroups": [44, 992]})
    serving = next(
        o for o in plan_serving(body, ServingObserved(now=fakes.NOW)).sync if o["kind"] == "Deployment"
    )
    assert serving["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [44, 992]


def test_the_workspace_write_probe_is_shaped_like_a_stage_pod():
    """tests/operator/harness.workspace_write_pod, for the write test on the real node: the stage
    pods' user, fsGroup and workspace claim, and a command that writes to the workspace."""
    pod = workspace_write_pod("ml", "fresh-claim")
    spec = pod["spec"]
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 0,
        "fsGroup": 0,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["restartPolicy"] == "Never"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "workspace"]
    assert volume["persistentVolumeClaim"]["claimName"] == "fresh-claim"
    (container,) = spec["containers"]
    assert {"name": "workspace", "mountPath": "/workspace"} in container["volumeMounts"]
    assert container["command"][:2] == ["python3", "-c"] and WRITE_PROBE in container["command"][2]
