"""The DraftTraining planner: desired children and the stage state machine, without a cluster."""

from __future__ import annotations

import copy
import json

from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

from tests.operator import fakes


class Cluster:
    """Plays API server + Job controller for the planner: stores what it creates, ends Jobs on request."""

    def __init__(self, body: dict):
        self.body = body
        self.observed = TrainingObserved(now=fakes.NOW)
        self.created: list[str] = []

    def reconcile(self) -> Plan:
        plan = plan_training(copy.deepcopy(self.body), self.observed)
        for obj in plan.create + plan.sync:
            name = obj["metadata"]["name"]
            if obj["kind"] == "Job" and name not in self.observed.jobs:
                self.observed.jobs[name] = copy.deepcopy(obj)
                self.created.append(name)
            elif obj["kind"] == "Deployment":
                self.observed.deployments[name] = fakes.ready_deployment(obj)
        for gone in plan.delete:
            self.observed.jobs.pop(gone["name"], None)
        self.body["status"] = plan.status
        return plan

    def running_jobs(self) -> list[dict]:
        return [j for j in self.observed.jobs.values() if "status" not in j]

    def finish(self, job: dict, *, ok: bool = True, message: str | None = None, **pod) -> None:
        stage = job["metadata"]["labels"]["eagle3.ai/stage"]
        name = job["metadata"]["name"]
        if message is None:
            message = fakes.stage_report(stage, name, ok=ok)
        self.observed.jobs[name] = fakes.finished_job(job, ok=ok)
        phase = "Succeeded" if ok else "Failed"
        self.observed.pods.append(fakes.job_pod(job, phase=phase, message=message, **pod))

    def run_to_end(self, limit: int = 20) -> Plan:
        plan = self.reconcile()
        for _ in range(limit):
            if plan.status["phase"] in ("Succeeded", "Failed"):
                return plan
            for job in self.running_jobs():
                self.finish(job)
            plan = self.reconcile()
        raise AssertionError(f"pipeline did not end: {plan.status}")


def _container(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def test_first_reconcile_makes_workspace_and_target_and_waits_for_it():
    cluster = Cluster(fakes.draft_training())
    plan = plan_training(cluster.body, cluster.observed)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in plan.create + plan.sync)
    assert kinds == [
        ("Deployment", "llama-target"),
        ("PersistentVolumeClaim", "llama-workspace"),
        ("Service", "llama-target"),
    ]
    pvc = next(o for o in plan.create if o["kind"] == "PersistentVolumeClaim")
    assert "ownerReferences" not in pvc["metadata"], "the workspace must outlive the DraftTraining by default"
    assert plan.status["phase"] == "Pending"
    assert fakes.condition(plan.status, "TargetReady")["reason"] == "Starting"
    assert fakes.condition(plan.status, "Generated")["reason"] == "WaitingForTarget"


