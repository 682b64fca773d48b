"""DraftTraining: desired children and the stage state machine, as pure functions."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError

from eagle3_operator.api.draft_training import DraftTraining, Progress
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.conditions import get_condition, set_condition
from eagle3_operator.reconcile.jobs import (
    DEADLINE_EXCEEDED,
    POD_CREATION_GRACE_S,
    STAGE_CONTAINER,
    JobOutcome,
    job_age_s,
    job_outcome,
    lacks_pods,
    latest_progress,
)
from eagle3_operator.reconcile.network_policy import plan_network_policy
from eagle3_operator.reconcile.ownership import foreign_problem, withhold_foreign
from eagle3_operator.reconcile.plan import Event, Plan, iso, parse_iso
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
from eagle3_operator.reconcile.stuck import (
    REFUSAL_RETRY_S,
    Problem,
    Refusal,
    deployment_problem,
    first_pod_problem,
    job_creation_problem,
)
from eagle3_runtime import stage_plan
from eagle3_runtime.layout import export_version
from eagle3_runtime.stage_plan import (
    WORKSPACE_RUNS,
    StageInputError,
    server_for,
    workspace_claim,
    workspace_path,
)

STAGE_CONDITIONS = {
    "generate": "Generated",
    "extract": "HiddenStatesExtracted",
    "train": "Trained",
    "evaluate": "Evaluated",
    "select": "Selected",
    "sweep": "Swept",
    "export": "Exported",
    "quantize": "Quantized",
}
# A Job can be Complete a moment before its pod's termination message is visible; after this long a
# missing StageResult is a failure of the stage.
RESULT_GRACE_S = 60.0
RESULT_POLL_S = 5.0
# A Job without pods is looked at again until its pods appear or the Job controller says why not
# (FailedCreate Events are not watched); after this long the periodic resync does it.
POD_CREATION_WATCH_S = 300.0
WORKSPACE = "/workspace"
TORCHRUN_PORT = 29500
STREAM_PORT = 5600
# server -> (description, its condition type, the event reason when it is scaled down)
SERVERS = {
    "target": ("target vLLM server", "TargetReady", "TargetScaledDown"),
    "stream": ("streaming extraction server", "StreamServerReady", "StreamServerScaledDown"),
}
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
# Reasons of a stage condition in the normal course; any other reason is a stuck stage's problem.
STAGE_REASONS = {
    "Succeeded": "Completed",
    "Running": "Running",
    "Failed": "Failed",
    "Pending": "Pending",
}
WAITING_REASONS = {"target": "WaitingForTarget", "stream": "WaitingForStreamServer"}


@dataclass
class TrainingObserved:
    """The children of one DraftTraining as listed from the API server: its own (matched by its uid,
    reconcile.ownership) and, in `foreign`, those that carry its name but belong to another owner."""

    now: datetime
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    network_policies: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    # FailedCreate Events of Jobs in the namespace, read only while jobs_lacking_pods() is not empty.
    job_events: list[dict[str, Any]] = field(default_factory=list)
    # Children the API server refused in this reconcile's writes.
    refused: list[Refusal] = field(default_factory=list)

    def pods_of(self, job_name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods
            if any((p["metadata"].get("labels") or {}).get(k) == job_name for k in JOB_NAME_LABELS)
        ]

    def server_pods(self, server: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods
            if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == server
            and meta.STAGE_LABEL not in (p["metadata"].get("labels") or {})
        ]

    def jobs_lacking_pods(self) -> list[dict[str, Any]]:
        """Jobs whose FailedCreate Events are worth reading: active, past their first moments, podless."""
        return [
            job
            for name, job in sorted(self.jobs.items())
            if job_age_s(job, self.now) >= POD_CREATION_GRACE_S and lacks_pods(job, self.pods_of(name))
        ]


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


class PodLocations:
    """Where a stage pod finds what the spec names (stage_plan.Locations): the object's own directory
    of the workspace claim (mounted at /workspace), models under /models/ROLE, read-only data claims
    under /sources/CLAIM, the export claim at /export; each claim is added to the pod's volumes when
    first used."""

    def __init__(self, mounts: Mounts, dt: DraftTraining):
        self.mounts = mounts
        self.workspace = str(PurePosixPath(WORKSPACE, workspace_path(dt)))
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


class TrainingPlanner:
    """Builds one reconcile's Plan for a DraftTraining from its body and observed children."""

    def __init__(self, body: dict[str, Any], observed: TrainingObserved):
        self.body = body
        self.dt = DraftTraining.model_validate(body)
        self.name = body["metadata"]["name"]
        self.observed = observed
        self.now = iso(observed.now)
        self.generation = body["metadata"].get("generation")
        self.plan = Plan()

    # ---- children -------------------------------------------------------------------------------

    def _labels(self, component: str) -> dict[str, str]:
        return meta.labels(self.name, component, meta.DRAFT_TRAINING_LABEL)

    def workspace_pvc(self) -> dict[str, Any]:
        storage = self.dt.spec.storage
        spec: dict[str, Any] = {
            "accessModes": list(storage.access_modes),
            "resources": {"requests": {"storage": storage.size}},
        }
        if storage.storage_class_name:
            spec["storageClassName"] = storage.storage_class_name
        # Owned by the DraftTraining (so deleted with it) only when the user asked for that.
        metadata = meta.object_meta(
            self.body, workspace_claim(self.dt), self._labels("workspace"), owned=not storage.retain_on_delete
        )
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}

    def target_deployment(self, replicas: int) -> dict[str, Any]:
        target = self.dt.spec.target
        mounts = Mounts()
        model = model_location(target.model, "target", mounts)
        pod_spec = vllm_pod_spec(
            target, vllm_args(target, model, target.model), mounts, PodPolicy.of(self.dt.spec)
        )
        return self._server_deployment("target", replicas, pod_spec)

    def stream_server_deployment(self, replicas: int) -> dict[str, Any]:
        """`eagle3 extract --mode streaming`: a vLLM extraction server whose connector streams
        hidden states to the trainer over zmq (STREAM_PORT)."""
        spec = self.dt.spec
        mounts = Mounts()
        argv = stage_plan.stream_server_argv(self.dt, PodLocations(mounts, self.dt), VLLM_PORT, STREAM_PORT)
        mounts.add_claim("workspace", workspace_claim(self.dt), WORKSPACE)
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
        return self._server_deployment("stream", replicas, pod_spec)

    def _server_deployment(self, server: str, replicas: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
        selector = meta.selector_labels(self.name, server, meta.DRAFT_TRAINING_LABEL)
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta.object_meta(self.body, server_name(self.dt, server), self._labels(server)),
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": selector},
                # A second server would need a second set of GPUs; replace instead of surging.
                "strategy": {"type": "Recreate"},
                "progressDeadlineSeconds": SERVER_PROGRESS_DEADLINE_S,
                "template": {"metadata": {"labels": self._labels(server)}, "spec": pod_spec},
            },
        }

    def server_service(self, server: str) -> dict[str, Any]:
        selector = meta.selector_labels(self.name, server, meta.DRAFT_TRAINING_LABEL)
        svc = service(
            meta.object_meta(self.body, server_name(self.dt, server), self._labels(server)),
            selector,
            VLLM_PORT,
        )
        if server == "stream":
            svc["spec"]["ports"].append(
                {"name": "stream", "port": STREAM_PORT, "targetPort": "stream", "protocol": "TCP"}
            )
        return svc

    def trainer_service(self) -> dict[str, Any]:
        selector = meta.selector_labels(self.name, "train", meta.DRAFT_TRAINING_LABEL)
        svc = service(
            meta.object_meta(self.body, trainer_service_name(self.dt), self._labels("train")),
            selector,
            TORCHRUN_PORT,
            clusterIP="None",
            publishNotReadyAddresses=True,
        )
        svc["spec"]["ports"] = [{"name": "rendezvous", "port": TORCHRUN_PORT, "protocol": "TCP"}]
        return svc

    def server_url(self, server: str = "target") -> str:
        return f"http://{server_name(self.dt, server)}:{VLLM_PORT}"

    def stage_job(
        self,
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
        spec = self.dt.spec
        stage = argv[0]
        mounts.add_claim("workspace", workspace_claim(self.dt), WORKSPACE)
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
                    f"--master-addr={name}-0.{trainer_service_name(self.dt)}",
                    f"--master-port={TORCHRUN_PORT}",
                ]
                pod_spec["subdomain"] = trainer_service_name(self.dt)
            command = [*launcher, "--no-python", *command]
        container = {
            "name": STAGE_CONTAINER,
            "image": spec.runtime.image,
            "imagePullPolicy": spec.runtime.image_pull_policy,
            "command": command,
            "env": merge_env(env, user_env(spec.target)),
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
        job_labels = self._labels(stage) | {meta.STAGE_LABEL: stage}
        if spec.scheduling.queue_name:
            job_labels[meta.KUEUE_QUEUE_LABEL] = spec.scheduling.queue_name
        job_spec: dict[str, Any] = {
            "backoffLimit": spec.runtime.backoff_limit,
            "template": {
                "metadata": {"labels": self._labels(stage) | {meta.STAGE_LABEL: stage}},
                "spec": pod_spec,
            },
        }
        if nodes > 1:
            job_spec |= {"completionMode": "Indexed", "completions": nodes, "parallelism": nodes}
        if spec.runtime.stage_deadline_seconds:
            job_spec["activeDeadlineSeconds"] = spec.runtime.stage_deadline_seconds
        if spec.scheduling.queue_name:
            job_spec["suspend"] = True  # Kueue admits the Job by unsuspending it
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta.object_meta(self.body, name, job_labels),
            "spec": job_spec,
        }

    def stage_jobs(self, stage: str, attempt: int) -> list[dict[str, Any]]:
        """The Jobs of one stage, each running its stage_plan command with the volumes that names."""
        spec = self.dt.spec
        if stage == "evaluate":
            jobs = []
            for step in stage_plan.checkpoints_to_evaluate(
                self.dt, self._stage_record("train").get("metrics") or {}
            ):
                mounts = Mounts()
                argv = stage_plan.stage_argv(self.dt, stage, PodLocations(mounts, self.dt), step=step)
                name = job_name(self.dt, stage, attempt, str(step))
                jobs.append(self.stage_job(name, argv, mounts, gpus=spec.target.gpus))
            return jobs
        mounts = Mounts()
        server = server_for(self.dt, stage)
        argv = stage_plan.stage_argv(
            self.dt, stage, PodLocations(mounts, self.dt), server=self.server_url(server) if server else None
        )
        name = job_name(self.dt, stage, attempt)
        if stage in ("extract", "sweep"):  # both serve the target themselves
            return [self.stage_job(name, argv, mounts, gpus=spec.target.gpus)]
        if stage == "train":
            training = spec.training
            job = self.stage_job(
                name, argv, mounts, gpus=training.gpus_per_node, nodes=training.nodes,
                extra_resources=training.resources,
            )  # fmt: skip
            return [job]
        return [self.stage_job(name, argv, mounts)]

    # ---- state machine ---------------------------------------------------------------------------

    def _stage_record(self, stage: str) -> dict[str, Any]:
        return self.records[stage]

    def _event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def _fail(self, stage: str, reason: str, message: str) -> None:
        record = self.records[stage]
        record |= {"state": "Failed", "message": message, "completionTime": self.now}
        self.failure = (reason, f"stage {stage} failed: {message}")
        self._event("Warning", "StageFailed", f"{stage}: {reason}: {message}")

    def _start_run(self, status: dict[str, Any]) -> None:
        """Fix this run's workspace directory when the object starts; on a raised spec.restart, start a
        new run: every stage again (new Jobs), in a new directory, with no result of the last run left
        in the status. The last run's Jobs go; its files stay on the claim."""
        restart, uid = self.dt.spec.restart, self.body["metadata"]["uid"]
        if status.get("restart") is None:
            # Objects that started before runs had their own directory keep the claim's root.
            status["restart"] = restart
            status.setdefault("workspacePath", "" if status.get("stages") else workspace_path(self.dt))
        elif status["restart"] < restart:
            for stage, record in self.records.items():
                for job in record.get("jobs") or []:
                    self.plan.delete.append({"apiVersion": "batch/v1", "kind": "Job", "name": job})
                self.records[stage] = {
                    "name": stage, "state": "Pending", "attempt": record.get("attempt", 0) + 1, "jobs": [],
                    "message": "",
                }  # fmt: skip
            for stale in (
                "export",
                "checkpoints",
                "bestCheckpoint",
                "progress",
                "startTime",
                "completionTime",
            ):
                status.pop(stale, None)
            status["restart"] = restart
            status["workspacePath"] = f"{WORKSPACE_RUNS}/{uid}-restart-{restart}"
            self._event(
                "Normal", "Restarted", f"spec.restart is {restart}: training again from the first stage "
                f"in {status['workspacePath']} of the workspace"
            )  # fmt: skip
        self.dt.status.workspace_path = status["workspacePath"]

    def _retry_if_spec_changed(self, status: dict[str, Any]) -> None:
        """After a failure, a spec edit (a new generation) retries the failed stage with new Jobs."""
        failed = get_condition(status.get("conditions") or [], "Failed")
        if status.get("phase") != "Failed" or not failed or failed.get("status") != "True":
            return
        if (failed.get("observedGeneration") or 0) >= (self.generation or 0):
            return
        for stage, record in self.records.items():
            if record["state"] != "Failed":
                continue
            for job in record.get("jobs") or []:
                self.plan.delete.append({"apiVersion": "batch/v1", "kind": "Job", "name": job})
            record |= {"state": "Pending", "attempt": record.get("attempt", 0) + 1, "jobs": [], "message": ""}
            record.pop("startTime", None)
            record.pop("completionTime", None)
            self._event("Normal", "Retrying", f"spec changed after failure: retrying stage {stage}")
        status.pop("completionTime", None)

    def _server_ready(self, server: str) -> bool:
        deployment = self.observed.deployments.get(server_name(self.dt, server))
        if not deployment:
            return False
        status = deployment.get("status") or {}
        return (status.get("readyReplicas") or 0) >= 1 and (deployment["spec"].get("replicas") or 0) >= 1

    def _record_success(self, stage: str, outcomes: list[JobOutcome], status: dict[str, Any]) -> None:
        """Store a finished stage's results; raises KeyError/ValueError on a result without its metrics."""
        record = self.records[stage]
        finished = max((o.finished_at or self.now) for o in outcomes)
        results = [o.result for o in outcomes if o.result]
        metrics = {k: v for k, v in results[0].metrics.items() if v is not None} if len(results) == 1 else {}
        updates: dict[str, Any] = {}
        if stage == "evaluate":
            evaluations = [_checkpoint_evaluation(r.metrics) for r in results]
            updates["checkpoints"] = sorted(evaluations, key=lambda e: e["step"])
            metrics = {"checkpoints": len(evaluations)}
        if stage == "select":
            by_context = [
                {"contextLength": n, "acceptanceLength": length, "drafts": drafts}
                for n, length, drafts in zip(
                    metrics.get("context_lengths", []), metrics.get("context_acceptance_length", []),
                    metrics.get("context_drafts", []), strict=True,
                )
            ] + [{"contextLength": n} for n in metrics.get("context_lengths_unfilled", [])]  # fmt: skip
            best = {
                "step": int(metrics["step"]),
                "acceptanceLength": metrics.get("acceptance_length"),
                "acceptanceByContextLength": sorted(by_context, key=lambda c: c["contextLength"]) or None,
            }
            updates["bestCheckpoint"] = {k: v for k, v in best.items() if v is not None}
        if stage == "sweep":
            updates["sweep"] = _sweep_result(metrics)
            metrics = {"num_speculative_tokens": metrics["num_speculative_tokens"]}
        if stage == stage_plan.stages(self.dt)[-1]:
            claim, destination = stage_plan.export_destination(self.dt)
            # The stage published the draft under its digest, beside earlier exports (never over them).
            digest = str(results[0].metrics["digest"])
            path = f"{destination}/{export_version(digest)}"
            updates["export"] = {
                "claimName": claim,
                "path": path,
                "uri": f"pvc://{claim}/{path}",
                "digest": digest,
                "format": self.dt.spec.export.format,
                "quantization": self.dt.spec.export.quantize,
            }
        status.update(updates)
        record |= {
            "state": "Succeeded",
            "completionTime": finished,
            "metrics": metrics,
            "message": "completed",
        }
        if results and results[0].message:
            record["message"] = results[0].message[:1000]
        self._event(
            "Normal", "StageSucceeded", f"{stage} completed" + (f": {_brief(metrics)}" if metrics else "")
        )
        minimum = self.dt.spec.evaluation.min_acceptance_length
        if stage == "select" and minimum is not None:
            measured = updates["bestCheckpoint"].get("acceptanceLength")
            if measured is None or measured < minimum:
                self._fail(
                    stage,
                    "AcceptanceBelowMinimum",
                    f"best checkpoint step {updates['bestCheckpoint']['step']} has acceptance length {measured}, "
                    f"below evaluation.minAcceptanceLength {minimum}",
                )

    def _advance(self, stage: str, status: dict[str, Any]) -> bool:
        """Drive one stage; True when it is done and the next one may start now."""
        record = self.records[stage]
        try:
            desired = self.stage_jobs(stage, record.get("attempt", 0))
        except StageInputError as exc:
            self._fail(stage, "InvalidStageInput", str(exc))
            return False
        outcomes = []
        for job in desired:
            name = job["metadata"]["name"]
            observed = self.observed.jobs.get(name)
            if observed is None:
                self.plan.create.append(job)
                outcomes.append(JobOutcome("Running"))
            else:
                outcomes.append(job_outcome(observed, self.observed.pods_of(name)))
        record["jobs"] = [j["metadata"]["name"] for j in desired]
        if record["state"] == "Pending":
            record |= {"state": "Running", "startTime": self.now, "message": "running"}
            self._event("Normal", "StageStarted", f"{stage} started: " + ", ".join(record["jobs"]))
        if stage == "train" and self.dt.spec.training.nodes > 1:
            self.plan.sync.append(self.trainer_service())
        progress = latest_progress([p for name in record["jobs"] for p in self.observed.pods_of(name)])
        if progress is not None:
            # A malformed progress record is ignored: progress is informational only.
            with contextlib.suppress(ValidationError):
                status["progress"] = Progress.model_validate(progress).to_json()
        failed = [o for o in outcomes if o.state == "Failed"]
        if failed:
            message = failed[0].message
            if failed[0].reason == DEADLINE_EXCEEDED and (stuck := self._stuck_before(stage)):
                message += f"; it was stuck: {stuck}"
            self._fail(stage, failed[0].reason, message)
            return False
        if any(o.state == "Running" for o in outcomes):
            self._look_for_stuck_pods(stage, [j["metadata"]["name"] for j in desired])
            return False
        missing = [o for o in outcomes if o.result is None]
        if missing:
            waited = max(
                (self.observed.now - parse_iso(o.finished_at)).total_seconds() for o in missing if o.finished_at
            ) if any(o.finished_at for o in missing) else 0.0  # fmt: skip
            if waited >= RESULT_GRACE_S:
                self._fail(
                    stage, "StageResultMissing", "the stage ended without a result in its termination message"
                )
            else:
                self.plan.requeue_after = RESULT_POLL_S
            return False
        not_ok = [o.result for o in outcomes if o.result and not o.result.ok]
        if not_ok:
            self._fail(stage, "StageReportedFailure", not_ok[0].message or "the stage reported ok=false")
            return False
        try:
            self._record_success(stage, outcomes, status)
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(stage, "InvalidStageResult", f"the stage result lacks a usable metric: {exc!r}")
        return self.records[stage]["state"] == "Succeeded"

    def _look_for_stuck_pods(self, stage: str, jobs: list[str]) -> None:
        """Why a running stage's Jobs make no progress: a pod the scheduler or the kubelet holds
        back, or pods the Job controller cannot create."""
        for name in jobs:
            job = self.observed.jobs.get(name)
            if job is None:
                continue
            pods = self.observed.pods_of(name)
            problem = first_pod_problem(pods)
            if problem is None and lacks_pods(job, pods):
                problem = job_creation_problem(job, self.observed.job_events)
                if problem is None and job_age_s(job, self.observed.now) < POD_CREATION_WATCH_S:
                    self._requeue(POD_CREATION_GRACE_S)
            if problem:
                self.problems[stage] = problem
                return

    def _stuck_before(self, stage: str) -> str | None:
        """The problem the stage's condition reported before this reconcile, if it was stuck."""
        old = get_condition((self.body.get("status") or {}).get("conditions") or [], STAGE_CONDITIONS[stage])
        normal = set(STAGE_REASONS.values()) | set(WAITING_REASONS.values())
        return old["message"] if old and old.get("reason") not in normal else None

    def _requeue(self, seconds: float) -> None:
        self.plan.requeue_after = min(self.plan.requeue_after or seconds, seconds)

    def _refusal(self, component: str) -> Problem | None:
        """A refused write of a child of this component (a stage, a server); children of no stage or
        server (the workspace PVC) hold up the current stage."""
        known = set(STAGE_CONDITIONS) | set(SERVERS)
        held_up = [(r.component, r.problem()) for r in self.observed.refused] + self.blocked
        for child_component, problem in held_up:
            if child_component == component or (component == self.current and child_component not in known):
                return problem
        return None

    def _server_problem(self, server: str) -> Problem | None:
        deployment = self.observed.deployments.get(server_name(self.dt, server))
        return first_pod_problem(self.observed.server_pods(server)) or deployment_problem(deployment)

    def build(self) -> Plan:
        dt = self.dt
        old_status = self.body.get("status") or {}
        status = copy.deepcopy(old_status)
        stages = stage_plan.stages(dt)
        previous = {s["name"]: s for s in status.get("stages") or []}
        self.records = {
            name: previous.get(name)
            or {"name": name, "state": "Pending", "attempt": 0, "jobs": [], "message": ""}
            for name in stages
        }
        self.failure: tuple[str, str] | None = None
        self.problems: dict[str, Problem] = {}  # running stage -> why it makes no progress
        self.current: str | None = None
        self._start_run(status)
        self._retry_if_spec_changed(status)
        status.setdefault("startTime", self.now)
        status["workspaceClaim"] = workspace_claim(dt)
        if not dt.spec.storage.existing_claim:
            self.plan.create.append(self.workspace_pvc())

        current: str | None = None
        waiting_for: str | None = None  # the server the current stage waits for
        for stage in stages:
            record = self.records[stage]
            if record["state"] == "Succeeded":
                continue
            current = self.current = stage
            if record["state"] == "Failed":
                self.failure = self.failure or _recorded_failure(status, stage, record)
                break
            server = server_for(dt, stage)
            if server and not self._server_ready(server):
                waiting_for = server
                break
            if not self._advance(stage, status):
                break

        all_done = all(r["state"] == "Succeeded" for r in self.records.values())
        if self.failure:
            phase = "Failed"
        elif all_done:
            phase = "Succeeded"
        elif all(r["state"] == "Pending" for r in self.records.values()):
            phase = "Pending"
        else:
            phase = "Running"
        active = phase in ("Pending", "Running")
        needed = server_for(dt, current) if active else None
        self._sync_server("target", needed == "target")
        if dt.spec.hidden_states.mode == "streaming":
            self._sync_server("stream", needed == "stream")

        status["phase"] = phase
        status["stage"] = current or stages[-1]
        status["observedGeneration"] = self.generation
        status["stages"] = list(self.records.values())
        if phase in ("Succeeded", "Failed"):
            status.setdefault("completionTime", self.now)
        if phase == "Succeeded" and old_status.get("phase") != "Succeeded":
            self._event("Normal", "TrainingSucceeded", f"draft exported to {status['export']['uri']}")
        plan_network_policy(self.plan, self.body, meta.DRAFT_TRAINING_LABEL, self.observed.network_policies)
        self.blocked = [
            (
                (c["metadata"].get("labels") or {}).get("app.kubernetes.io/component", ""),
                foreign_problem(c, self.body),
            )
            for c in withhold_foreign(self.plan, self.observed.foreign)
        ]
        self._conditions(status, phase, current, waiting_for, needed)
        if self.observed.refused:
            self._requeue(REFUSAL_RETRY_S)
        self.plan.status = status
        return self.plan

    def _sync_server(self, server: str, needed: bool) -> None:
        existing = self.observed.deployments.get(server_name(self.dt, server))
        if not needed and existing is None:
            return  # never started, nothing to scale down
        if existing is not None and not needed and (existing["spec"].get("replicas") or 0) > 0:
            title, _, reason = SERVERS[server]
            self._event("Normal", reason, f"no remaining stage needs the {title}")
        replicas = 1 if needed else 0
        deployment = (
            self.target_deployment(replicas)
            if server == "target"
            else self.stream_server_deployment(replicas)
        )
        self.plan.sync += [deployment, self.server_service(server)]

    def _conditions(
        self, status: dict[str, Any], phase: str, current: str | None, waiting: str | None, needed: str | None
    ) -> None:
        conditions = list(status.get("conditions") or [])
        gen, now = self.generation, self.now

        def put(type_: str, ok: bool, reason: str, message: str) -> None:
            set_condition(conditions, type_, ok, reason, message, gen, now)

        def put_problem(type_: str, problem: Problem) -> None:
            """False with the problem's reason; a Warning Event when the reason is new."""
            if (get_condition(conditions, type_) or {}).get("reason") != problem.reason:
                self._event("Warning", problem.reason, problem.message)
            put(type_, False, problem.reason, problem.message)

        servers = ["target"] + (["stream"] if self.dt.spec.hidden_states.mode == "streaming" else [])
        for server in servers:
            title, condition_type, _ = SERVERS[server]
            problem = self._refusal(server) or (self._server_problem(server) if waiting == server else None)
            if problem:
                put_problem(condition_type, problem)
            elif needed != server:
                put(condition_type, False, "ScaledDown", f"no remaining stage needs the {title}")
            elif waiting == server:
                put(condition_type, False, "Starting", f"waiting for the {title} to become ready")
            else:
                put(condition_type, True, "Serving", f"the {title} is ready")
        for stage, record in self.records.items():
            state = record["state"]
            if problem := self._refusal(stage) or self.problems.get(stage):
                put_problem(STAGE_CONDITIONS[stage], problem)
                continue
            reason = STAGE_REASONS[state]
            if state == "Pending" and stage == current and waiting:
                reason = WAITING_REASONS[waiting]
            put(STAGE_CONDITIONS[stage], state == "Succeeded", reason, record.get("message") or state.lower())
        if self.failure:
            # Its observedGeneration is the generation that failed: a later spec edit retries.
            put("Failed", True, self.failure[0], self.failure[1])
        else:
            put("Failed", False, "NoFailure", "no stage has failed")
        put(
            "Ready",
            phase == "Succeeded",
            {"Succeeded": "DraftExported", "Failed": "StageFailed"}.get(phase, phase),
            f"draft at {status['export']['uri']}" if phase == "Succeeded" else f"pipeline {phase.lower()}",
        )
        status["conditions"] = conditions


