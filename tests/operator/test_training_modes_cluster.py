"""DraftTraining features beyond the offline pipeline, on the test bed: the operator (a real process)
against the real API server, Job controller, EndpointSlice controller and scheduler (kwok pods), then
the operator's own Jobs, Deployments and Services replayed on the real node where their pods can run
cheaply.

Stage pods on kwok end with the harness's stage results (tests/operator/fakes.py, stage_report).
Kueue is not installed: the real Job controller honours `suspend`, and the test unsuspends the
operator's Jobs itself, as Kueue does when it admits them. On the real node the objects keep the
operator's pod spec (env, probes, volumes, security context, hostname and subdomain) and Service
ports, and only the command is replaced by a tiny one (no vLLM, no training runs there; the
multi-node trainer keeps the operator's torchrun launcher and replaces only the program it starts).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from eagle3_api.workspace import export_version
from tests.operator import fakes
from tests.operator.harness import (
    admit_like_kueue,
    bind_volume,
    complete_stage,
    condition,
    draft_training_path,
    events_of,
    get,
    items,
    jobs_of,
    prepare_training_volumes,
    stage_record,
    start_two_rank_training,
    training_body,
    wait_for_phase,
    wait_for_stage_pods,
    wait_stage_succeeded,
)
from tests.support import realnode
from tests.support.cluster import LocalCluster, wait_until

REAL_POD_TIMEOUT_S = 120


def _deployment(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    return get(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")


def _replicas(cluster: LocalCluster, ns: str, name: str) -> int | None:
    found = _deployment(cluster, ns, name)
    return None if found is None else found["spec"].get("replicas", 1)


def _long_flag(command: list[str], flag: str) -> str:
    """The value of a `--flag=value` word (torchrun's style)."""
    return next(word.split("=", 1)[1] for word in command if word.startswith(f"{flag}="))


def _port(service: dict[str, Any], name: str) -> int:
    return next(p["port"] for p in service["spec"]["ports"] if p["name"] == name)


def _endpoint_slices(cluster: LocalCluster, ns: str, service: str) -> list[dict[str, Any]]:
    return items(
        cluster,
        f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
        f"kubernetes.io/service-name={service}",
    )


def test_streaming_feeds_the_trainer_from_its_server_and_the_gate_fails_a_weak_draft(
    crds, manual_namespace, real_node_namespace, start_operator
):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    start_operator(ns)
    body = training_body(
        ns,
        hiddenStates={"mode": "streaming", "layerIds": [2, 8, 13]},
        evaluation={"minAcceptanceLength": 3.0},
    )
    cluster.request("POST", draft_training_path(ns), body)

    complete_stage(cluster, ns, "generate", ["llama-generate"])
    wait_stage_succeeded(cluster, ns, "llama", "generate")
    # The target goes down and the streaming extraction server comes up in its place.
    wait_until(lambda: _replicas(cluster, ns, "llama-target") == 0, timeout=30, what="target scaled down")
    wait_until(lambda: _replicas(cluster, ns, "llama-stream") == 1, timeout=30, what="stream server up")
    stream = _deployment(cluster, ns, "llama-stream")
    (container,) = stream["spec"]["template"]["spec"]["containers"]
    uid = cluster.request("GET", draft_training_path(ns, "llama"))["metadata"]["uid"]
    assert container["command"][:6] == [
        "eagle3",
        "extract",
        "--workspace",
        f"/workspace/runs/{uid}",
        "--mode",
        "streaming",
    ]
    assert fakes.flag(container["command"], "--layer-ids") == "2,8,13"
    # The real EndpointSlice controller lists the server pod under both of the Service's ports.
    slices = wait_until(
        lambda: [s for s in _endpoint_slices(cluster, ns, "llama-stream") if s.get("endpoints")],
        timeout=30,
        what="endpoints of the stream Service",
    )
    assert sorted((p["name"], p["port"]) for p in slices[0]["ports"]) == [("http", 8000), ("stream", 5600)]

    train = wait_until(lambda: jobs_of(cluster, ns, "llama").get("llama-train"), timeout=30, what="train Job")
    assert fakes.flag(fakes.command(train), "--server") == "http://llama-stream:8000"
    assert "llama-extract" not in jobs_of(cluster, ns, "llama"), "streaming has no extract stage"
    service = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/llama-stream")
    _check_trainer_reaches_the_stream_server_on_the_real_node(
        cluster, real_node_namespace, stream, service, train
    )
    complete_stage(cluster, ns, "train", ["llama-train"])
    wait_stage_succeeded(cluster, ns, "llama", "train")
    wait_until(
        lambda: _replicas(cluster, ns, "llama-stream") == 0, timeout=30, what="stream server scaled down"
    )

    for stage, jobs in (("evaluate", ["llama-eval-50", "llama-eval-100"]), ("select", ["llama-select"])):
        complete_stage(cluster, ns, stage, jobs)
    failed = wait_for_phase(cluster, ns, "llama", "Failed")  # at the acceptance gate
    gate = condition(failed, "Failed")
    assert gate["reason"] == "AcceptanceBelowMinimum", gate
    assert "acceptance length 2.4, below evaluation.minAcceptanceLength 3.0" in gate["message"]
    assert stage_record(failed, "select")["state"] == "Failed" and "export" not in failed["status"]
    assert condition(failed, "Ready")["status"] == "False"
    # Events follow the status patch.
    wait_until(
        lambda: (
            {"StreamServerScaledDown", "StageFailed"}
            <= {e["reason"] for e in events_of(cluster, ns, "llama")}
        ),
        timeout=10,
        what="the StreamServerScaledDown and StageFailed Events",
    )
    assert "llama-export" not in jobs_of(cluster, ns, "llama"), "a draft below the gate is not exported"


ONLINE_STAGE_JOBS = [
    ("generate", ["llama-generate"]),
    ("train", ["llama-train"]),
    ("evaluate", ["llama-eval-50", "llama-eval-100"]),
    ("select", ["llama-select"]),
    ("export", ["llama-export"]),
    ("quantize", ["llama-quantize"]),
]


def _run_online_multi_node_training(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    """Online hidden states, two trainer nodes, a Kueue queue, a warm start from the claim
    `published` and an fp8 export to the claim `drafts`, driven to success; returns the Jobs."""
    prepare_training_volumes(cluster, ns)
    for claim in ("published", "drafts"):
        bind_volume(cluster, ns, claim, create_claim=True)
    body = training_body(
        ns,
        hiddenStates={"mode": "online", "layerIds": [1, 5, 9]},
        training={"steps": 100, "checkpointEvery": 50, "nodes": 2, "gpusPerNode": 1},
        storage={"accessModes": ["ReadWriteMany"]},
        scheduling={"queueName": "gpu-queue"},
        draft={"initialization": {"from": "checkpoint", "path": "pvc://published/eagle3-head"}},
        export={"claimName": "drafts", "quantize": "fp8"},
    )
    cluster.request("POST", draft_training_path(ns), body)
    for stage, jobs in ONLINE_STAGE_JOBS:
        for job in jobs:
            admit_like_kueue(cluster, ns, job)
        if stage == "train":
            _check_indexed_training(cluster, ns)
        complete_stage(cluster, ns, stage, jobs)
        done = wait_stage_succeeded(cluster, ns, "llama", stage)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert [s["name"] for s in done["status"]["stages"]] == [s for s, _ in ONLINE_STAGE_JOBS]
    assert done["status"]["export"]["uri"] == f"pvc://drafts/llama/{export_version(fakes.QUANTIZE_DIGEST)}"
    assert done["status"]["export"]["quantization"] == "fp8"
    assert condition(done, "Quantized")["status"] == "True"
    return jobs_of(cluster, ns, "llama")


def _check_indexed_training(cluster: LocalCluster, ns: str) -> None:
    """Two trainer pods of one Indexed Job, each with its index, hostname and the headless
    Service's subdomain, published by the real EndpointSlice controller under their hostnames."""
    pods = wait_for_stage_pods(cluster, ns, ["llama-train"])["llama-train"]
    by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    for index, pod in by_index.items():
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == (
            f"llama-train-{index}",
            "llama-trainer",
        )
    service = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/llama-trainer")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    wait_until(
        lambda: (
            sorted(
                e.get("hostname", "")
                for s in _endpoint_slices(cluster, ns, "llama-trainer")
                for e in s.get("endpoints") or []
            )
            == ["llama-train-0", "llama-train-1"]
        ),
        timeout=30,
        what="both trainer pods, by hostname, in the headless Service's EndpointSlice",
    )


def test_online_multi_node_training_queued_warm_started_and_exported_to_a_claim(
    crds, manual_namespace, real_node_namespace, start_operator, tmp_path
):
    cluster, ns = crds, manual_namespace
    start_operator(ns)
    jobs = _run_online_multi_node_training(cluster, ns)
    assert "llama-extract" not in jobs, "online training extracts nothing ahead of time"

    train = jobs["llama-train"]
    assert (train["spec"]["completionMode"], train["spec"]["completions"], train["spec"]["parallelism"]) == (
        "Indexed",
        2,
        2,
    )
    command = fakes.command(train)
    assert command[:4] == ["torchrun", "--nnodes=2", "--nproc-per-node=1", "--node-rank=$(NODE_RANK)"]
    assert _long_flag(command, "--master-addr") == "llama-train-0.llama-trainer"
    assert (
        fakes.flag(command, "--hidden-states") == "online" and fakes.flag(command, "--layer-ids") == "1,5,9"
    )
    assert fakes.flag(command, "--init-checkpoint") == "/models/init/eagle3-head"
    quantize = jobs["llama-quantize"]
    uid = quantize["metadata"]["ownerReferences"][0]["uid"]
    assert fakes.command(quantize)[:8] == ["eagle3", "quantize", "--input", f"/workspace/runs/{uid}/export/latest",
                                      "--output", "/export/llama", "--scheme", "fp8"]  # fmt: skip

    # The same Jobs' pods on the real node.
    real = real_node_namespace
    service = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/llama-trainer")
    _check_trainers_meet_on_the_real_node(cluster, real, train, service, tmp_path)
    _check_quantize_writes_the_export_claim_on_the_real_node(cluster, real, quantize)


def _on_real_node(template: dict[str, Any], command: list[str]) -> dict[str, Any]:
    """An operator-built pod template for the real node: its pod spec with the real node's selector
    and toleration and `command`; labels the Job controller added are left out."""
    template = copy.deepcopy(template)
    labels = template["metadata"]["labels"]
    for key in [
        k for k in labels if k.startswith("batch.kubernetes.io/") or k in ("controller-uid", "job-name")
    ]:
        del labels[key]
    template["spec"] = realnode.on_real_node(template["spec"])
    template["spec"]["terminationGracePeriodSeconds"] = 1
    template["spec"]["containers"][0]["command"] = command
    return template


def _real_node_job(job: dict[str, Any], command: list[str]) -> dict[str, Any]:
    """The operator's Job as it created it, for the real node (see _on_real_node), unsuspended;
    fields the API server and Job controller filled in are left out."""
    spec = {
        k: v
        for k, v in job["spec"].items()
        if k not in ("selector", "template", "suspend", "podReplacementPolicy")
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job["metadata"]["name"], "labels": job["metadata"]["labels"]},
        "spec": spec | {"template": _on_real_node(job["spec"]["template"], command)},
    }