def test_target_deployment_follows_the_rocm_recipe():
    body = fakes.draft_training(
        target={
            "model": "pvc://models/llama-8b",
            "gpus": 2,
            "tensorParallelSize": 2,
            "hfTokenSecret": {"name": "hf"},
            "extraArgs": ["--enforce-eager"],
        }  # fmt: skip
    )
    plan = plan_training(body, TrainingObserved(now=fakes.NOW))
    deployment = next(o for o in plan.sync if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    vllm = pod["containers"][0]
    assert vllm["command"] == ["vllm", "serve"]
    assert vllm["args"][:9] == ["/models/target/llama-8b", "--host", "0.0.0.0", "--port", "8000",
                                "--served-model-name", "pvc://models/llama-8b", "--tensor-parallel-size", "2"]  # fmt: skip
    assert vllm["args"][-1] == "--enforce-eager"
    assert vllm["resources"]["limits"]["amd.com/gpu"] == "2" == vllm["resources"]["requests"]["amd.com/gpu"]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "VLLM_ROCM_USE_AITER", "value": "1"} in vllm["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}} in vllm[
        "env"
    ]
    assert pod["securityContext"] == {
        "supplementalGroups": [44],
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    model = next(v for v in pod["volumes"] if v["name"] == "target-model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_generate_job_runs_the_contract_command():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()  # target created, becomes ready in the fake
    plan = cluster.reconcile()
    job = next(o for o in plan.create if o["kind"] == "Job")
    assert job["metadata"]["name"] == "llama-generate"
    container = _container(job)
    assert container["command"] == [
        "eagle3", "generate", "--workspace", "/workspace/runs/uid-1", "--server", "http://llama-target:8000",
        "--model", "meta-llama/Llama-3.1-8B-Instruct", "--source", "/sources/prompts/chat.jsonl,mode=chat,weight=1",
        "--num-samples", "100", "--max-tokens", "1024", "--temperature", "0.7", "--top-p", "0.95",
        "--concurrency", "64", "--seed", "0", "--on-bad-row", "skip", "--regenerate-turns", "all",
        "--max-length", "2047", "--long-samples", "truncate", "--result-file", "/dev/termination-log",
    ]  # fmt: skip
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "resources" not in container, "generation talks to the server; it needs no GPU"
    labels = job["metadata"]["labels"]
    assert (
        labels["app.kubernetes.io/managed-by"] == "eagle3-operator"
        and labels["eagle3.ai/stage"] == "generate"
    )
    assert job["spec"]["backoffLimit"] == 2
    assert plan.status["phase"] == "Running" and plan.status["stage"] == "generate"
    assert [e.reason for e in plan.events] == ["StageStarted"]


def test_offline_pipeline_walks_every_stage_and_reports_results():
    cluster = Cluster(fakes.draft_training())
    plan = cluster.run_to_end()
    status = plan.status
    assert status["phase"] == "Succeeded"
    assert [s["name"] for s in status["stages"]] == fakes.OFFLINE_STAGES
    assert all(s["state"] == "Succeeded" for s in status["stages"])
    assert cluster.created == [
        "llama-generate",
        "llama-extract",
        "llama-train",
        "llama-eval-50",
        "llama-eval-100",
        "llama-select",
        "llama-export",
    ]
    assert status["checkpoints"] == [
        {
            "step": step,
            "acceptanceLength": length,
            "acceptancePerPosition": [0.6, 0.4],
            "tokensPerSecond": 120.0,
            "speedup": 1.8,
        }
        for step, length in ((50, 2.2), (100, 2.4))
    ]
    # select's flat per-context-length lists become typed records; an unfilled length has no figures.
    assert status["bestCheckpoint"] == {
        "step": 100,
        "acceptanceLength": 2.4,
        "acceptanceByContextLength": [
            {"contextLength": 1024, "acceptanceLength": 2.4, "drafts": 300.0},
            {"contextLength": 2048, "acceptanceLength": 2.35, "drafts": 280.0},
            {"contextLength": 4096},
        ],
    }
    assert status["export"]["uri"] == "pvc://llama-workspace/runs/uid-1/export/sha256-0123456789abcdef"
    assert status["export"]["digest"] == fakes.EXPORT_DIGEST
    assert fakes.condition(status, "Ready")["status"] == "True"
    assert fakes.condition(status, "TargetReady")["reason"] == "ScaledDown"
    assert cluster.observed.deployments["llama-target"]["spec"]["replicas"] == 0
    train = next(s for s in status["stages"] if s["name"] == "train")
    assert train["metrics"]["loss"] == 1.25


def test_stage_pods_get_gpus_and_rocm_settings_where_they_load_the_target():
    cluster = Cluster(fakes.draft_training(target={"model": "org/m", "gpus": 4}))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    plan = cluster.reconcile()
    extract = next(o for o in plan.create if o["metadata"]["name"] == "llama-extract")
    container = _container(extract)
    assert container["command"][:8] == ["eagle3", "extract", "--workspace", "/workspace/runs/uid-1", "--mode", "offline",
                                        "--target", "org/m"]  # fmt: skip
    assert container["resources"]["limits"] == {"amd.com/gpu": "4"}
    assert extract["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [44]
    # generation is done and nothing else needs the server: the target is scaled down
    target = next(o for o in plan.sync if o["kind"] == "Deployment")
    assert target["spec"]["replicas"] == 0
    assert "TargetScaledDown" in [e.reason for e in plan.events]


def test_second_reconcile_with_nothing_new_changes_nothing():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()
    cluster.reconcile()
    before = copy.deepcopy(cluster.body["status"])
    plan = cluster.reconcile()
    assert plan.status == before
    assert plan.events == [] and plan.delete == []


def test_streaming_runs_an_extraction_server_for_training_and_online_skips_extraction():
    cluster = Cluster(fakes.draft_training(hiddenStates={"mode": "streaming", "layerIds": [2, 8, 13]}))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    plan = cluster.reconcile()  # the target goes down, the streaming extraction server comes up
    deployments = {o["metadata"]["name"]: o for o in plan.sync if o["kind"] == "Deployment"}
    assert deployments["llama-target"]["spec"]["replicas"] == 0
    stream = deployments["llama-stream"]
    assert stream["spec"]["replicas"] == 1
    container = stream["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "eagle3", "extract", "--workspace", "/workspace/runs/uid-1", "--mode", "streaming", "--target",
        "meta-llama/Llama-3.1-8B-Instruct", "--layer-ids", "2,8,13", "--max-length", "2047", "--port", "8000",
        "--stream-port", "5600", "--vllm-arg=--tensor-parallel-size", "--vllm-arg=1",
    ]  # fmt: skip
    assert container["resources"]["limits"] == {"amd.com/gpu": "1"}
    service = next(o for o in plan.sync if o["kind"] == "Service" and o["metadata"]["name"] == "llama-stream")
    assert [p["port"] for p in service["spec"]["ports"]] == [8000, 5600]
    # Headless: reached at the pod's address, so each port is the container's own.
    assert service["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert [ports[p["targetPort"]] for p in service["spec"]["ports"]] == [8000, 5600]
    assert fakes.condition(plan.status, "Trained")["reason"] == "WaitingForStreamServer"
    plan = cluster.reconcile()  # the server is ready: the trainer starts and reads from it
    train = next(o for o in plan.create if o["kind"] == "Job")
    command = _container(train)["command"]
    assert command[command.index("--server") + 1] == "http://llama-stream:8000"
    for job in cluster.running_jobs():
        cluster.finish(job)
    plan = cluster.reconcile()
    stream = next(
        o for o in plan.sync if o["metadata"]["name"] == "llama-stream" and o["kind"] == "Deployment"
    )
    assert stream["spec"]["replicas"] == 0, "no stage after training needs the extraction server"
    assert "StreamServerScaledDown" in [e.reason for e in plan.events]

    online = Cluster(fakes.draft_training(hiddenStates={"mode": "online", "layerIds": [1, 5, 9]}))
    plan = online.run_to_end()
    assert "extract" not in [s["name"] for s in plan.status["stages"]]
    train_job = online.observed.jobs["llama-train"]
    command = _container(train_job)["command"]
    assert command[command.index("--layer-ids") + 1] == "1,5,9"
    assert command[command.index("--hidden-states") + 1] == "online"


def _two_node_training_after_generation(**training) -> tuple[Cluster, Plan]:
    """An online training on two nodes of 8 GPUs, generation done: the plan that starts the trainers."""
    body = fakes.draft_training(
        training={"steps": 100, "checkpointEvery": 50, "nodes": 2, "gpusPerNode": 8, **training},
        hiddenStates={"mode": "online"},
        storage={"accessModes": ["ReadWriteMany"]},
    )
    cluster = Cluster(body)
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    return cluster, cluster.reconcile()


def test_multi_node_training_uses_an_indexed_job_with_torchrun_and_a_headless_service():
    cluster, plan = _two_node_training_after_generation()
    train = next(o for o in plan.create if o["kind"] == "Job")
    assert train["spec"]["completionMode"] == "Indexed" and train["spec"]["completions"] == 2
    command = _container(train)["command"]
    assert command[:7] == ["torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=$(NODE_RANK)",
                           "--master-addr=llama-train-0.llama-trainer", "--master-port=29500", "--no-python"]  # fmt: skip
    assert command[7:9] == ["eagle3", "train"]
    assert train["spec"]["template"]["spec"]["subdomain"] == "llama-trainer"
    headless = next(
        o for o in plan.sync if o["kind"] == "Service" and o["metadata"]["name"] == "llama-trainer"
    )
    assert headless["spec"]["clusterIP"] == "None"
    assert _container(train)["resources"]["limits"]["amd.com/gpu"] == "8"


def test_the_trainer_overlay_sets_rccl_env_and_a_network_on_the_trainer_pods_alone():
    """training.env and training.podAnnotations reach the trainer ranks (over target.env and the operator's
    own entries, by name) and no other stage's pods; the RDMA NIC comes through training.resources."""
    cluster, plan = _two_node_training_after_generation(
        env=[{"name": "NCCL_SOCKET_IFNAME", "value": "net1"}, {"name": "VLLM_ROCM_USE_AITER", "value": "0"}],
        podAnnotations={"k8s.v1.cni.cncf.io/networks": "rdma-net"},
        resources={"limits": {"rdma/hca_shared_devices_a": "1"}},
    )
    train = next(o for o in plan.create if o["kind"] == "Job")
    env = {e["name"]: e.get("value") for e in _container(train)["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "net1" and env["VLLM_ROCM_USE_AITER"] == "0"
    assert len(_container(train)["env"]) == len(env)  # one entry per name
    template = train["spec"]["template"]
    assert template["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "rdma-net"}
    assert template["metadata"]["labels"][meta.STAGE_LABEL] == "train"
    limits = _container(train)["resources"]["limits"]
    assert limits == {"rdma/hca_shared_devices_a": "1", "amd.com/gpu": "8"}
    generate = cluster.observed.jobs["llama-generate"]
    assert "NCCL_SOCKET_IFNAME" not in {e["name"] for e in _container(generate)["env"]}
    assert "annotations" not in generate["spec"]["template"]["metadata"]


def test_a_failed_rank_restarts_the_whole_trainer_group_until_group_restarts_run_out():
    """A torchrun group cannot take back a recreated rank: one failed rank fails the Job (backoffLimit 0),
    and the operator starts the whole group again in a new Job, every rank resuming from the last
    checkpoint, groupRestarts times; then the training fails and says how often it restarted."""
    cluster, _ = _two_node_training_after_generation(groupRestarts=2)
    names = ["llama-train", "llama-train-r1", "llama-train-r2"]
    for restart, name in enumerate(names):
        job = cluster.observed.jobs[name]
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["completions"] == 2
        cluster.finish(
            job, ok=False, message="NCCL error: remote process exited", reason="Error", exit_code=1, index=1
        )
        plan = cluster.reconcile()
        train = next(s for s in plan.status["stages"] if s["name"] == "train")
        if restart < 2:
            assert plan.status["phase"] == "Running" and train["groupRestarts"] == restart + 1
            assert {"apiVersion": "batch/v1", "kind": "Job", "name": name} in plan.delete
            (event,) = [e for e in plan.events if e.reason == "TrainerGroupRestarted"]
            assert event.type == "Warning" and f"restart {restart + 1} of 2" in event.message
            assert "NCCL error: remote process exited" in event.message
            plan = cluster.reconcile()  # the requeue: the next group's Job
            assert [o["metadata"]["name"] for o in plan.create if o["kind"] == "Job"] == [names[restart + 1]]
    failed = fakes.condition(plan.status, "Failed")
    assert plan.status["phase"] == "Failed" and failed["status"] == "True"
    assert (
        "NCCL error" in failed["message"] and "(after 2 restarts of the trainer group)" in failed["message"]
    )


def test_a_single_node_trainer_and_other_stages_are_not_restarted_as_a_group():
    cluster = Cluster(fakes.draft_training(training={"steps": 100, "checkpointEvery": 50, "gpusPerNode": 8}))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-extract"])
    cluster.reconcile()
    train = cluster.observed.jobs["llama-train"]
    assert train["spec"]["backoffLimit"] == 2  # the pod retries of spec.runtime.backoffLimit
    cluster.finish(train, ok=False, message="CUDA out of memory", reason="Error", exit_code=1)
    plan = cluster.reconcile()
    assert plan.status["phase"] == "Failed" and not [
        e for e in plan.events if e.reason == "TrainerGroupRestarted"
    ]


def test_failed_stage_reports_the_pod_reason_and_message_then_retries_after_a_spec_edit():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()
    cluster.reconcile()
    job = cluster.observed.jobs["llama-generate"]
    message = fakes.result("generate", ok=False, message="source /sources/prompts/chat.jsonl: no such file")
    cluster.finish(job, ok=False, message=message, reason="Error", exit_code=2)
    plan = cluster.reconcile()
    failed = fakes.condition(plan.status, "Failed")
    assert plan.status["phase"] == "Failed"
    assert failed["status"] == "True" and failed["reason"] == "Error"
    assert "no such file" in failed["message"] and "exited with code 2" in failed["message"]
    assert [(e.type, e.reason) for e in plan.events] == [
        ("Warning", "StageFailed"),
        ("Normal", "TargetScaledDown"),
    ]
    # Nothing is retried until the spec changes.
    idle = cluster.reconcile()
    assert [o for o in idle.create if o["kind"] == "Job"] == [] and idle.events == []
    cluster.body["metadata"]["generation"] = 2
    cluster.body["spec"]["data"]["sources"][0]["path"] = "fixed.jsonl"
    plan = cluster.reconcile()
    assert plan.delete == [{"apiVersion": "batch/v1", "kind": "Job", "name": "llama-generate"}]
    assert "Retrying" in [e.reason for e in plan.events]
    assert fakes.condition(plan.status, "Failed")["status"] == "False"
    assert next(o for o in plan.sync if o["kind"] == "Deployment")["spec"]["replicas"] == 1, "target back up"
    plan = cluster.reconcile()
    assert [o["metadata"]["name"] for o in plan.create if o["kind"] == "Job"] == ["llama-generate-r1"]
    assert plan.status["phase"] == "Running"


def test_failure_without_a_stage_result_uses_the_log_tail():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(
        cluster.observed.jobs["llama-generate"],
        ok=False,
        message="Traceback ...\nOSError: disk full",
        reason="OOMKilled",
        exit_code=137,
    )
    status = cluster.reconcile().status
    assert fakes.condition(status, "Failed")["reason"] == "OOMKilled"
    assert "disk full" in fakes.condition(status, "Failed")["message"]


def test_missing_result_is_waited_for_then_fails():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()
    cluster.reconcile()
    job = cluster.observed.jobs["llama-generate"]
    cluster.observed.jobs["llama-generate"] = fakes.finished_job(job, ok=True)
    plan = cluster.reconcile()
    assert plan.status["phase"] == "Running" and plan.requeue_after
    cluster.observed.now = fakes.NOW.replace(minute=5)
    plan = cluster.reconcile()
    assert plan.status["phase"] == "Failed"
    assert fakes.condition(plan.status, "Failed")["reason"] == "StageResultMissing"


def test_minimum_acceptance_gate_fails_the_selection():
    cluster = Cluster(fakes.draft_training(evaluation={"minAcceptanceLength": 3.0}))
    plan = cluster.run_to_end()
    assert plan.status["phase"] == "Failed"
    assert fakes.condition(plan.status, "Failed")["reason"] == "AcceptanceBelowMinimum"
    assert "export" not in plan.status


def test_progress_annotation_is_copied_into_status():
    cluster = Cluster(fakes.draft_training())
    cluster.reconcile()
    cluster.reconcile()
    job = cluster.observed.jobs["llama-generate"]
    record = {"stage": "generate", "samples": 40, "etaSeconds": 12, "updatedAt": "2026-11-29T09:00:10Z"}
    cluster.observed.pods.append(
        fakes.job_pod(
            job, phase="Running", message=None, annotations={"eagle3.ai/progress": json.dumps(record)}
        )
    )
    status = cluster.reconcile().status
    assert status["progress"] == {
        "stage": "generate",
        "samples": 40,
        "etaSeconds": 12.0,
        "updatedAt": "2026-11-29T09:00:10Z",
    }


def test_queue_name_export_claim_and_quantize():
    body = fakes.draft_training(
        scheduling={"queueName": "gpu-queue"},
        export={"claimName": "drafts", "quantize": "fp8", "format": "speculators"},
        storage={"retainOnDelete": False},
    )
    cluster = Cluster(body)
    plan = cluster.run_to_end()
    assert plan.status["phase"] == "Succeeded"
    assert plan.status["export"]["uri"] == "pvc://drafts/llama/sha256-cdcdcdcdcdcdcdcd"
    jobs = cluster.observed.jobs
    assert jobs["llama-train"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert jobs["llama-train"]["spec"]["suspend"] is True
    export = _container(jobs["llama-export"])["command"]
    assert export[export.index("--output") + 1] == "/workspace/runs/uid-1/export"
    assert export[export.index("--format") + 1] == "speculators"
    quantize = _container(jobs["llama-quantize"])["command"]
    assert quantize[:8] == ["eagle3", "quantize", "--input", "/workspace/runs/uid-1/export/latest", "--output", "/export/llama",
                            "--scheme", "fp8"]  # fmt: skip
    first = plan_training(
        fakes.draft_training(storage={"retainOnDelete": False}), TrainingObserved(now=fakes.NOW)
    )
    pvc = next(o for o in first.create if o["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["ownerReferences"][0]["kind"] == "DraftTraining"


def _train_command(**spec) -> tuple[list[str], dict]:
    """The train Job's `eagle3 train` command and pod spec for a DraftTraining with `spec`."""
    cluster = Cluster(fakes.draft_training(hiddenStates={"mode": "online"}, **spec))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    cluster.reconcile()
    train = cluster.observed.jobs["llama-train"]
    return _container(train)["command"], train["spec"]["template"]["spec"]


def test_training_length_is_steps_or_epochs_and_defaults_to_2000_steps():
    command, _ = _train_command(training={})
    assert (fakes.flag(command, "--steps"), fakes.flag(command, "--epochs")) == ("2000", None)
    command, _ = _train_command(training={"steps": 300, "checkpointEvery": 100})
    assert (fakes.flag(command, "--steps"), fakes.flag(command, "--epochs")) == ("300", None)
    command, _ = _train_command(training={"epochs": 3})
    assert (fakes.flag(command, "--steps"), fakes.flag(command, "--epochs")) == (None, "3")


def test_draft_layers_and_scratch_start_by_default():
    command, _ = _train_command()
    assert fakes.flag(command, "--draft-layers") == "1" and "--init-checkpoint" not in command
    command, _ = _train_command(draft={"layers": 3})
    assert fakes.flag(command, "--draft-layers") == "3"


def test_warm_start_from_a_pvc_mounts_it_read_only_and_passes_the_mounted_path():
    command, pod = _train_command(
        draft={"initialization": {"from": "checkpoint", "path": "pvc://drafts/published/eagle3-head"}}
    )
    assert fakes.flag(command, "--init-checkpoint") == "/models/init/published/eagle3-head"
    volume = next(
        v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "drafts"
    )
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == "/models/init" and mount["readOnly"] is True
    command, _ = _train_command(draft={"initialization": {"from": "checkpoint", "path": "org/eagle3-head"}})
    assert fakes.flag(command, "--init-checkpoint") == "org/eagle3-head"  # a Hugging Face id, as is


def test_epochs_progress_shows_the_step_of_the_derived_total():
    cluster = Cluster(fakes.draft_training(hiddenStates={"mode": "online"}, training={"epochs": 2}))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    cluster.reconcile()
    train = cluster.observed.jobs["llama-train"]
    progress = {"stage": "train", "step": 40, "totalSteps": 96, "loss": 1.9}
    annotations = {"eagle3.ai/progress": json.dumps(progress)}
    cluster.observed.pods.append(fakes.job_pod(train, phase="Running", message=None, annotations=annotations))
    plan = cluster.reconcile()
    assert (plan.status["progress"]["step"], plan.status["progress"]["totalSteps"]) == (40, 96)


def test_trainer_jobs_keep_a_disrupted_pod_apart_from_a_crash_through_a_pod_failure_policy():
    """A multi-rank group cannot take a recreated rank back: a disrupted rank fails the Job at once
    (FailJob); a one-pod trainer's disrupted pod is recreated without spending backoffLimit (Ignore)."""
    disrupted = [{"type": "DisruptionTarget", "status": "True"}]
    _, plan = _two_node_training_after_generation()
    train = next(o for o in plan.create if o["kind"] == "Job")
    assert train["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert train["spec"]["podFailurePolicy"] == {
        "rules": [{"action": "FailJob", "onPodConditions": disrupted}]
    }
    single = Cluster(fakes.draft_training(training={"steps": 100, "checkpointEvery": 50}))
    single.run_to_end()
    jobs = single.observed.jobs
    assert jobs["llama-train"]["spec"]["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": disrupted}
    ]
    assert not [
        name for name, job in jobs.items() if name != "llama-train" and "podFailurePolicy" in job["spec"]
    ]


def stage_of(plan: Plan, stage: str) -> dict:
    return next(s for s in plan.status["stages"] if s["name"] == stage)


def _disrupt_rank(cluster: Cluster, name: str) -> None:
    """What the Job controller leaves when its FailJob rule matched an evicted rank's pod."""
    job = cluster.observed.jobs[name]
    cluster.finish(job, ok=False, message="", reason="Error", exit_code=143, index=1)
    failed = cluster.observed.jobs[name]["status"]["conditions"][0]
    failed |= {
        "reason": "PodFailurePolicy",
        "message": f"Pod ns/{name}-1-abcde has condition DisruptionTarget matching FailJob rule at index 0",
    }


def test_a_disrupted_rank_restarts_the_group_without_spending_group_restarts_up_to_its_own_cap():
    cluster, _ = _two_node_training_after_generation(groupRestarts=1, disruptionRestarts=2)
    names = ["llama-train", "llama-train-r1", "llama-train-r2", "llama-train-r3"]
    for restart, name in enumerate(names[:2]):
        _disrupt_rank(cluster, name)
        plan = cluster.reconcile()
        train = stage_of(plan, "train")
        assert plan.status["phase"] == "Running" and train["disruptionRestarts"] == restart + 1
        assert "groupRestarts" not in train and train["jobs"] == []
        (event,) = [e for e in plan.events if e.reason == "RankDisrupted"]
        assert f"disruption restart {restart + 1} of 2 (groupRestarts unspent)" in event.message
        assert f"Pod ns/{name}-1-abcde has condition DisruptionTarget" in event.message
        assert not [e for e in plan.events if e.reason == "TrainerGroupRestarted"]
        plan = cluster.reconcile()
        assert [o["metadata"]["name"] for o in plan.create if o["kind"] == "Job"] == [names[restart + 1]]
    # Past disruptionRestarts a disruption spends groupRestarts like a crash, then the training fails.
    _disrupt_rank(cluster, "llama-train-r2")
    plan = cluster.reconcile()
    train = stage_of(plan, "train")
    assert (train["disruptionRestarts"], train["groupRestarts"]) == (2, 1)
    assert [e.reason for e in plan.events if e.reason in ("RankDisrupted", "TrainerGroupRestarted")] == [
        "TrainerGroupRestarted"
    ]
    cluster.reconcile()
    _disrupt_rank(cluster, "llama-train-r3")
    plan = cluster.reconcile()
    assert plan.status["phase"] == "Failed"


def test_a_rank_that_failed_before_its_disrupted_peer_ended_still_counts_as_a_disruption():
    """The surviving rank can fail first (BackoffLimitExceeded): the evicted pod, still terminating,
    carries the DisruptionTarget condition the API server gave it."""
    cluster, _ = _two_node_training_after_generation(groupRestarts=0)
    job = cluster.observed.jobs["llama-train"]
    cluster.finish(job, ok=False, message="NCCL error: remote process exited", reason="Error", exit_code=1)
    evicted = fakes.job_pod(job, phase="Running", message=None, index=1)
    evicted["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
    ]
    cluster.observed.pods.append(evicted)
    plan = cluster.reconcile()
    train = stage_of(plan, "train")
    assert plan.status["phase"] == "Running" and train["disruptionRestarts"] == 1
    (event,) = [e for e in plan.events if e.reason == "RankDisrupted"]
    assert (
        "pod llama-train-1-abcde was disrupted (EvictionByEvictionAPI: Eviction API: evicting)"
        in event.message
    )


def test_a_crash_of_a_rank_still_spends_group_restarts():
    cluster, _ = _two_node_training_after_generation(groupRestarts=0)
    job = cluster.observed.jobs["llama-train"]
    cluster.finish(job, ok=False, message="Traceback: ValueError", reason="Error", exit_code=1, index=1)
    plan = cluster.reconcile()
    assert plan.status["phase"] == "Failed" and "disruptionRestarts" not in stage_of(plan, "train")
    assert not [e for e in plan.events if e.reason == "RankDisrupted"]


def test_a_disruption_seen_while_the_group_ran_counts_when_the_evicted_pod_is_gone_at_its_failure():
    """The evicted pod can be gone when the surviving rank's failure fails the Job: the record keeps
    the disruption a reconcile saw while the group ran, and the next group starts without it."""
    cluster, _ = _two_node_training_after_generation(groupRestarts=0)
    job = cluster.observed.jobs["llama-train"]
    evicted = fakes.job_pod(job, phase="Running", message=None, index=1)
    evicted["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
    ]
    cluster.observed.pods.append(evicted)
    plan = cluster.reconcile()
    noted = "pod llama-train-1-abcde was disrupted (PreemptionByScheduler)"
    assert plan.status["phase"] == "Running" and stage_of(plan, "train")["disruption"] == noted
    cluster.observed.pods.remove(evicted)
    cluster.finish(job, ok=False, message="gloo: connection closed by peer", reason="Error", exit_code=1)
    plan = cluster.reconcile()
    train = stage_of(plan, "train")
    assert (
        plan.status["phase"] == "Running" and train["disruptionRestarts"] == 1 and "disruption" not in train
    )
    (event,) = [e for e in plan.events if e.reason == "RankDisrupted"]
    assert noted in event.message
