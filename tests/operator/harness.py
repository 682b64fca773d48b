"""Running the operator against the test bed, and the test's share of the cluster (volumes, pods).

The operator runs as its own process (`python -m eagle3_operator.main`), exactly as in a pod,
so a restart is a real restart.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from eagle3_operator.reconcile.training_children import stage_jobs
from prometheus_client.parser import text_string_to_metric_families

from eagle3_api.draft_training import DraftTraining
from eagle3_runtime.vllm_server import free_port
from tests.operator import fakes
from tests.support.cluster import ApiError, LocalCluster, wait_until

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
GROUP_PATH = "/apis/eagle3.ai/v1alpha1"
# Leader-election arguments with short Lease timings (the defaults are 15 / 10 / 2 s): a quick takeover.
SHORT_LEASE = (
    "--leader-elect-lease-duration",
    "4",
    "--leader-elect-renew-deadline",
    "3",
    "--leader-elect-retry-period",
    "1",
)
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE"}
WATCHED_RESOURCES = {
    "drafttrainings",
    "specdecodedeployments",
    "jobs",
    "pods",
    "deployments",
    "services",
    "persistentvolumeclaims",
    "events",
    "servicemonitors",
    "podmonitors",
}


def install_crds(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    for crd in ("drafttrainings.eagle3.ai", "specdecodedeployments.eagle3.ai"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")


class OperatorProcess:
    """The operator as a subprocess watching the given namespaces; logs go to a file."""

    def __init__(
        self, cluster: LocalCluster, namespaces: list[str], log_path: Path, extra_args: tuple[str, ...] = ()
    ):
        self.cluster = cluster
        self.namespaces = namespaces
        self.log_path = log_path
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.starts = 0

    def start(self) -> OperatorProcess:
        self.metrics_port, liveness_port = free_port(), free_port()
        env = self.cluster.env() | {"PYTHONPATH": f"{REPO / 'operator'}{os.pathsep}{REPO}"}
        args = [sys.executable, "-m", "eagle3_operator.main", "--bind-address", "127.0.0.1",
                "--metrics-port", str(self.metrics_port), "--liveness-port", str(liveness_port)]  # fmt: skip
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        args += self.extra_args
        log = self.log_path.open("ab")
        log.write(f"\n===== operator start {self.starts + 1} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.starts += 1

        def alive() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{liveness_port}/healthz", timeout=2
                ) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(alive, timeout=60, interval=0.3, what="operator liveness endpoint")
        return self

    def wait_watching(self, timeout: float = 60) -> float:
        """Until the API server holds a namespace-scoped watch of every kind the operator watches;
        how long that took. The liveness endpoint answers before, and an object created in between
        waits for the watch (about 1.3 s on the test bed, where a custom resource's storage is
        still initialising just after its CRD is installed). Any namespaced watch of a kind counts:
        call this before opening one's own."""
        from eagle3_operator.handlers import WATCHED  # registers kopf handlers here, never run

        wanted = {plural for _, _, plural, *_ in WATCHED}
        started = time.monotonic()
        wait_until(
            lambda: wanted <= namespaced_watches(self.cluster),
            timeout=timeout,
            interval=0.2,
            what="the operator's watches at the API server",
        )
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release (a crashed node, an OOM kill)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, metric_name: str, /, **labels: str) -> float:
        """Sum of the samples of one metric whose labels include these."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.metrics().items() if n == metric_name and want <= set(ls))


def apiserver_writes(cluster: LocalCluster, resources: set[str] = WATCHED_RESOURCES) -> Counter[str]:
    """Write requests the API server has served for these resources since it started (its own metric),
    by "verb resource[/subresource]"."""
    text = cluster.kubectl("get", "--raw", "/metrics")
    writes: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name != "apiserver_request_total" or labels.get("verb") not in WRITE_VERBS:
                continue
            if labels.get("resource") in resources:
                sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
                writes[f"{labels['verb']} {labels['resource']}{sub}"] += int(sample.value)
    return writes


def namespaced_watches(cluster: LocalCluster) -> set[str]:
    """Resources with a namespace-scoped watch open at the API server (its own gauge)."""
    text = cluster.kubectl("get", "--raw", "/metrics")
    return {
        sample.labels["resource"]
        for family in text_string_to_metric_families(text)
        if family.name == "apiserver_longrunning_requests"
        for sample in family.samples
        if sample.labels.get("verb") == "WATCH"
        and sample.labels.get("scope") == "namespace"
        and sample.value >= 1
    }


def bind_volume(cluster: LocalCluster, namespace: str, claim: str, *, create_claim: bool) -> None:
    """A hostPath PV pre-bound to the claim: the test bed has no volume provisioner."""
    cluster.request(
        "POST",
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{claim}"},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                "hostPath": {"path": f"/tmp/eagle3-tests/{namespace}/{claim}"},
                "claimRef": {"namespace": namespace, "name": claim},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        },
    )
    if create_claim:
        cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
            {
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                },
            },
        )


def get(cluster: LocalCluster, path: str) -> dict[str, Any] | None:
    try:
        return cluster.request("GET", path)
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def draft_training_path(namespace: str, name: str = "") -> str:
    return f"{GROUP_PATH}/namespaces/{namespace}/drafttrainings" + (f"/{name}" if name else "")


def spec_decode_path(namespace: str, name: str = "") -> str:
    return f"{GROUP_PATH}/namespaces/{namespace}/specdecodedeployments" + (f"/{name}" if name else "")


def items(cluster: LocalCluster, path: str, selector: str) -> list[dict[str, Any]]:
    return cluster.request("GET", f"{path}?labelSelector={selector}")["items"]


def jobs_of(cluster: LocalCluster, namespace: str, training: str) -> dict[str, dict[str, Any]]:
    found = items(
        cluster, f"/apis/batch/v1/namespaces/{namespace}/jobs", f"eagle3.ai/draft-training={training}"
    )
    return {j["metadata"]["name"]: j for j in found}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def running_pods_of_job(cluster: LocalCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    pods = items(cluster, f"/api/v1/namespaces/{namespace}/pods", f"batch.kubernetes.io/job-name={job}")
    return [p for p in pods if p["status"].get("phase") == "Running"]


def admit_like_kueue(
    cluster: LocalCluster,
    namespace: str,
    job_name: str,
    *,
    training: str = "llama",
    flavor: dict | None = None,
) -> None:
    """Kueue's part: the operator's Job waits suspended, with no pods, until admitted; the test then
    unsuspends it. `flavor` (nodeSelector and tolerations, as a Kueue ResourceFlavor's nodeLabels and
    tolerations) is injected into the pod template at admission, as Kueue does: the API server allows
    that change of a suspended Job that never ran."""

    def suspended() -> dict[str, Any] | None:
        job = jobs_of(cluster, namespace, training).get(job_name)
        conditions = (job or {}).get("status", {}).get("conditions") or []
        return job if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions) else None

    job = wait_until(suspended, timeout=30, what=f"{job_name} suspended by the Job controller")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    pods = items(cluster, f"/api/v1/namespaces/{namespace}/pods", f"batch.kubernetes.io/job-name={job_name}")
    assert pods == [], f"a suspended Job made pods: {[p['metadata']['name'] for p in pods]}"
    patch: dict[str, Any] = {"spec": {"suspend": False}}
    if flavor:
        template = job["spec"]["template"]["spec"]
        patch["spec"]["template"] = {
            "spec": {
                "nodeSelector": {**template.get("nodeSelector", {}), **flavor["nodeSelector"]},
                "tolerations": [*template.get("tolerations", []), *flavor["tolerations"]],
            }
        }
    cluster.request("PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/{job_name}", patch)


STAGE_JOBS = [
    ("generate", ["generate"]),
    ("extract", ["extract"]),
    ("train", ["train"]),
    ("evaluate", ["eval-50", "eval-100"]),
    ("select", ["select"]),
    ("export", ["export"]),
]


def wait_for_stage_pods(
    cluster: LocalCluster, namespace: str, jobs: list[str], *, timeout: float = 60
) -> dict[str, list[dict]]:
    """Each Job's Running pods, once as many run as its spec.parallelism: the scheduler and kwok
    start a multi-pod Job's pods one by one, and a pod left Running would keep its Job from ever
    completing."""

    def ready() -> dict[str, list[dict]] | None:
        pods = {}
        for job in jobs:
            found = get(cluster, f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}")
            running = running_pods_of_job(cluster, namespace, job)
            if found is None or not running or len(running) < found["spec"].get("parallelism", 1):
                return None
            pods[job] = running
        return pods

    return wait_until(ready, timeout=timeout, interval=0.3, what=f"all running pods of {jobs}")


def trainer_ranks(cluster: LocalCluster, namespace: str, job: str) -> dict[str, dict[str, Any]]:
    """The running pods of a multi-rank trainer Job, by completion index ("0", "1", ...)."""
    pods = wait_for_stage_pods(cluster, namespace, [job])[job]
    return {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}


def start_two_rank_training(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    """A DraftTraining `llama` whose trainer is a 2-rank group (online states, Kueue-queued, one
    group restart allowed) driven to its first trainer Job; returns that Job's ranks (trainer_ranks).
    The operator must be running in `namespace`."""
    prepare_training_volumes(cluster, namespace)
    body = training_body(
        namespace,
        hiddenStates={"mode": "online", "layerIds": [1, 5, 9]},
        training={"steps": 100, "checkpointEvery": 50, "nodes": 2, "gpusPerNode": 1, "groupRestarts": 1},
        storage={"accessModes": ["ReadWriteMany"]},
        scheduling={"queueName": "gpu-queue"},
    )
    cluster.request("POST", draft_training_path(namespace), body)
    admit_like_kueue(cluster, namespace, "llama-generate")
    complete_stage(cluster, namespace, "generate", ["llama-generate"])
    admit_like_kueue(cluster, namespace, "llama-train")
    return trainer_ranks(cluster, namespace, "llama-train")


def complete_stage(cluster: LocalCluster, namespace: str, stage: str, jobs: list[str]) -> None:
    for job, pods in wait_for_stage_pods(cluster, namespace, jobs).items():
        for pod in pods:
            cluster.complete_pod(namespace, pod["metadata"]["name"], message=fakes.stage_report(stage, job))


def stage_record(body: dict[str, Any], stage: str) -> dict[str, Any]:
    return next((s for s in (body.get("status") or {}).get("stages") or [] if s["name"] == stage), {})


def wait_stage_succeeded(
    cluster: LocalCluster, namespace: str, name: str, stage: str, *, timeout: float = 60
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = cluster.request("GET", draft_training_path(namespace, name))
        if (body.get("status") or {}).get("phase") == "Failed":
            raise AssertionError(f"training failed: {condition(body, 'Failed')}")
        return body if stage_record(body, stage).get("state") == "Succeeded" else None

    return wait_until(done, timeout=timeout, interval=0.3, what=f"stage {stage} of {name} to succeed")


def wait_for_phase(cluster: LocalCluster, namespace: str, name: str, phase: str) -> dict[str, Any]:
    """The DraftTraining once its status.phase is `phase`."""

    def reached() -> dict[str, Any] | None:
        body = cluster.request("GET", draft_training_path(namespace, name))
        return body if (body.get("status") or {}).get("phase") == phase else None

    return wait_until(reached, timeout=60, interval=0.3, what=f"{name} phase {phase}")


def drive_to_success(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any]:
    """Play every stage's pods of an offline-mode DraftTraining until it succeeds."""
    for stage, suffixes in STAGE_JOBS:
        complete_stage(cluster, namespace, stage, [f"{name}-{s}" for s in suffixes])
        body = wait_stage_succeeded(cluster, namespace, name, stage)
    assert body["status"]["phase"] == "Succeeded", body["status"]
    return body