def _recorded_failure(status: dict[str, Any], stage: str, record: dict[str, Any]) -> tuple[str, str]:
    failed = get_condition(status.get("conditions") or [], "Failed")
    if failed and failed.get("status") == "True":
        return failed.get("reason") or "StageFailed", failed.get("message") or ""
    return "StageFailed", f"stage {stage} failed: {record.get('message', '')}"


def _checkpoint_evaluation(m: dict[str, Any]) -> dict[str, Any]:
    evaluation = {
        "step": int(m["step"]),
        "acceptanceLength": m.get("acceptance_length"),
        "acceptancePerPosition": list(m.get("acceptance_per_position") or []),
        "tokensPerSecond": m.get("tokens_per_second"),
        "speedup": m.get("speedup"),
    }
    return {k: v for k, v in evaluation.items() if v is not None}


def _sweep_result(m: dict[str, Any]) -> dict[str, Any]:
    """status.sweep from `eagle3 sweep`'s result metrics."""
    best = [
        {"concurrency": c, "numSpeculativeTokens": k, "speedup": speedup}
        for c, k, speedup in zip(m["best_concurrency"], m["best_k"], m["best_speedup"], strict=True)
    ]
    return {"schedule": m["schedule"], "numSpeculativeTokens": m["num_speculative_tokens"], "best": best}


def _brief(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in metrics.items() if not isinstance(v, list))[:300]


def plan_training(body: dict[str, Any], observed: TrainingObserved) -> Plan:
    """The whole decision for one DraftTraining; the caller applies it."""
    return TrainingPlanner(body, observed).build()