def _real_node_service(service: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The operator's Service as it created it, with only `fields` of its spec (no allocated IPs)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service["metadata"]["name"], "labels": service["metadata"]["labels"]},
        "spec": {k: service["spec"][k] for k in fields},
    }


def _fresh_claim(cluster: LocalCluster, ns: str, name: str) -> None:
    """A claim of the real node's storage class: a new root-owned directory, like a new disk."""
    cluster.request(
        "POST",
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
        {
            "metadata": {"name": name},
            "spec": {
                "storageClassName": realnode.STORAGE_CLASS,
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def _finished_job_logs(cluster: LocalCluster, ns: str, name: str, pods: int) -> dict[str, str]:
    """Pod name -> log once the Job has `pods` pods and each ended (Failed pods fail the test)."""

    def ended() -> list[dict[str, Any]] | None:
        found = items(cluster, f"/api/v1/namespaces/{ns}/pods", f"batch.kubernetes.io/job-name={name}")
        phases = [p["status"].get("phase") for p in found]
        return found if len(found) >= pods and all(p in ("Succeeded", "Failed") for p in phases) else None

    found = wait_until(
        ended, timeout=REAL_POD_TIMEOUT_S, interval=1, what=f"the pods of {name} on the real node"
    )
    logs = {p["metadata"]["name"]: cluster.kubectl("logs", "-n", ns, p["metadata"]["name"]) for p in found}
    assert all(p["status"]["phase"] == "Succeeded" for p in found), json.dumps(logs, indent=1)
    return logs


# What the operator's torchrun starts on each trainer node instead of `eagle3 train`: it reads the
# warm-start checkpoint through the read-only mount, joins the process group that torchrun's static
# rendezvous set up (rank 0's store, reached by the headless Service's DNS name in --master-addr) and
# sums the ranks over gloo.
WORKER_SCRIPT = """
import os, sys, torch, torch.distributed as dist
init = sys.argv[1]
print("init", open(os.path.join(init, "config.json")).read().strip())
try:
    open(os.path.join(init, "new"), "w")
    print("init writable")
except OSError as error:
    print("init", error.strerror)
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "via", os.environ["MASTER_ADDR"], "sum", total.item())
# Leave together, as `eagle3 train` does (DistributedContext.close): a rank that exits with its gloo
# group alive can abort in interpreter teardown ("terminate called without an active exception",
# seen once in CI), which fails its pod and its peer's torchrun exit barrier.
dist.barrier()
dist.destroy_process_group()
"""


def _check_trainers_meet_on_the_real_node(
    cluster: LocalCluster, ns: str, train: dict[str, Any], service: dict[str, Any], tmp_path: Path
) -> None:
    """The operator's torchrun launcher, as it wrote it ($(NODE_RANK) expanded by the kubelet from
    the completion index), runs a tiny worker in both pods of the Indexed Job."""
    published = tmp_path / "published"
    (published / "eagle3-head").mkdir(parents=True)
    for folder in (tmp_path, published, published / "eagle3-head"):
        folder.chmod(0o755)  # readable by the stage pods' uid 1000
    (published / "eagle3-head" / "config.json").write_text('{"draft": "eagle3"}')
    cluster.real_node.host_path_claim(cluster, ns, "published", published)
    _fresh_claim(cluster, ns, "llama-workspace")
    headless = _real_node_service(service, ("clusterIP", "publishNotReadyAddresses", "selector", "ports"))
    cluster.request("POST", f"/api/v1/namespaces/{ns}/services", headless)
    command = fakes.command(train)
    launcher = command[: command.index("--no-python") + 1]
    worker = ["python3", "-c", WORKER_SCRIPT, fakes.flag(command, "--init-checkpoint")]
    cluster.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", _real_node_job(train, launcher + worker))

    logs = _finished_job_logs(cluster, ns, "llama-train", pods=2)
    pods = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["metadata"]["name"]
        for p in items(cluster, f"/api/v1/namespaces/{ns}/pods", "batch.kubernetes.io/job-name=llama-train")
    }
    master = _long_flag(command, "--master-addr")
    for index in ("0", "1"):
        printed = [line for line in logs[pods[index]].splitlines() if line.startswith(("init ", "rank "))]
        assert printed == [
            'init {"draft": "eagle3"}',
            "init Read-only file system",
            f"rank {index} of 2 via {master} sum 3",
        ], logs[pods[index]]
    assert not (published / "eagle3-head" / "new").exists()


EXPORT_SCRIPT = """
import os, sys
output = sys.argv[1]
os.makedirs(output)
with open(os.path.join(output, "config.json"), "w") as f:
    f.write("quantized")
print("wrote", output, "as", os.getuid())
"""


def _check_quantize_writes_the_export_claim_on_the_real_node(
    cluster: LocalCluster, ns: str, quantize: dict[str, Any]
) -> None:
    """The quantize Job's pod, non-root, writes its output into a fresh (root-owned) export claim."""
    _fresh_claim(cluster, ns, "drafts")
    output = fakes.flag(fakes.command(quantize), "--output")
    job = _real_node_job(quantize, ["python3", "-c", EXPORT_SCRIPT, output])
    cluster.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job)
    (log,) = _finished_job_logs(cluster, ns, "llama-quantize", pods=1).values()
    assert log.strip() == f"wrote {output} as {realnode.RUNTIME_UID}", log
    claim = cluster.request("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/drafts")
    volume = cluster.request("GET", f"/api/v1/persistentvolumes/{claim['spec']['volumeName']}")
    written = Path(volume["spec"]["local"]["path"]) / output.removeprefix("/export/") / "config.json"
    assert written.read_text() == "quantized"


# The stream server's stand-in: /health on the operator's --port (its probes' port "http") and a zmq
# PUSH socket on its --stream-port, as `eagle3 extract --mode streaming` binds them.
STREAM_SERVER_SCRIPT = """
import http.server, socket, sys, threading, zmq
port, stream_port = int(sys.argv[1]), int(sys.argv[2])
push = zmq.Context.instance().socket(zmq.PUSH)
push.bind(f"tcp://*:{stream_port}")
threading.Thread(target=lambda: push.send_multipart([b"states from", socket.gethostname().encode()]), daemon=True).start()

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

http.server.ThreadingHTTPServer(("", port), Health).serve_forever()
"""
# The trainer's side: the server's /health at the operator's --server URL, then a zmq PULL socket on
# the stream port of that URL's host (eagle3_runtime/extract/streaming.py connects the same way).
STREAM_CLIENT_SCRIPT = """
import sys, time, urllib.request, urllib.parse, zmq
server, stream_port = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 100
while True:
    try:
        status = urllib.request.urlopen(server + "/health", timeout=5).status
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(1)
print("health", status)
pull = zmq.Context.instance().socket(zmq.PULL)
pull.setsockopt(zmq.RCVTIMEO, 60000)
pull.connect(f"tcp://{urllib.parse.urlsplit(server).hostname}:{stream_port}")
print(*(frame.decode() for frame in pull.recv_multipart()))
"""


def _check_trainer_reaches_the_stream_server_on_the_real_node(
    cluster: LocalCluster,
    ns: str,
    stream: dict[str, Any],
    service: dict[str, Any],
    train: dict[str, Any],
) -> None:
    """The operator's stream server Deployment and Service and its train Job on the real node: the
    server becomes Ready through its own probes and the trainer reaches both of its ports through
    the Service's name (headless: DNS answers with the pod's address)."""
    _fresh_claim(cluster, ns, "llama-workspace")
    cluster.request(
        "POST",
        f"/api/v1/namespaces/{ns}/services",
        _real_node_service(service, ("clusterIP", "selector", "ports")),
    )
    server_command = fakes.command(stream)
    port, stream_port = fakes.flag(server_command, "--port"), fakes.flag(server_command, "--stream-port")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": stream["metadata"]["name"], "labels": stream["metadata"]["labels"]},
        "spec": {k: stream["spec"][k] for k in ("selector", "strategy")}
        | {
            "replicas": 1,
            "template": _on_real_node(
                stream["spec"]["template"], ["python3", "-c", STREAM_SERVER_SCRIPT, port, stream_port]
            ),
        },
    }
    cluster.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment)
    server = fakes.flag(fakes.command(train), "--server")
    client = ["python3", "-c", STREAM_CLIENT_SCRIPT, server, str(_port(service, "stream"))]
    cluster.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", _real_node_job(train, client))
    (log,) = _finished_job_logs(cluster, ns, "llama-train", pods=1).values()
    (server_pod,) = items(cluster, f"/api/v1/namespaces/{ns}/pods", "app.kubernetes.io/component=stream")
    assert log.splitlines() == ["health 200", f"states from {server_pod['metadata']['name']}"], log