def training_body(namespace: str, name: str = "llama", **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "target": {"model": "meta-llama/Llama-3.1-8B-Instruct"},
            "data": {"sources": [{"claimName": "prompts", "path": "chat.jsonl"}], "numSamples": 100},
            "training": {"steps": 100, "checkpointEvery": 50},
        },
    }
    body["spec"].update(spec)
    return body


def prepare_training_volumes(cluster: LocalCluster, namespace: str, name: str = "llama") -> None:
    bind_volume(cluster, namespace, f"{name}-workspace", create_claim=False)
    bind_volume(cluster, namespace, "prompts", create_claim=True)


def events_of(cluster: LocalCluster, namespace: str, name: str) -> list[dict[str, Any]]:
    found = cluster.request(
        "GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name={name}"
    )
    return found["items"]


def wait_for_quiet_cluster(cluster: LocalCluster) -> None:
    """No namespace is being torn down: its deletions would count as writes in apiserver_writes."""

    def settled() -> bool:
        namespaces = cluster.request("GET", "/api/v1/namespaces")["items"]
        return all(n["status"].get("phase") != "Terminating" for n in namespaces)

    wait_until(settled, timeout=120, interval=0.5, what="terminating namespaces to be gone")


def all_events(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """Every Event (all namespaces) by uid."""
    return {e["metadata"]["uid"]: e for e in cluster.request("GET", "/api/v1/events")["items"]}


def _occurrences(event: dict[str, Any]) -> int:
    # core/v1 recorders count in `count`, events.k8s.io/v1 recorders (the scheduler's) in `series`.
    return (event.get("series") or {}).get("count") or event.get("count") or 1


def event_writes_between(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> tuple[int, int, list[dict[str, Any]]]:
    """The POSTs and PATCHes of Events between two `all_events` listings, and the Events written:
    a new Event is one POST plus a PATCH per repeat; a changed one (another resourceVersion) a PATCH
    per repeat since. By resourceVersion, so an event series whose timestamps stay old still counts."""
    posts = patches = 0
    written = []
    for uid, event in after.items():
        old = before.get(uid)
        if old is None:
            posts, patches = posts + 1, patches + _occurrences(event) - 1
        elif old["metadata"]["resourceVersion"] != event["metadata"]["resourceVersion"]:
            patches += max(1, _occurrences(event) - _occurrences(old))
        else:
            continue
        written.append(event)
    return posts, patches, written


WRITE_PROBE = "/workspace/write-probe"


def workspace_write_pod(namespace: str, claim: str, name: str = "write-probe") -> dict[str, Any]:
    """A pod shaped like the operator's stage pods (the select Job's template, as
    reconcile/training_children.py builds it: security context, workspace mount of `claim`, runtime
    image) whose command writes to the workspace and prints the file back with the uid and gid that
    wrote it.

    On the real node (tests/support/realnode.py: on_real_node(), a fresh claim of its storage class,
    root-owned like a new disk) it proves that a stage's first write to /workspace succeeds.
    """
    body = training_body(namespace, storage={"existingClaim": claim})
    body["metadata"]["uid"] = "write-probe"
    (job,) = stage_jobs(body, DraftTraining.model_validate(body), "select", 0, train_metrics={})
    spec = copy.deepcopy(job["spec"]["template"]["spec"])
    (container,) = spec["containers"]
    script = (
        "import os; p = '" + WRITE_PROBE + "'; open(p, 'w').write('written'); "
        "s = os.stat(p); print(open(p).read(), s.st_uid, s.st_gid, os.getuid(), os.getgid(), os.getgroups())"
    )
    container["command"] = ["python3", "-c", script]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": job["spec"]["template"]["metadata"]["labels"],
        },
        "spec": spec,
    }
