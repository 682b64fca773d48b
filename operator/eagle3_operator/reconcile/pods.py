"""Pod building blocks: the ROCm GPU recipe, model volumes, and the vLLM server container."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from eagle3_api.common import PodSecuritySpec, PullSecret, SchedulingSpec, TargetSpec

VLLM_PORT = 8000
VIDEO_GROUP = 44  # /dev/kfd and /dev/dri/* belong to "video" on older ROCm hosts, to "render" on newer
# The runtime image's user (images/runtime/Dockerfile: uid 1000, gid 0). fsGroup makes a fresh,
# root-owned volume writable for it; OnRootMismatch skips the recursive chown once the root is right.
RUNTIME_USER = 1000
RUNTIME_GROUP = 0
TERMINATION_LOG = "/dev/termination-log"
PROBE_PERIOD_S = 10
STARTUP_PROBE_FAILURES = 180  # 30 minutes to download and load a large model
# Seconds a leaving vLLM pod keeps serving while the Service's endpoints drop it.
PRE_STOP_SLEEP_S = 10
# A server Deployment whose pod is still within its startup probe's budget is slow, not stuck:
# report ProgressDeadlineExceeded only after that budget (the Deployment default is 600 s).
SERVER_PROGRESS_DEADLINE_S = PROBE_PERIOD_S * STARTUP_PROBE_FAILURES + 600


@dataclass
class Mounts:
    """Volumes plus their mounts for one container; `add` ignores a volume added twice."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)

    def add(self, volume: dict[str, Any], mount_path: str, *, read_only: bool = False) -> None:
        if any(v["name"] == volume["name"] for v in self.volumes):
            return
        self.volumes.append(volume)
        mount = {"name": volume["name"], "mountPath": mount_path}
        if read_only:
            mount["readOnly"] = True
        self.mounts.append(mount)

    def add_claim(self, volume_name: str, claim: str, mount_path: str, *, read_only: bool = False) -> None:
        self.add(
            {"name": volume_name, "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}},
            mount_path,
            read_only=read_only,
        )

    def add_shm(self, size: str) -> None:
        self.add({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}, "/dev/shm")


def model_location(ref: str, role: str, mounts: Mounts) -> str:
    """What a pod passes for a model: the Hugging Face id, or the PVC path after mounting the claim."""
    if not ref.startswith("pvc://"):
        return ref
    claim, _, path = ref.removeprefix("pvc://").partition("/")
    root = f"/models/{role}"
    mounts.add_claim(f"{role}-model", claim, root, read_only=True)
    return f"{root}/{path}"


def downward_env() -> list[dict[str, Any]]:
    """POD_NAME / POD_NAMESPACE: a stage finds its own pod with them to post progress."""
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def hf_token_env(target: TargetSpec) -> list[dict[str, Any]]:
    if not target.hf_token_secret:
        return []
    ref = target.hf_token_secret
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def user_env(target: TargetSpec) -> list[dict[str, Any]]:
    return [e.to_json() for e in target.env]


def merge_env(ours: list[dict[str, Any]], users: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Container env merged by name, the user's entry winning (in our entry's place).

    Kubernetes refuses a container with two entries of one name under server-side apply, and a
    user must be able to override what we set (VLLM_ROCM_USE_AITER=0 on MI200-class GPUs).
    """
    by_name = {e["name"]: e for e in users}
    merged = [by_name.pop(e["name"], e) for e in ours]
    return merged + list(by_name.values())


def gpu_resources(target: TargetSpec, gpus: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Requests/limits with the GPU count in both (extended resources must match)."""
    extra = extra or {}
    requests = dict(extra.get("requests") or {})
    limits = dict(extra.get("limits") or {})
    if gpus:
        requests[target.gpu_resource_name] = str(gpus)
        limits[target.gpu_resource_name] = str(gpus)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


@dataclass(frozen=True)
class PodPolicy:
    """What an object's spec says about every pod made for it: placement, security, pull secrets."""

    scheduling: SchedulingSpec
    security: PodSecuritySpec
    image_pull_secrets: list[PullSecret]

    @classmethod
    def of(cls, spec: Any) -> PodPolicy:
        """From a DraftTraining or SpecDecodeDeployment spec (both carry these three fields)."""
        return cls(spec.scheduling, spec.pod_security, list(spec.image_pull_secrets))


# Pod Security "restricted" for every container: no privilege escalation and no capabilities. The
# ROCm devices need none (the device plugin mounts them; group access is by supplementalGroups).
CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def seccomp_profile(security: PodSecuritySpec, gpus: int) -> str:
    """RuntimeDefault, except for multi-GPU pods when the spec lets RCCL run Unconfined."""
    return security.multi_gpu_seccomp_profile if gpus > 1 else "RuntimeDefault"


def pod_security_context(policy: PodPolicy, *, gpus: int, runtime_user: bool) -> dict[str, Any]:
    """The pod securityContext: the runtime image's non-root user with its volumes made writable,
    the seccomp profile, and for GPU pods the device groups."""
    context: dict[str, Any] = {}
    if runtime_user:
        context |= {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_GROUP,
            "fsGroup": RUNTIME_GROUP,
            "fsGroupChangePolicy": "OnRootMismatch",
        }
    groups = ([VIDEO_GROUP] if gpus else []) + list(policy.scheduling.supplemental_groups)
    if groups:
        context["supplementalGroups"] = list(dict.fromkeys(groups))
    context["seccompProfile"] = {"type": seccomp_profile(policy.security, gpus)}
    return context


def apply_pod_policy(
    pod_spec: dict[str, Any],
    policy: PodPolicy,
    *,
    gpus: int,
    gpu_resource: str,
    runtime_user: bool = False,
) -> dict[str, Any]:
    """Scheduling fields, the toleration of the GPU resource's taint for pods that get GPUs, the security
    contexts (runtime_user: the pod runs the eagle3 runtime image) and the image pull secrets."""
    scheduling = policy.scheduling
    tolerations = [t.to_json() for t in scheduling.tolerations]
    if gpus:
        # Clusters commonly taint GPU nodes with the resource name; GPU pods tolerate it.
        tolerations.append({"key": gpu_resource, "operator": "Exists", "effect": "NoSchedule"})
    pod_spec["securityContext"] = pod_security_context(policy, gpus=gpus, runtime_user=runtime_user)
    # Service links put `<SERVICE>_PORT=tcp://...` into every container: a Service named `vllm` (a
    # SpecDecodeDeployment's own name) sets VLLM_PORT, which vLLM then refuses as a URI (seen on the
    # test bed's real node). Nothing the pods run reads these variables; names resolve through DNS.
    pod_spec["enableServiceLinks"] = False
    for container in pod_spec["containers"]:
        container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)
    if policy.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_json() for s in policy.image_pull_secrets]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if scheduling.node_selector:
        pod_spec["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.affinity:
        pod_spec["affinity"] = scheduling.affinity
    if scheduling.priority_class_name:
        pod_spec["priorityClassName"] = scheduling.priority_class_name
    return pod_spec


def vllm_args(target: TargetSpec, model: str, served_model_name: str) -> list[str]:
    """`vllm serve` arguments for the target (speculative decoding is added by the caller)."""
    args = [
        model,
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--served-model-name",
        served_model_name,
        *target.vllm_model_args,
    ]
    if target.max_model_len:
        args += ["--max-model-len", str(target.max_model_len)]
    return args + target.vllm_backend_args + list(target.extra_args)


def vllm_env(target: TargetSpec) -> list[dict[str, Any]]:
    """The environment of a container that runs vLLM on the target (its Hugging Face cache under
    the /cache emptyDir of vllm_pod_spec), the user's entries winning."""
    return merge_env(
        [
            {"name": "VLLM_ROCM_USE_AITER", "value": "1"},
            {"name": "HF_HOME", "value": "/cache/huggingface"},
            *hf_token_env(target),
        ],
        user_env(target),
    )


def vllm_container(
    target: TargetSpec, args: list[str], mounts: Mounts, startup_failures: int = STARTUP_PROBE_FAILURES
) -> dict[str, Any]:
    """The vLLM server container with /health probes; model loading may take many minutes.

    A saturated server answers /health late: readiness allows a minute of slow or missed answers
    before the pod leaves the Service (whose other pods are as busy), liveness two.
    """
    probe = {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": PROBE_PERIOD_S,
        "timeoutSeconds": 10,
    }
    return {
        "name": "vllm",
        "image": target.image,
        "imagePullPolicy": target.image_pull_policy,
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "env": vllm_env(target),
        "resources": gpu_resources(target, target.gpus, target.resources.to_json()),
        "volumeMounts": mounts.mounts,
        "startupProbe": probe | {"failureThreshold": startup_failures},
        "readinessProbe": probe | {"failureThreshold": 6},
        "livenessProbe": probe | {"failureThreshold": 12},
        # A pod leaving (a scale-down, a rollout, a canary's end) first leaves the Service's endpoints:
        # kube-proxy stops sending it new connections before vLLM stops accepting them.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_S}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def vllm_pod_spec(
    target: TargetSpec,
    args: list[str],
    mounts: Mounts,
    policy: PodPolicy,
    startup_failures: int = STARTUP_PROBE_FAILURES,
) -> dict[str, Any]:
    """A vLLM server pod. It needs no Kubernetes API, so it mounts no ServiceAccount token."""
    mounts.add_shm(target.shm_size)
    mounts.add({"name": "hf-cache", "emptyDir": {}}, "/cache")
    pod_spec = {
        "containers": [vllm_container(target, args, mounts, startup_failures)],
        "volumes": mounts.volumes,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 60,
    }
    return apply_pod_policy(pod_spec, policy, gpus=target.gpus, gpu_resource=target.gpu_resource_name)


def service(meta: dict[str, Any], selector: dict[str, str], port: int, **extra: Any) -> dict[str, Any]:
    spec = {
        "selector": selector,
        "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        **extra,
    }
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}