def test_a_failed_rank_restarts_the_whole_trainer_group(crds, manual_namespace, start_operator):
    """One trainer rank fails: the real Job controller fails the Indexed Job at once (backoffLimit 0)
    and stops the other rank, which would otherwise wait for its lost peer until the collective
    timeout; the operator starts the whole group again in a new Job (every rank resumes from the last
    checkpoint on the shared workspace), which completes the training."""
    cluster, ns = crds, manual_namespace
    start_operator(ns)
    ranks = start_two_rank_training(cluster, ns)
    cluster.fail_pod(ns, ranks["1"]["metadata"]["name"], message="NCCL error: remote process exited")

    wait_until(
        lambda: "llama-train-r1" in jobs_of(cluster, ns, "llama"), timeout=120, what="the group's new Job"
    )
    admit_like_kueue(cluster, ns, "llama-train-r1")  # Kueue admits the new group as a whole again
    wait_until(
        lambda: (
            not items(cluster, f"/api/v1/namespaces/{ns}/pods", "batch.kubernetes.io/job-name=llama-train")
        ),
        timeout=120,
        what="the failed group's pods gone, rank 0's too",
    )
    complete_stage(cluster, ns, "train", ["llama-train-r1"])  # both ranks: it waits for both to run
    done = wait_stage_succeeded(cluster, ns, "llama", "train")
    record = stage_record(done, "train")
    assert (record["groupRestarts"], record["attempt"], record["jobs"]) == (1, 1, ["llama-train-r1"])
    (event,) = [e for e in events_of(cluster, ns, "llama") if e["reason"] == "TrainerGroupRestarted"]
    assert event["type"] == "Warning" and "NCCL error: remote process exited" in event["message"]
