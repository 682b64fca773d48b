"""Spec and status parts shared by DraftTraining and SpecDecodeDeployment."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from eagle3_api.base import (
    FREE_FORM_OBJECT,
    ApiModel,
    DnsName,
    Quantity,
    StringMap,
    cel,
    section,
)

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai-rocm:v0.32.0"
# A model is a Hugging Face id (org/name) or a path on a PVC: pvc://CLAIM/PATH.
MODEL_PATTERN = (
    r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/[^\s]+|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)?)$"
)
ModelRef = Annotated[str, Field(min_length=1, max_length=512, pattern=MODEL_PATTERN)]
Quantization = Literal["none", "fp8", "mxfp4"]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the object's namespace."""

    name: DnsName = Field(description="Name of the Secret.")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        "HF_TOKEN", description="Key inside the Secret."
    )


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the object's namespace."""

    name: DnsName = Field(description="Name of the ConfigMap.")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="Key inside the ConfigMap.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (one of the two)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                    "valueFrom needs exactly one of secretKeyRef or configMapKeyRef",
                )
            ]
        }
    }

    secret_key_ref: SecretKeyRef | None = Field(None, description="Take the value from a Secret key.")
    config_map_key_ref: ConfigMapKeyRef | None = Field(
        None, description="Take the value from a ConfigMap key."
    )


class EnvVar(ApiModel):
    """An environment variable for the vLLM container."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "!(has(self.value) && has(self.valueFrom))",
                    "env entries take value or valueFrom, not both",
                )
            ]
        }
    }

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")] = Field(
        description="Variable name."
    )
    value: Annotated[str, Field(max_length=4096)] | None = Field(None, description="Literal value.")
    value_from: EnvVarSource | None = Field(None, description="Value taken from a Secret or ConfigMap key.")


class ResourceSpec(ApiModel):
    """CPU/memory requests and limits added to the container (GPUs are set by `gpus`)."""

    requests: StringMap = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: '8', memory: 64Gi."
    )
    limits: StringMap = Field(default_factory=dict, description="Resource limits, e.g. memory: 128Gi.")


EnvList = Annotated[list[EnvVar], Field(max_length=64)]


def env_field(description: str) -> Any:
    """A container env list, merged by name (a later entry of one name replaces an earlier)."""
    return Field(
        default_factory=list,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class TargetSpec(ApiModel):
    """The target model, served by vLLM on AMD GPUs."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                cel(
                    "self.gpus >= self.tensorParallelSize",
                    "gpus must be at least tensorParallelSize",
                    field_path=".gpus",
                ),
                cel(
                    "!has(self.revision) || !self.model.startsWith('pvc://')",
                    "revision names a version of a Hugging Face id; a pvc:// model is one directory, "
                    "so leave revision out (point model at the directory of the version you want)",
                    field_path=".revision",
                ),
            ]
        }
    }

    model: ModelRef = Field(
        description="Hugging Face model id (org/name) or a directory on a PVC written as pvc://CLAIM/PATH."
    )
    revision: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="Model revision (branch, tag or commit) for Hugging Face ids."
    )
    quantization: Quantization = Field(
        "none",
        description="AMD Quark quantization of the target checkpoint (fp8 or mxfp4 checkpoints load with "
        "quant_method quark); none for an unquantized checkpoint.",
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        1, description="vLLM tensor parallel size."
    )
    gpus: Annotated[int, Field(ge=1, le=64)] = Field(1, description="GPUs per vLLM pod (amd.com/gpu count).")
    gpu_resource_name: Annotated[str, Field(max_length=128, pattern=r"^amd\.com/[A-Za-z0-9_.-]+$")] = Field(
        "amd.com/gpu",
        description="Extended resource that stands for one GPU; partitioned GPUs appear as amd.com/<compute>_<mem>.",
    )
    image: Annotated[str, Field(min_length=1, max_length=512)] = Field(
        DEFAULT_VLLM_IMAGE, description="vLLM ROCm image that serves the target."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy of the vLLM container."
    )
    max_model_len: Annotated[int, Field(ge=16, le=10_000_000)] | None = Field(
        None, description="vLLM --max-model-len; vLLM's default when unset."
    )
    attention_backend: Annotated[str, Field(max_length=64, pattern=r"^[A-Z][A-Z0-9_]*$")] | None = Field(
        None,
        description="vLLM --attention-backend of the target (ROCm has several, e.g. ROCM_AITER_FA, "
        "ROCM_ATTN, TRITON_ATTN); vLLM chooses when unset. A SpecDecodeDeployment's verification runs with it.",
    )
    extra_args: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)] = Field(
        default_factory=list,
        description="Extra command-line arguments appended to `vllm serve`: the target server's, and those of "
        "the vLLM servers that extraction, evaluation, the sweep and verification start on the target.",
    )
    env: EnvList = env_field(
        "Extra environment variables of every container the operator runs for this object "
        "(the vLLM servers, and a DraftTraining's stage pods). An entry named like one the operator sets "
        "replaces it, e.g. VLLM_ROCM_USE_AITER: '0' on MI200-class GPUs, which AITER does not support."
    )
    hf_token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a Hugging Face token; exposed to the pods as HF_TOKEN."
    )
    resources: ResourceSpec = section(ResourceSpec, "CPU and memory for the vLLM container.")
    shm_size: Quantity = Field("16Gi", description="Size of the memory-backed /dev/shm volume.")

    @property
    def vllm_model_args(self) -> list[str]:
        """How vLLM loads and splits the target, wherever it runs it (a server, the verify check)."""
        revision = ["--revision", self.revision] if self.revision else []
        return [*self._vllm_parallel_args, *revision, *self._vllm_quantization_args]

    @property
    def vllm_server_args(self) -> list[str]:
        """What the local pipeline's generate server adds to its model, address, name and context
        length: the flags of the operator's target Deployment (reconcile/pods.vllm_args, which keeps
        its own order so that an upgrade does not roll its pods)."""
        return [*self.vllm_model_args, *self.vllm_backend_args, *self.extra_args]

    @property
    def vllm_stage_server_args(self) -> list[str]:
        """What the vLLM servers a stage starts on the target (extract, evaluate, sweep) add to its model,
        address, name and context length, so that a draft is measured on the target as it is served.
        No --revision: those stages pin the revision themselves (--target-revision)."""
        return [
            *self._vllm_parallel_args,
            *self._vllm_quantization_args,
            *self.vllm_backend_args,
            *self.extra_args,
        ]

    @property
    def vllm_backend_args(self) -> list[str]:
        """The attention backend the user set, as vLLM's flag (none: vLLM picks)."""
        return ["--attention-backend", self.attention_backend] if self.attention_backend else []

    @property
    def _vllm_parallel_args(self) -> list[str]:
        return ["--tensor-parallel-size", str(self.tensor_parallel_size)]

    @property
    def _vllm_quantization_args(self) -> list[str]:
        # Quark fp8/mxfp4 checkpoints carry quant_method quark.
        return ["--quantization", "quark"] if self.quantization != "none" else []


