"""Reconcile one object: read it and its children, plan (pure), apply the plan, record metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from eagle3_operator import API_VERSION, metrics
from eagle3_operator.apply import apply_children, key, write_status
from eagle3_operator.kube import ApiError, Kube, NamespaceTerminating
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.serving import MONITORING_API, ServingObserved, plan_serving
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

log = logging.getLogger(__name__)
DT, SDD = "DraftTraining", "SpecDecodeDeployment"
MONITOR_KINDS_TTL_S = 60.0
FAILED_CREATE_EVENTS = "involvedObject.kind=Job,reason=FailedCreate"


class Reconciler:
    def __init__(self, kube: Kube):
        self.kube = kube
        self._locks_guard = threading.Lock()
        # Objects being reconciled now -> whether an event asked for another pass meanwhile.
        self._running: dict[tuple[str, str, str], bool] = {}
        # (namespace, DraftTraining) -> SpecDecodeDeployments that take their draft from it.
        self._consumers: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
        self._monitor_kinds: tuple[float, set[str]] = (0.0, set())
        self._requeued: set[tuple[str, str, str]] = set()
        self._known: set[tuple[str, str, str]] = set()
        # resourceVersion our own last status patch produced, per object: its watch event needs no reconcile.
        self._own_writes: dict[tuple[str, str, str], str] = {}
        self._stop = threading.Event()

    def track(self, kind: str, namespace: str, name: str, deleted: bool = False) -> None:
        """Objects seen on the watch; the periodic resync visits them (a safety net for lost events)."""
        with self._locks_guard:
            (self._known.discard if deleted else self._known.add)((kind, namespace, name))

    def start_resync(self, interval: float) -> None:
        def loop() -> None:
            while not self._stop.wait(interval):
                with self._locks_guard:
                    known = sorted(self._known)
                for kind, namespace, name in known:
                    try:
                        if kind == DT:
                            self.reconcile_training(namespace, name)
                        else:
                            self.reconcile_serving(namespace, name)
                    except Exception:  # noqa: BLE001 - logged; the next round retries
                        log.exception("resync of %s %s/%s failed", kind, namespace, name)

        threading.Thread(target=loop, name="resync", daemon=True).start()

    def stop_resync(self) -> None:
        self._stop.set()

    def _coalesced(self, ident: tuple[str, str, str], reconcile: Callable[[], None]) -> None:
        """Run one reconcile per object at a time; events that arrive meanwhile fold into one re-run.

        Each reconcile reads the latest state, so a burst of watch events (pods, Jobs, status
        patches) needs one extra pass, not one per event.
        """
        with self._locks_guard:
            if ident in self._running:
                self._running[ident] = True  # dirty: the running reconcile goes once more
                return
            self._running[ident] = False
        try:
            while True:
                try:
                    reconcile()
                except NamespaceTerminating:
                    # Its objects go with the namespace; retrying would only log refusals.
                    log.info("%s %s/%s: namespace is being deleted; not reconciling", *ident)
                    return
                with self._locks_guard:
                    if not self._running[ident]:
                        return
                    self._running[ident] = False
        finally:
            with self._locks_guard:
                self._running.pop(ident, None)

    def _remember_write(self, ident: tuple[str, str, str], resource_version: str | None) -> None:
        if resource_version:
            with self._locks_guard:
                self._own_writes[ident] = resource_version

    def caused_by_us(self, kind: str, body: dict[str, Any]) -> bool:
        """True for the watch event of our own status patch: nothing in it is news to us."""
        meta_ = body.get("metadata") or {}
        with self._locks_guard:
            written = self._own_writes.get((kind, meta_.get("namespace"), meta_.get("name")))
        return written is not None and written == meta_.get("resourceVersion")

    # ---- DraftTraining ---------------------------------------------------------------------------

    def reconcile_training(self, namespace: str, name: str) -> None:
        self._coalesced((DT, namespace, name), lambda: self._reconcile_training(namespace, name))

    def _reconcile_training(self, namespace: str, name: str) -> None:
        if self._sync_training(namespace, name):
            # Its consumers look again: a new export rolls in; a deleted, re-opened or failed
            # training leaves them their pinned draft, with a Warning.
            for consumer in sorted(self._consumers.get((namespace, name), ())):
                self.reconcile_serving(namespace, consumer)

    def _sync_training(self, namespace: str, name: str) -> bool:
        """One reconcile; True when the training's phase changed or it is gone."""
        with metrics.reconcile_timer(DT):
            body = self.kube.get(API_VERSION, DT, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                metrics.forget_training(namespace, name)
                return True
            selector = f"{meta.DRAFT_TRAINING_LABEL}={name}"
            kinds = (
                ("batch/v1", "Job"),
                ("v1", "Pod"),
                ("apps/v1", "Deployment"),
                ("v1", "Service"),
                ("v1", "PersistentVolumeClaim"),
            )
            # A never-reconciled object (no status) has no children worth reading: its first plan
            # only creates the workspace and the target (a leftover from a crash answers 409 or is
            # applied unchanged), and no Job is planned before the target is seen Ready.
            fresh = not body.get("status")
            listed = {
                kind: [] if fresh else self.kube.list(av, kind, namespace, selector) for av, kind in kinds
            }
            observed = TrainingObserved(
                now=datetime.now(UTC),
                jobs={j["metadata"]["name"]: j for j in listed["Job"]},
                pods=listed["Pod"],
                deployments={d["metadata"]["name"]: d for d in listed["Deployment"]},
            )
            if observed.jobs_lacking_pods():
                observed.job_events = self._failed_create_events(namespace)
            plan = plan_training(body, observed)
            live = {key(o | {"kind": kind}): o for kind, items in listed.items() for o in items}
            observed.refused = apply_children(self.kube, body, plan, live)
            if observed.refused:
                plan = plan_training(body, observed)  # the same decision, with the refusals in its status
            self._remember_write((DT, namespace, name), write_status(self.kube, body, plan))
            metrics.record_training(namespace, name, plan.status)
            if plan.requeue_after:
                self._requeue(DT, namespace, name, plan.requeue_after)
            return (body.get("status") or {}).get("phase") != plan.status.get("phase")

    def _failed_create_events(self, namespace: str) -> list[dict[str, Any]]:
        """Why the Job controller creates no pods is told in its Events alone; read them only then.
        A refused read (RBAC without `list events`) costs the diagnosis, not the reconcile."""
        try:
            return self.kube.list("v1", "Event", namespace, fields=FAILED_CREATE_EVENTS)
        except NamespaceTerminating:
            raise
        except ApiError as error:
            log.warning("cannot read the FailedCreate Events in %s: %s", namespace, error.detail)
            return []

    # ---- SpecDecodeDeployment --------------------------------------------------------------------

    def note_serving(self, body: dict[str, Any], deleted: bool = False) -> None:
        """Remember which DraftTraining a SpecDecodeDeployment waits for (from its watch events)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for (ns, _), consumers in list(self._consumers.items()):
            if ns == namespace:
                consumers.discard(name)
        source = ((body.get("spec") or {}).get("draft") or {}).get("fromDraftTraining")
        if source and not deleted:
            self._consumers[(namespace, source)].add(name)
        if deleted:
            metrics.PHASES.set(SDD, namespace, name, None)

    def monitor_kinds(self) -> set[str]:
        fetched_at, kinds = self._monitor_kinds
        if time.monotonic() - fetched_at > MONITOR_KINDS_TTL_S:
            kinds = self.kube.served_kinds(MONITORING_API) & {"ServiceMonitor", "PodMonitor"}
            self._monitor_kinds = (time.monotonic(), kinds)
        return kinds

    def reconcile_serving(self, namespace: str, name: str) -> None:
        self._coalesced((SDD, namespace, name), lambda: self._reconcile_serving(namespace, name))

    def _reconcile_serving(self, namespace: str, name: str) -> None:
        with metrics.reconcile_timer(SDD):
            body = self.kube.get(API_VERSION, SDD, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                metrics.PHASES.set(SDD, namespace, name, None)
                return
            self.note_serving(body)
            selector = f"{meta.SPEC_DECODE_LABEL}={name}"
            deployments = self.kube.list("apps/v1", "Deployment", namespace, selector)
            services = self.kube.list("v1", "Service", namespace, selector)
            pods = self.kube.list("v1", "Pod", namespace, selector)
            kinds = self.monitor_kinds()
            monitors = {
                kind: self.kube.list(MONITORING_API, kind, namespace, selector) for kind in sorted(kinds)
            }
            source = (body["spec"].get("draft") or {}).get("fromDraftTraining")
            training = self.kube.get(API_VERSION, DT, namespace, source) if source else None
            deployment = next((d for d in deployments if d["metadata"]["name"] == name), None)
            observed = ServingObserved(
                now=datetime.now(UTC),
                deployment=deployment,
                draft_training=training,
                monitor_kinds=kinds,
                pods=pods,
            )
            plan = plan_serving(body, observed)
            listed = {"Deployment": deployments, "Service": services, **monitors}
            live = {key(o | {"kind": kind}): o for kind, items in listed.items() for o in items}
            observed.refused = apply_children(self.kube, body, plan, live)
            if observed.refused:
                plan = plan_serving(body, observed)  # the same decision, with the refusals in its status
            self._remember_write((SDD, namespace, name), write_status(self.kube, body, plan))
            conditions = {c["type"]: c["status"] for c in plan.status.get("conditions") or []}
            metrics.PHASES.set(
                SDD, namespace, name, "Available" if conditions.get("Available") == "True" else "Unavailable"
            )
            if plan.requeue_after:
                self._requeue(SDD, namespace, name, plan.requeue_after)

    # ---- scheduling ------------------------------------------------------------------------------

    def _requeue(self, kind: str, namespace: str, name: str, delay: float) -> None:
        ident = (kind, namespace, name)
        if ident in self._requeued:
            return
        self._requeued.add(ident)

        def run() -> None:
            self._requeued.discard(ident)
            try:
                (self.reconcile_training if kind == DT else self.reconcile_serving)(namespace, name)
            except Exception:  # noqa: BLE001 - logged; the periodic resync retries
                log.exception("requeued reconcile of %s %s/%s failed", kind, namespace, name)

        timer = threading.Timer(delay, run)
        timer.daemon = True
        timer.start()
