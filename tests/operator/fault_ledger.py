"""What a fault must not do to the operator's work, counted from what the API server shows: for the
fault test (test_faults_cluster.py) and the chaos benchmark (benchmarks/operator/chaos.py).

A ChildLedger looks at namespaces again and again (`observe`, or a thread: `polling()`) while faults
are injected, and remembers every child and result it has seen. Per DraftTraining it counts:
  duplicated_children  a child (Job, Deployment, Service, PVC) seen under one name with more than
                       one uid (created again), or more Jobs for a stage than one attempt plans
  stages_run_twice     a stage with a second attempt, a Job of a stage created after that stage
                       had succeeded, or a Job with more than one Succeeded pod
  lost_results         a Succeeded stage's status record, or a result the status holds
                       (checkpoints, bestCheckpoint, export), that later changed or disappeared
and per SpecDecodeDeployment:
  duplicated_children  as above (its Deployment, Service)
  extra_revisions      ReplicaSets beyond one per Deployment (its pod template never changes here)
  lost_results         status.resolvedDraft changed or disappeared once set
Looks are polls: a child created and removed between two looks is missed; the uids and creation
times of what remains, and the last look, catch the rest.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from eagle3_operator.reconcile.meta import DRAFT_TRAINING_LABEL, MANAGED_BY, SPEC_DECODE_LABEL, STAGE_LABEL

from tests.operator.harness import STAGE_JOBS, draft_training_path, spec_decode_path
from tests.support.cluster import ApiError, LocalCluster

# A look fails while the API server or etcd is down; the next one catches up.
UNAVAILABLE = (OSError, ApiError, http.client.HTTPException, ValueError)
MANAGED = f"app.kubernetes.io/managed-by={MANAGED_BY}"
CHILDREN = {
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "Service": "/api/v1/namespaces/{ns}/services",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
}
JOBS_PER_STAGE = {stage: len(suffixes) for stage, suffixes in STAGE_JOBS}
RESULT_FIELDS = ("checkpoints", "bestCheckpoint", "export")


def _owner(obj: dict[str, Any]) -> tuple[str, str] | None:
    labels = obj["metadata"].get("labels") or {}
    for kind, label in (("DraftTraining", DRAFT_TRAINING_LABEL), ("SpecDecodeDeployment", SPEC_DECODE_LABEL)):
        if label in labels:
            return kind, labels[label]
    return None


class ChildLedger:
    def __init__(self, cluster: LocalCluster, namespaces: list[str]):
        self.cluster = cluster
        self.namespaces = namespaces
        self.looks = self.failed_looks = 0
        # (namespace, owner kind, owner name) -> (child kind, child name) -> uids seen
        self.uids: dict[tuple[str, str, str], dict[tuple[str, str], set[str]]] = defaultdict(
            lambda: defaultdict(set)
        )
        # (namespace, training) -> stage -> job name -> the creationTimestamp of each uid seen
        self.stage_jobs: dict[tuple[str, str], dict[str, dict[str, set[str]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(set))
        )
        self.succeeded_pods: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(
            lambda: defaultdict(set)
        )
        # (namespace, owner kind, owner name) -> result key -> the first value seen; the keys that
        # changed or disappeared since
        self.results: dict[tuple[str, str, str], dict[str, str]] = defaultdict(dict)
        self.changed: dict[tuple[str, str, str], set[str]] = defaultdict(set)
        self.replica_sets: dict[tuple[str, str], set[str]] = defaultdict(set)  # (ns, deployment) -> uids
        self.bodies: dict[tuple[str, str, str], dict[str, Any]] = {}  # last body of each owner seen
        self._lock = threading.Lock()

    # ---- looking -----------------------------------------------------------------------------

    def observe(self) -> bool:
        """One look at every namespace; False when the API server could not answer it."""
        try:
            listings = [self._list(ns) for ns in self.namespaces]
        except UNAVAILABLE:
            with self._lock:
                self.failed_looks += 1
            return False
        with self._lock:
            self.looks += 1
            for ns, listing in zip(self.namespaces, listings, strict=True):
                self._record(ns, *listing)
        return True

    @contextlib.contextmanager
    def polling(self, interval: float = 0.3) -> Iterator[ChildLedger]:
        """Look every `interval` seconds in a thread while the block runs, and once more at its end."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval):
                self.observe()

        thread = threading.Thread(target=loop, name="child-ledger", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.observe()

    def _list(self, ns: str) -> tuple:
        request = self.cluster.request
        children = {
            kind: request("GET", f"{path.format(ns=ns)}?labelSelector={MANAGED}")["items"]
            for kind, path in CHILDREN.items()
        }
        pods = request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={STAGE_LABEL}")["items"]
        replica_sets = request("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets")["items"]
        trainings = request("GET", draft_training_path(ns))["items"]
        servings = request("GET", spec_decode_path(ns))["items"]
        return children, pods, replica_sets, trainings, servings

    def _record(self, ns: str, children, pods, replica_sets, trainings, servings) -> None:
        for kind, found in children.items():
            for child in found:
                owner = _owner(child)
                if owner is None:
                    continue
                name, uid = child["metadata"]["name"], child["metadata"]["uid"]
                self.uids[(ns, *owner)][(kind, name)].add(uid)
                stage = (child["metadata"].get("labels") or {}).get(STAGE_LABEL)
                if kind == "Job" and stage:
                    created = child["metadata"]["creationTimestamp"]
                    self.stage_jobs[(ns, owner[1])][stage][name].add(created)
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            job = labels.get("batch.kubernetes.io/job-name")
            if job and labels.get(DRAFT_TRAINING_LABEL) and pod["status"].get("phase") == "Succeeded":
                self.succeeded_pods[(ns, labels[DRAFT_TRAINING_LABEL])][job].add(pod["metadata"]["uid"])
        for rs in replica_sets:
            for ref in rs["metadata"].get("ownerReferences") or []:
                if ref["kind"] == "Deployment":
                    self.replica_sets[(ns, ref["name"])].add(rs["metadata"]["uid"])
        for body in trainings:
            name = body["metadata"]["name"]
            self.bodies[(ns, "DraftTraining", name)] = body
            status = body.get("status") or {}
            results = {
                f"stage {s['name']}": s for s in status.get("stages") or [] if s.get("state") == "Succeeded"
            }
            results |= {key: status[key] for key in RESULT_FIELDS if key in status}
            self._compare((ns, "DraftTraining", name), results)
        for body in servings:
            name = body["metadata"]["name"]
            self.bodies[(ns, "SpecDecodeDeployment", name)] = body
            draft = (body.get("status") or {}).get("resolvedDraft")
            self._compare((ns, "SpecDecodeDeployment", name), {"resolvedDraft": draft} if draft else {})

    def _compare(self, owner: tuple[str, str, str], results: dict[str, Any]) -> None:
        """Remember each result the first time it is seen; flag it when it later differs or is gone."""
        first = self.results[owner]
        for key, value in results.items():
            text = json.dumps(value, sort_keys=True)
            if first.setdefault(key, text) != text:
                self.changed[owner].add(key)
        self.changed[owner].update(key for key in first if key not in results)

    def in_flight(self) -> int:
        """DraftTrainings whose last look showed them neither Succeeded nor Failed."""
        with self._lock:
            return sum(
                (body.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                for (_, kind, _), body in self.bodies.items()
                if kind == "DraftTraining"
            )

    # ---- counting ----------------------------------------------------------------------------

    def _duplicated(self, ns: str, kind: str, name: str) -> int:
        return sum(len(uids) - 1 for uids in self.uids[(ns, kind, name)].values())

    def training_counts(self, ns: str, name: str) -> dict[str, Any]:
        with self._lock:
            body = self.bodies.get((ns, "DraftTraining", name)) or {}
            status = body.get("status") or {}
            records = {s["name"]: s for s in status.get("stages") or []}
            jobs = self.stage_jobs[(ns, name)]
            extra_jobs = run_twice = 0
            for stage, by_job in jobs.items():
                extra_jobs += max(0, len(by_job) - JOBS_PER_STAGE.get(stage, 1))
                record = records.get(stage) or {}
                done = record.get("completionTime") if record.get("state") == "Succeeded" else None
                late = done is not None and any(c > done for created in by_job.values() for c in created)
                many_pods = any(len(self.succeeded_pods[(ns, name)][job]) > 1 for job in by_job)
                if len(by_job) > JOBS_PER_STAGE.get(stage, 1) or late or many_pods or record.get("attempt"):
                    run_twice += 1
            return {
                "phase": status.get("phase"),
                "duplicated_children": self._duplicated(ns, "DraftTraining", name) + extra_jobs,
                "stages_run_twice": run_twice,
                "lost_results": len(self.changed[(ns, "DraftTraining", name)]),
                "jobs": sum(len(by_job) for by_job in jobs.values()),
            }

    def serving_counts(self, ns: str, name: str) -> dict[str, Any]:
        with self._lock:
            deployments = [
                n for kind, n in self.uids[(ns, "SpecDecodeDeployment", name)] if kind == "Deployment"
            ]
            return {
                "duplicated_children": self._duplicated(ns, "SpecDecodeDeployment", name),
                "extra_revisions": sum(max(0, len(self.replica_sets[(ns, d)]) - 1) for d in deployments),
                "lost_results": len(self.changed[(ns, "SpecDecodeDeployment", name)]),
            }
