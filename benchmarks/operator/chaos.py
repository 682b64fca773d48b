"""Faults injected and survived: N DraftTraining pipelines and a few SpecDecodeDeployment rollouts
on the local test bed while, at seeded random moments, the operator's leader, the API server, etcd,
stage pods and serving pods are killed.

    PYTHONPATH=operator:. EAGLE3_TESTBED_BIN=... python -m benchmarks.operator.chaos \\
        [--pipelines 10] [--servings 2] [--faults 24] [--seed 16]

Set-up: two operator replicas with Lease leader election (the short Lease timings of the leader
election test), in one manual namespace: this process plays every stage pod (it completes each
Running stage pod with the stage's fake result after a seeded 3-10 s), and, like a kubelet's
restartPolicy Always, starts again any replica that exits (a replica that cannot renew its Lease
while the API server is down exits by design). The pipelines and deployments are created at seeded
moments through the expected fault window (pipelines until a minute before its end, deployments in
its first half), so faults land in every phase of them; each fault records how many pipelines
were in flight (not yet Succeeded or Failed at the ledger's last look) when it struck.

Faults, one after the other (each waits for its recovery, then a seeded 2-6 s gap):
  operator-leader   SIGKILL the replica that leads; the standby must take over; the killed one starts again
  kube-apiserver    SIGKILL it, 0.5-3 s down, started again in place (LocalCluster.restart_component)
  etcd              SIGKILL it, 0.5-3 s down, started again in place; recovered when reads succeed
  stage-pod-delete  delete a Running stage pod (its Job makes another; at most one fault per Job:
                    backoffLimit is 2)
  stage-pod-fail    a Running stage pod ends Failed, exit code 1 (the Job retries it)
  serving-pod       delete a Running pod of a SpecDecodeDeployment (2 replicas); recovered when the
                    Deployment has its ready replicas back
Counted throughout (tests/operator/fault_ledger.py, a look every 0.3 s) and at the end: duplicated
children, stages run twice, lost results, per pipeline, whether it Succeeded; per deployment,
duplicated children, extra ReplicaSets (revisions), a changed resolvedDraft, Available at the end.
No real vLLM runs here, so failed requests are not counted: tests/operator/test_canary_realnode.py
keeps a client sending requests through a rollout on the real node.

Writes benchmarks/operator/results/DATE-chaos.json and prints it.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.operator.bench_scale import write_results
from tests.operator import fakes
from tests.operator.fault_ledger import UNAVAILABLE, ChildLedger
from tests.operator.harness import (
    SHORT_LEASE,
    OperatorProcess,
    bind_volume,
    condition,
    draft_training_path,
    install_crds,
    spec_decode_path,
    training_body,
)
from tests.support.cluster import ApiError, LocalCluster, wait_until

KINDS = ("operator-leader", "kube-apiserver", "etcd", "stage-pod-delete", "stage-pod-fail", "serving-pod")
STAGE_SECONDS = (3.0, 10.0)
GAP_SECONDS = (2.0, 6.0)
EXPECTED_RECOVERY_S = 5.0  # a fault's mean time to recover (pilot run): to spread the objects over the run
LAST_PIPELINE_S = 60.0  # the last pipeline starts this long before the faults are expected to end
DOWN_SECONDS = (0.5, 3.0)
RECOVERY_TIMEOUT_S = 90.0
FINISH_TIMEOUT_S = 300.0  # over two resync periods (120 s): an object whose events were all lost still ends
STAGE_LABEL = "eagle3.ai/stage"
SERVING_LABEL = "eagle3.ai/spec-decode-deployment"


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _pods(cluster: LocalCluster, ns: str, selector: str) -> list[dict[str, Any]]:
    pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")["items"]
    return sorted(
        (
            p
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ),
        key=lambda p: p["metadata"]["name"],
    )


class Replicas:
    """The two operator replicas, started again when they exit (as a kubelet would)."""

    def __init__(self, cluster: LocalCluster, ns: str, log_dir: Path, started: float):
        args = ("--leader-elect", "--leader-elect-resource-namespace", ns, *SHORT_LEASE)
        self.replicas = [
            OperatorProcess(cluster, [ns], log_dir / f"operator-{i}.log", args) for i in range(2)
        ]
        self.lock = threading.Lock()
        self.exits: list[dict[str, Any]] = []
        self.started = started
        self.stop = threading.Event()

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()

    def _supervise(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                for i, replica in enumerate(self.replicas):
                    if replica.proc is not None and replica.proc.poll() is not None:
                        code = replica.proc.returncode
                        self.exits.append(
                            {"at_s": round(time.monotonic() - self.started, 1), "replica": i, "code": code}
                        )
                        replica.proc = None
                    if replica.proc is None:
                        try:
                            replica.start()
                        except (AssertionError, TimeoutError):
                            replica.proc = None  # tried again on the next round

    def leader(self) -> int | None:
        for i, replica in enumerate(self.replicas):
            try:
                if replica.proc is not None and replica.metric("eagle3_operator_leader") == 1:
                    return i
            except OSError:
                continue
        return None

    def shutdown(self) -> None:
        self.stop.set()
        with self.lock:
            for replica in self.replicas:
                replica.stop()


class StagePods:
    """Plays the stage pods: completes each Running one with its stage's result after a seeded while;
    pods taken by a fault are left alone."""

    def __init__(self, cluster: LocalCluster, ns: str, rng: random.Random):
        self.cluster, self.ns, self.rng = cluster, ns, rng
        self.lock = threading.Lock()
        self.due: dict[str, float] = {}
        self.taken: set[str] = set()  # pod uids a fault took
        self.faulted_jobs: set[str] = set()
        self.completed = 0
        self.stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="stage-pods", daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(0.3):
            try:
                pods = _pods(self.cluster, self.ns, STAGE_LABEL)
            except UNAVAILABLE:
                continue
            now = time.monotonic()
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if uid not in self.due:
                    self.due[uid] = now + self.rng.uniform(*STAGE_SECONDS)
                if now < self.due[uid]:
                    continue
                labels = pod["metadata"]["labels"]
                report = fakes.stage_report(labels[STAGE_LABEL], labels["batch.kubernetes.io/job-name"])
                with self.lock:
                    if uid in self.taken:
                        continue
                    try:
                        self.cluster.complete_pod(self.ns, pod["metadata"]["name"], message=report)
                        self.completed += 1
                    except UNAVAILABLE:
                        continue

    def take(self, rng: random.Random) -> dict[str, Any] | None:
        """A Running stage pod of a Job no fault has hit yet, withheld from completion (call with lock)."""
        candidates = [
            p
            for p in _pods(self.cluster, self.ns, STAGE_LABEL)
            if p["metadata"]["labels"]["batch.kubernetes.io/job-name"] not in self.faulted_jobs
            and p["metadata"]["uid"] not in self.taken
        ]
        if not candidates:
            return None
        pod = rng.choice(candidates)
        self.taken.add(pod["metadata"]["uid"])
        self.faulted_jobs.add(pod["metadata"]["labels"]["batch.kubernetes.io/job-name"])
        return pod


class Chaos:
    def __init__(self, args: argparse.Namespace, cluster: LocalCluster, ns: str, started: float):
        self.args, self.cluster, self.ns, self.started = args, cluster, ns, started
        self.rng = random.Random(args.seed)
        self.log_dir = Path(tempfile.mkdtemp(prefix="eagle3-chaos-"))  # kept when the run is not clean
        self.replicas = Replicas(cluster, ns, self.log_dir, started)
        self.stage_pods = StagePods(cluster, ns, random.Random(args.seed + 1))

    def now(self) -> float:
        return round(time.monotonic() - self.started, 2)

    def schedule(self) -> list[str]:
        kinds = [KINDS[i % len(KINDS)] for i in range(self.args.faults)]
        self.rng.shuffle(kinds)
        return kinds

    def _api_answers(self) -> bool:
        try:
            self.cluster.request("GET", f"/api/v1/namespaces/{self.ns}")
            return True
        except UNAVAILABLE:
            return False

    def inject(self, kind: str, ledger: ChildLedger) -> dict[str, Any]:
        fault: dict[str, Any] = {"at_s": self.now(), "kind": kind, "pipelines_in_flight": ledger.in_flight()}
        began = time.monotonic()
        try:
            recovered = getattr(self, "_" + kind.replace("-", "_"))(fault)
        except (TimeoutError, *UNAVAILABLE) as error:
            fault["error"] = repr(error)[:300]
            recovered = False
        if recovered is None:
            fault["skipped"] = "nothing to hit"
        else:
            fault["recovered"] = recovered
            fault["recovery_s"] = round(time.monotonic() - began, 2)
        return fault

    def _down(self, component: str, fault: dict[str, Any]) -> bool:
        fault["down_s"] = round(self.rng.uniform(*DOWN_SECONDS), 2)
        self.cluster.kill_component(component)
        time.sleep(fault["down_s"])
        self.cluster.restart_component(component)
        return wait_until(self._api_answers, timeout=RECOVERY_TIMEOUT_S, interval=0.1, what="API reads")

    def _kube_apiserver(self, fault: dict[str, Any]) -> bool:
        return self._down("kube-apiserver", fault)

    def _etcd(self, fault: dict[str, Any]) -> bool:
        return self._down("etcd", fault)

    def _operator_leader(self, fault: dict[str, Any]) -> bool | None:
        replicas = self.replicas
        try:
            leader = wait_until(lambda: [i for i in [replicas.leader()] if i is not None], timeout=20)[0]
        except TimeoutError:
            return None
        fault["target"] = f"replica {leader}"
        with replicas.lock:
            replicas.replicas[leader].kill()
        # Either the standby takes the Lease once it expires, or the killed replica, which the
        # supervisor starts again, wins it (a new identity: a fresh election).
        new = wait_until(
            lambda: [i for i in [replicas.leader()] if i is not None],
            timeout=RECOVERY_TIMEOUT_S,
            interval=0.2,
        )[0]
        fault["new_leader"] = f"replica {new}"
        return True

    def _stage_pod(self, fault: dict[str, Any], fail: bool) -> bool | None:
        pods = self.stage_pods
        deadline = time.monotonic() + 15
        while True:
            with pods.lock:
                pod = pods.take(self.rng)
                if pod is not None:
                    name = pod["metadata"]["name"]
                    fault["target"] = name
                    try:
                        if fail:
                            self.cluster.fail_pod(
                                self.ns, name, message="chaos: injected failure", exit_code=1
                            )
                        else:
                            self.cluster.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}")
                    except BaseException:
                        pods.taken.discard(pod["metadata"]["uid"])  # not hit: the pod completes as usual
                        raise
                    break
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)
        job = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]

        def replaced() -> bool:
            # Another pod of the Job runs, or the Job is done (the replacement already completed).
            running = _pods(self.cluster, self.ns, f"batch.kubernetes.io/job-name={job}")
            body = self.cluster.request("GET", f"/apis/batch/v1/namespaces/{self.ns}/jobs/{job}")
            done = any(
                c["type"] == "Complete" and c["status"] == "True"
                for c in body["status"].get("conditions") or []
            )
            return done or any(p["metadata"]["name"] != name for p in running)

        return wait_until(replaced, timeout=RECOVERY_TIMEOUT_S, interval=0.3, what=f"a pod of {job} again")

    def _stage_pod_delete(self, fault: dict[str, Any]) -> bool | None:
        return self._stage_pod(fault, fail=False)

    def _stage_pod_fail(self, fault: dict[str, Any]) -> bool | None:
        return self._stage_pod(fault, fail=True)

    def _serving_pod(self, fault: dict[str, Any]) -> bool | None:
        try:
            pods = wait_until(lambda: _pods(self.cluster, self.ns, SERVING_LABEL), timeout=15, interval=0.5)
        except TimeoutError:
            return None
        pod = self.rng.choice(pods)
        name = pod["metadata"]["name"]
        owner = pod["metadata"]["labels"][SERVING_LABEL]
        fault["target"] = name
        self.cluster.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}")

        def restored() -> bool:
            for d in self.cluster.request(
                "GET", f"/apis/apps/v1/namespaces/{self.ns}/deployments?labelSelector={SERVING_LABEL}={owner}"
            )["items"]:
                status = d.get("status") or {}
                if (status.get("readyReplicas") or 0) < d["spec"]["replicas"]:
                    return False
            return name not in {p["metadata"]["name"] for p in _pods(self.cluster, self.ns, SERVING_LABEL)}

        return wait_until(restored, timeout=RECOVERY_TIMEOUT_S, interval=0.3, what=f"{owner}'s pods back")


def _create_when_due(cluster: LocalCluster, plan: list[tuple[float, str, dict]], started: float) -> None:
    """POST each object at its moment, again until the API server takes it (a lost answer: 409)."""
    for at, path, body in plan:
        time.sleep(max(0.0, started + at - time.monotonic()))
        while True:
            try:
                cluster.request("POST", path, body)
                break
            except ApiError as error:
                if error.status == 409:
                    break
                time.sleep(0.5)
            except UNAVAILABLE:
                time.sleep(0.5)


def _serving_body(ns: str, name: str) -> dict[str, Any]:
    body = fakes.spec_decode(replicas=2)
    body["metadata"] = {"name": name, "namespace": ns}
    return body


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pipelines", type=int, default=10)
    parser.add_argument("--servings", type=int, default=2)
    parser.add_argument("--faults", type=int, default=24)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--results", type=Path, default=None, help="JSON path (default results/DATE-chaos.json)"
    )
    args = parser.parse_args()
    load_at_start = _load()
    trainings = [f"p{i:02d}" for i in range(args.pipelines)]
    servings = [f"chat-{i}" for i in range(args.servings)]
    # Target servers take 1 GPU, serving pods 2 each (8 per fake node).
    with LocalCluster(gpu_nodes=args.pipelines // 4 + args.servings // 2 + 2, cpu_nodes=2) as cluster:
        install_crds(cluster)
        ns = cluster.create_namespace(manual=True)
        bind_volume(cluster, ns, "prompts", create_claim=True)
        bind_volume(cluster, ns, "drafts", create_claim=True)
        for name in trainings:
            bind_volume(cluster, ns, f"{name}-workspace", create_claim=False)
        started = time.monotonic()
        chaos = Chaos(args, cluster, ns, started)
        kinds = chaos.schedule()
        gaps = [chaos.rng.uniform(*GAP_SECONDS) for _ in kinds]
        window = sum(gaps) + EXPECTED_RECOVERY_S * len(kinds)
        last = max(window - LAST_PIPELINE_S, window / 2)
        plan = [
            (chaos.rng.uniform(0, last), draft_training_path(ns), training_body(ns, n)) for n in trainings
        ]
        plan += [
            (chaos.rng.uniform(0, window / 2), spec_decode_path(ns), _serving_body(ns, n)) for n in servings
        ]
        plan.sort(key=lambda entry: entry[0])
        ledger = ChildLedger(cluster, [ns])
        chaos.replicas.start()
        chaos.stage_pods.start()
        creator = threading.Thread(target=_create_when_due, args=(cluster, plan, started), daemon=True)
        creator.start()
        faults = []
        with ledger.polling():
            # Faults from this (the test bed's) thread: components restarted here die with it.
            for kind, gap in zip(kinds, gaps, strict=True):
                time.sleep(gap)
                fault = chaos.inject(kind, ledger)
                print(f"{fault}", flush=True)
                faults.append(fault)
            creator.join()

            def finished() -> bool:
                try:
                    done = [
                        (cluster.request("GET", draft_training_path(ns, n)).get("status") or {}).get("phase")
                        in ("Succeeded", "Failed")
                        for n in trainings
                    ]
                    available = [
                        condition(cluster.request("GET", spec_decode_path(ns, n)), "Available").get("status")
                        == "True"
                        for n in servings
                    ]
                except UNAVAILABLE:
                    return False
                return all(done) and all(available)

            try:
                wait_until(finished, timeout=FINISH_TIMEOUT_S, interval=1, what="every pipeline to end")
                unfinished = None
            except TimeoutError as error:
                unfinished = str(error)
        duration = time.monotonic() - started
        chaos.stage_pods.stop.set()
        chaos.replicas.shutdown()
        pipelines = {n: ledger.training_counts(ns, n) for n in trainings}
        serving = {n: ledger.serving_counts(ns, n) for n in servings}
        for n in servings:
            body = ledger.bodies.get((ns, "SpecDecodeDeployment", n)) or {}
            serving[n]["available"] = condition(body, "Available").get("status") == "True"

    totals = {
        "pipelines_succeeded": sum(p["phase"] == "Succeeded" for p in pipelines.values()),
        "duplicated_children": sum(p["duplicated_children"] for p in pipelines.values())
        + sum(s["duplicated_children"] for s in serving.values()),
        "stages_run_twice": sum(p["stages_run_twice"] for p in pipelines.values()),
        "lost_results": sum(p["lost_results"] for p in pipelines.values())
        + sum(s["lost_results"] for s in serving.values()),
        "extra_revisions": sum(s["extra_revisions"] for s in serving.values()),
        "deployments_available": sum(s["available"] for s in serving.values()),
    }
    clean = (
        unfinished is None
        and totals["pipelines_succeeded"] == len(trainings)
        and totals["deployments_available"] == len(servings)
        and not any(
            totals[k] for k in ("duplicated_children", "stages_run_twice", "lost_results", "extra_revisions")
        )
    )
    by_kind: dict[str, Counter] = {kind: Counter() for kind in KINDS}
    for fault in faults:
        counter = by_kind[fault["kind"]]
        if "skipped" in fault:
            counter["skipped"] += 1
            continue
        counter["injected"] += 1
        counter["with_pipelines_in_flight"] += fault["pipelines_in_flight"] > 0
        counter["recovered"] += bool(fault.get("recovered"))
        # Survived: recovered, and the run as a whole ended clean (every count 0, everything done).
        counter["survived"] += bool(fault.get("recovered")) and clean
    results = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "command": shlex.join([sys.executable, "-m", "benchmarks.operator.chaos", *sys.argv[1:]]),
        "seed": args.seed,
        "load_average_at_start": load_at_start,
        "load_average_at_end": _load(),
        "duration_s": round(duration, 1),
        "pipelines": len(trainings),
        "spec_decode_deployments": len(servings),
        "unfinished": unfinished,
        "clean": clean,
        "faults_by_kind": {kind: dict(counter) for kind, counter in by_kind.items()},
        "totals": totals,
        "operator_replica_exits": chaos.replicas.exits,
        "stage_pods_completed": chaos.stage_pods.completed,
        "ledger_looks": {"answered": ledger.looks, "failed": ledger.failed_looks},
        "faults": faults,
        "per_pipeline": pipelines,
        "per_deployment": serving,
    }
    write_results(results, args.results, "chaos")
    if clean:
        shutil.rmtree(chaos.log_dir, ignore_errors=True)
    else:
        print(f"operator logs kept in {chaos.log_dir}")


if __name__ == "__main__":
    main()
