"""DraftTraining's desired children, as pure functions of the object: the workspace PVC, the target
and streaming-extraction servers (Deployment and Service each), the trainer's headless Service and
the stage Jobs. reconcile/training.py decides which of them exist.

Each builder takes `body`, the object as read from the API server (the owner its children name), and
`dt`, the same object parsed, whose status.workspacePath the state machine has fixed for this run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from eagle3_api import stage_plan
from eagle3_api.draft_training import DraftTraining
from eagle3_api.stage_plan import server_for, workspace_claim, workspace_path
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.disruption import trainer_pod_failure_policy
from eagle3_operator.reconcile.jobs import STAGE_CONTAINER
from eagle3_operator.reconcile.pods import (
    PROBE_PERIOD_S,
    SERVER_PROGRESS_DEADLINE_S,
    STARTUP_PROBE_FAILURES,
    TERMINATION_LOG,
    VLLM_PORT,
    Mounts,
    PodPolicy,
    apply_pod_policy,
    downward_env,
    gpu_resources,
    hf_token_env,
    merge_env,
    model_location,
    service,
    user_env,
    vllm_args,
    vllm_pod_spec,
)

WORKSPACE = "/workspace"
TORCHRUN_PORT = 29500
STREAM_PORT = 5600


def server_name(dt: DraftTraining, server: str) -> str:
    return f"{dt.metadata['name']}-{server}"


def trainer_service_name(dt: DraftTraining) -> str:
    return f"{dt.metadata['name']}-trainer"


def job_name(dt: DraftTraining, stage: str, attempt: int, suffix: str = "") -> str:
    short = {"evaluate": "eval"}.get(stage, stage)
    name = (
        f"{dt.metadata['name']}-{short}"
        + (f"-{suffix}" if suffix else "")
        + (f"-r{attempt}" if attempt else "")
    )
    return meta.dns_label(name)


class ClaimLocations:
    """Where a pod finds what a spec names on claims: models under /models/ROLE, read-only data
    claims under /sources/CLAIM, the export claim at /export; each claim is added to the pod's
    volumes when first used."""

    def __init__(self, mounts: Mounts):
        self.mounts = mounts
        self._sources: dict[str, str] = {}

    def model(self, ref: str, role: str) -> str:
        return model_location(ref, role, self.mounts)

    def dataset(self, claim: str, path: str) -> str:
        volume = self._sources.setdefault(claim, f"source-{len(self._sources)}")
        self.mounts.add_claim(volume, claim, f"/sources/{claim}", read_only=True)
        return f"/sources/{claim}/{path}"

    def output(self, claim: str, path: str) -> str:
        self.mounts.add_claim("export", claim, "/export")
        return f"/export/{path}"


class PodLocations(ClaimLocations):
    """A stage pod's locations (stage_plan.Locations): the claims, and the object's own directory of
    the workspace claim (mounted at /workspace)."""

    def __init__(self, mounts: Mounts, dt: DraftTraining):
        super().__init__(mounts)
        self.workspace = str(PurePosixPath(WORKSPACE, workspace_path(dt)))


def _labels(dt: DraftTraining, component: str) -> dict[str, str]:
    return meta.labels(dt.metadata["name"], component, meta.DRAFT_TRAINING_LABEL)


def workspace_pvc(body: dict[str, Any], dt: DraftTraining) -> dict[str, Any]:
    storage = dt.spec.storage
    spec: dict[str, Any] = {
        "accessModes": list(storage.access_modes),
        "resources": {"requests": {"storage": storage.size}},
    }
    if storage.storage_class_name:
        spec["storageClassName"] = storage.storage_class_name
    # Owned by the DraftTraining (so deleted with it) only when the user asked for that.
    metadata = meta.object_meta(
        body, workspace_claim(dt), _labels(dt, "workspace"), owned=not storage.retain_on_delete
    )
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def target_deployment(body: dict[str, Any], dt: DraftTraining, replicas: int) -> dict[str, Any]:
    target = dt.spec.target
    mounts = Mounts()
    model = model_location(target.model, "target", mounts)
    pod_spec = vllm_pod_spec(target, vllm_args(target, model, target.model), mounts, PodPolicy.of(dt.spec))
    return _server_deployment(body, dt, "target", replicas, pod_spec)


def stream_server_deployment(body: dict[str, Any], dt: DraftTraining, replicas: int) -> dict[str, Any]:
    """`eagle3 extract --mode streaming`: a vLLM extraction server whose connector streams
    hidden states to the trainer over zmq (STREAM_PORT)."""
    spec = dt.spec
    mounts = Mounts()
    argv = stage_plan.stream_server_argv(dt, PodLocations(mounts, dt), VLLM_PORT, STREAM_PORT)
    mounts.add_claim("workspace", workspace_claim(dt), WORKSPACE)
    mounts.add_shm(spec.target.shm_size)
    probe = {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": PROBE_PERIOD_S,
        "timeoutSeconds": 5,
    }
    container = {
        "name": STAGE_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["eagle3", *argv],
        "ports": [
            {"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"},
            {"name": "stream", "containerPort": STREAM_PORT, "protocol": "TCP"},
        ],
        "env": merge_env(
            [
                *downward_env(),
                {"name": "HF_HOME", "value": f"{WORKSPACE}/.cache/huggingface"},
                {"name": "VLLM_ROCM_USE_AITER", "value": "1"},
                *hf_token_env(spec.target),
            ],
            user_env(spec.target),
        ),
        "resources": gpu_resources(spec.target, spec.target.gpus),
        "volumeMounts": mounts.mounts,
        "startupProbe": probe | {"failureThreshold": STARTUP_PROBE_FAILURES},
        "readinessProbe": probe | {"failureThreshold": 3},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": mounts.volumes}
    if spec.runtime.service_account_name:
        pod_spec["serviceAccountName"] = spec.runtime.service_account_name
    apply_pod_policy(
        pod_spec,
        PodPolicy.of(spec),
        gpus=spec.target.gpus,
        gpu_resource=spec.target.gpu_resource_name,
        runtime_user=True,
    )
    return _server_deployment(body, dt, "stream", replicas, pod_spec)


def _server_deployment(
    body: dict[str, Any], dt: DraftTraining, server: str, replicas: int, pod_spec: dict[str, Any]
) -> dict[str, Any]:
    selector = meta.selector_labels(dt.metadata["name"], server, meta.DRAFT_TRAINING_LABEL)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.object_meta(body, server_name(dt, server), _labels(dt, server)),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # A second server would need a second set of GPUs; replace instead of surging.
            "strategy": {"type": "Recreate"},
            "progressDeadlineSeconds": SERVER_PROGRESS_DEADLINE_S,
            "template": {"metadata": {"labels": _labels(dt, server)}, "spec": pod_spec},
        },
    }


def server_service(body: dict[str, Any], dt: DraftTraining, server: str) -> dict[str, Any]:
    selector = meta.selector_labels(dt.metadata["name"], server, meta.DRAFT_TRAINING_LABEL)
    # Headless: one server behind the name, reached by DNS at its pod's address (the ports are the
    # container's). No virtual IP to allocate, which is a write less per DraftTraining.
    svc = service(
        meta.object_meta(body, server_name(dt, server), _labels(dt, server)),
        selector,
        VLLM_PORT,
        clusterIP="None",
    )
    if server == "stream":
        svc["spec"]["ports"].append(
            {"name": "stream", "port": STREAM_PORT, "targetPort": "stream", "protocol": "TCP"}
        )
    return svc


def trainer_service(body: dict[str, Any], dt: DraftTraining) -> dict[str, Any]:
    selector = meta.selector_labels(dt.metadata["name"], "train", meta.DRAFT_TRAINING_LABEL)
    svc = service(
        meta.object_meta(body, trainer_service_name(dt), _labels(dt, "train")),
        selector,
        TORCHRUN_PORT,
        clusterIP="None",
        publishNotReadyAddresses=True,
    )
    svc["spec"]["ports"] = [{"name": "rendezvous", "port": TORCHRUN_PORT, "protocol": "TCP"}]
    return svc


def server_url(dt: DraftTraining, server: str) -> str:
    return f"http://{server_name(dt, server)}:{VLLM_PORT}"


def stage_job(
    body: dict[str, Any],
    dt: DraftTraining,
    name: str,
    argv: list[str],
    mounts: Mounts,
    *,
    gpus: int = 0,
    nodes: int = 1,
    extra_resources: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Job whose pods run `eagle3 STAGE ...` (argv from stage_plan) over the workspace
    (docs/contracts.md)."""
    spec = dt.spec
    stage = argv[0]
    mounts.add_claim("workspace", workspace_claim(dt), WORKSPACE)
    if gpus:
        mounts.add_shm(spec.target.shm_size)
    command = ["eagle3", *argv, "--result-file", TERMINATION_LOG]
    env = [*downward_env(), {"name": "HF_HOME", "value": f"{WORKSPACE}/.cache/huggingface"}]
    env += hf_token_env(spec.target)
    if gpus:
        env.append({"name": "VLLM_ROCM_USE_AITER", "value": "1"})
    pod_spec: dict[str, Any] = {"restartPolicy": "Never"}
    if stage == "train" and (nodes > 1 or spec.training.gpus_per_node > 1):
        # torchrun starts one process per GPU.
        launcher = ["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={spec.training.gpus_per_node}"]
        if nodes == 1:
            # One pod rendezvouses with itself; its Job is not Indexed, so no completion index
            # (rank) exists to pass.
            launcher.append("--standalone")
        else:
            # Several pods: the rank is the pod's completion index in the Indexed Job, and rank 0
            # (the index-0 pod) is reached through the headless Service.
            env.append(
                {
                    "name": "NODE_RANK",
                    "valueFrom": {
                        "fieldRef": {
                            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                        }
                    },
                }
            )
            launcher += [
                "--node-rank=$(NODE_RANK)",
                f"--master-addr={name}-0.{trainer_service_name(dt)}",
                f"--master-port={TORCHRUN_PORT}",
            ]
            pod_spec["subdomain"] = trainer_service_name(dt)
        command = [*launcher, "--no-python", *command]
    users_env = user_env(spec.target)
    if stage == "train":
        # The trainer's own overlay (RCCL and RDMA settings) over target.env.
        users_env = merge_env(users_env, [e.to_json() for e in spec.training.env])
    container = {
        "name": STAGE_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": command,
        "env": merge_env(env, users_env),
        "volumeMounts": mounts.mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    resources = gpu_resources(spec.target, gpus, extra_resources)
    if resources:
        container["resources"] = resources
    pod_spec |= {"containers": [container], "volumes": mounts.volumes}
    if spec.runtime.service_account_name:
        pod_spec["serviceAccountName"] = spec.runtime.service_account_name
    apply_pod_policy(
        pod_spec,
        PodPolicy.of(spec),
        gpus=gpus,
        gpu_resource=spec.target.gpu_resource_name,
        runtime_user=True,
    )
    stage_labels = _labels(dt, stage) | {meta.STAGE_LABEL: stage}
    template_metadata: dict[str, Any] = {"labels": stage_labels}
    if stage == "train" and spec.training.pod_annotations:
        template_metadata["annotations"] = dict(spec.training.pod_annotations)  # e.g. a Multus network
    job_labels = dict(stage_labels)
    if spec.scheduling.queue_name:
        job_labels[meta.KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
    job_spec: dict[str, Any] = {
        "backoffLimit": spec.runtime.backoff_limit,
        "template": {"metadata": template_metadata, "spec": pod_spec},
    }
    if nodes > 1:
        job_spec |= {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes}
        # A recreated rank cannot rejoin a running torchrun group, and its peers would wait for it
        # until the collective timeout: one failed rank fails the Job, which stops the others, and
        # the operator starts the whole group again (training.groupRestarts).
        job_spec["backoffLimit"] = 0
    if stage == "train":
        # An evicted or preempted trainer pod is no crash (reconcile/disruption.py); the pods'
        # restartPolicy is Never, which a podFailurePolicy needs.
        job_spec["podFailurePolicy"] = trainer_pod_failure_policy(nodes)
    if spec.runtime.stage_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = spec.runtime.stage_deadline_seconds
    if spec.scheduling.queue_name:
        job_spec["suspend"] = True  # Kueue admits the Job by unsuspending it
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta.object_meta(body, name, job_labels),
        "spec": job_spec,
    }


def stage_jobs(
    body: dict[str, Any], dt: DraftTraining, stage: str, attempt: int, train_metrics: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The Jobs of one stage, each running its stage_plan command with the volumes that names;
    `train_metrics` (the train stage's result) names the checkpoints the evaluate stage measures."""
    spec = dt.spec
    if stage == "evaluate":
        jobs = []
        for step in stage_plan.checkpoints_to_evaluate(dt, train_metrics):
            mounts = Mounts()
            argv = stage_plan.stage_argv(dt, stage, PodLocations(mounts, dt), step=step)
            name = job_name(dt, stage, attempt, str(step))
            jobs.append(stage_job(body, dt, name, argv, mounts, gpus=spec.target.gpus))
        return jobs
    mounts = Mounts()
    server = server_for(dt, stage)
    argv = stage_plan.stage_argv(
        dt, stage, PodLocations(mounts, dt), server=server_url(dt, server) if server else None
    )
    name = job_name(dt, stage, attempt)
    if stage in ("extract", "sweep"):  # both serve the target themselves
        return [stage_job(body, dt, name, argv, mounts, gpus=spec.target.gpus)]
    if stage == "train":
        gpus, nodes, resources = spec.training.gpus_per_node, spec.training.nodes, spec.training.resources
        return [stage_job(body, dt, name, argv, mounts, gpus=gpus, nodes=nodes, extra_resources=resources)]
    return [stage_job(body, dt, name, argv, mounts)]