class Toleration(ApiModel):
    """A pod toleration (see the Kubernetes Toleration type)."""

    key: Annotated[str, Field(max_length=316)] | None = Field(
        None, description="Taint key; empty matches all."
    )
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: Annotated[str, Field(max_length=63)] | None = Field(None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; empty matches all."
    )
    toleration_seconds: int | None = Field(None, description="How long a NoExecute taint is tolerated.")


class SchedulingSpec(ApiModel):
    """Where the pods run."""

    node_selector: StringMap = Field(default_factory=dict, description="Node labels the pods require.")
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(
        default_factory=list,
        description="Tolerations added to the pods (GPU pods always tolerate the amd.com/gpu taint).",
    )
    affinity: dict[str, Any] | None = Field(
        None, description="Pod affinity, as in a Pod spec.", json_schema_extra=FREE_FORM_OBJECT
    )
    priority_class_name: Annotated[str, Field(max_length=253)] | None = Field(
        None, description="PriorityClass of the pods."
    )
    supplemental_groups: Annotated[
        list[Annotated[int, Field(ge=1, le=4_294_967_294)]], Field(max_length=16)
    ] = Field(
        default_factory=list,
        description="Supplemental groups of the pods, next to 44 (video) that GPU pods always get. Set the "
        "GPU nodes' render group GID (`getent group render` on a node; it varies by host) so that non-root "
        "pods can open /dev/kfd and /dev/dri/renderD*, unless the container runtime gives the devices to "
        "the pod's user (containerd: device_ownership_from_security_context = true).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    queue_name: Annotated[str, Field(max_length=63)] | None = Field(
        None, description="Kueue LocalQueue; sets the kueue.x-k8s.io/queue-name label on the Jobs."
    )


class PullSecret(ApiModel):
    """An image pull Secret in the object's namespace."""

    name: DnsName = Field(description="Name of the Secret.")


ImagePullSecrets = Annotated[list[PullSecret], Field(max_length=16)]


def image_pull_secrets_field() -> Any:
    return Field(
        default_factory=list,
        description="Secrets (kubernetes.io/dockerconfigjson) in this namespace for pulling the images of every "
        "pod the operator creates for this object, as in a Pod's imagePullSecrets.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class PodSecuritySpec(ApiModel):
    """Security settings of the pods the operator creates (docs/install.md, "Pod Security")."""

    multi_gpu_seccomp_profile: Literal["RuntimeDefault", "Unconfined"] = Field(
        "RuntimeDefault",
        description="Seccomp profile of pods with more than one GPU (tensor-parallel vLLM, multi-GPU trainers). "
        "Unconfined lets RCCL use syscalls the runtime's default profile blocks, at the cost of the Pod "
        "Security baseline level (such pods are refused in baseline and restricted namespaces). Every "
        "other pod runs with RuntimeDefault.",
    )


class NetworkPolicySpec(ApiModel):
    """A NetworkPolicy around the object's pods (enforced only where the cluster's network plugin
    enforces NetworkPolicies)."""

    enabled: bool = Field(
        False,
        description="Create a NetworkPolicy that admits to this object's pods only its own pods and "
        "allowedClients (which reach the vLLM HTTP port alone: the OpenAI API and /metrics).",
    )
    allowed_clients: Annotated[list[dict[str, Any]], Field(max_length=16)] = Field(
        default_factory=list,
        description="NetworkPolicy peers (podSelector, namespaceSelector, ipBlock) that may reach the vLLM "
        "HTTP port: your clients or gateway, your Prometheus, and the operator's pods when "
        "liveAcceptance reads the pods' /metrics itself.",
        json_schema_extra={"items": FREE_FORM_OBJECT},
    )


class Condition(ApiModel):
    """A status condition, as in metav1.Condition."""

    type: Annotated[str, Field(max_length=316)] = Field(description="Condition type, e.g. Ready or Trained.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, Field(max_length=1024)] = Field("", description="CamelCase reason for the status.")
    message: Annotated[str, Field(max_length=32768)] = Field("", description="Human-readable detail.")
    observed_generation: int | None = Field(
        None, description="metadata.generation the condition was computed from."
    )
    last_transition_time: str | None = Field(
        None,
        description="When the status last changed (RFC 3339).",
        json_schema_extra={"format": "date-time"},
    )


CONDITIONS_FIELD = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
Phase = Literal["Pending", "Running", "Succeeded", "Failed"]
