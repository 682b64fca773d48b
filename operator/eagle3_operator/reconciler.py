"""Reconcile objects from a work queue: read the object and its children from the watch cache, plan
(pure), apply the plan, write the status with a resourceVersion precondition, record metrics."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from eagle3_api import API_VERSION
from eagle3_api.spec_decode_deployment import LiveAcceptanceSpec, RolloutSpec
from eagle3_operator import metrics
from eagle3_operator.apply import apply_children, key, write_status
from eagle3_operator.cache import CHANGED, PROGRESS, UNCHANGED, Store
from eagle3_operator.kube import ApiError, Conflict, Kube, NamespaceTerminating, NotLeader
from eagle3_operator.reconcile import meta, verification
from eagle3_operator.reconcile.canary import CANARY_SUFFIX
from eagle3_operator.reconcile.live_acceptance import (
    COUNTERS,
    REVISION_ANNOTATION,
    History,
    PodCounters,
    PodRead,
    counters_from_samples,
    parse_metrics,
)
from eagle3_operator.reconcile.network_policy import plan_network_policy
from eagle3_operator.reconcile.ownership import foreign_problem, split_children, withhold_foreign
from eagle3_operator.reconcile.plan import Event
from eagle3_operator.reconcile.pods import VLLM_PORT
from eagle3_operator.reconcile.serving import (
    DRAFT_EXPORT_ANNOTATION,
    MONITORING_API,
    ServingObserved,
    plan_serving,
)
from eagle3_operator.reconcile.training import TrainingObserved, plan_training
from eagle3_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
DT, SDD = "DraftTraining", "SpecDecodeDeployment"
MONITOR_KINDS_TTL_S = 60.0
FAILED_CREATE_EVENTS = "involvedObject.kind=Job,reason=FailedCreate"
TRAINING_CHILDREN = ("Job", "Pod", "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy")
# A status write that meets a newer object is re-planned from a fresh read this often in a row,
# then the key goes back to the queue with its backoff.
CONFLICT_ATTEMPTS = 3
# One read of a vLLM pod's /metrics or of a Prometheus query may take this long (a saturated server
# answers late; the reconcile worker waits for it).
COUNTER_READ_TIMEOUT_S = 3.0
COUNTER_READ_WORKERS = 16
# Writes that wait for the API server to discover the owner's kind (apply.UNDISCOVERED_OWNER) are
# tried again after this long.
DEFERRED_WRITE_RETRY_S = 5.0
Key = tuple[str, str, str]  # kind, namespace, name


@dataclass(frozen=True)
class ControllerSettings:
    workers: int = 8
    # Every object is reconciled at least this often (a safety net for lost watch events); each
    # object's next pass is drawn from [0.8, 1.0] of it, so passes spread out instead of bunching.
    resync_period: float = 120.0
    # Progress-only pod changes (the runtime's annotation, every 10 s per pod) wait this long, so
    # several pods' reports fold into one reconcile and one status write.
    progress_delay: float = 2.0
    backoff_base: float = 0.5
    backoff_max: float = 300.0


class Reconciler:
    def __init__(self, kube: Kube, settings: ControllerSettings | None = None, store: Store | None = None):
        self.kube = kube
        self.settings = settings or ControllerSettings()
        self.store = store or Store()
        self.queue = WorkQueue(
            self.settings.backoff_base, self.settings.backoff_max, metrics.WORKQUEUE_WAIT_SECONDS.observe
        )
        # Set while this replica may reconcile (always, without leader election).
        self.leading = threading.Event()
        self._lock = threading.Lock()
        self._monitor_kinds: tuple[float, set[str]] = (0.0, set())
        # What the latest upsert of each object was (index handler -> event handler of the same event).
        self._changes: dict[Key, str] = {}
        self._workers: list[threading.Thread] = []
        # Speculative-decoding counter reads per SpecDecodeDeployment, for one live window (in memory:
        # a restarted operator needs a window of reads again before it judges DraftDegraded).
        self._counters: dict[tuple[str, str], History] = {}

    # ---- watch events (kopf handlers) -------------------------------------------------------------

    def observe(self, kind: str, api_version: str, body: dict[str, Any]) -> None:
        """An object as a watch listed or saw it: into the cache, before any handler runs."""
        change = self.store.upsert(kind, api_version, body)
        with self._lock:
            self._changes[(kind, body["metadata"].get("namespace") or "", body["metadata"]["name"])] = change

    def on_event(self, kind: str, body: dict[str, Any], deleted: bool) -> None:
        """Queue what the event concerns: the object itself, or the owner of a child."""
        namespace, name = body["metadata"].get("namespace") or "", body["metadata"]["name"]
        with self._lock:
            change = self._changes.pop((kind, namespace, name), CHANGED)
        if deleted:
            self.store.delete(kind, body)
        elif change == UNCHANGED:
            return  # our own write coming back, or a re-listing: nothing new
        if kind in (DT, SDD):
            self.queue.add((kind, namespace, name), first=_unacted(body))
        else:
            labels = body["metadata"].get("labels") or {}
            delay = self.settings.progress_delay if change == PROGRESS else 0.0
            if training := labels.get(meta.DRAFT_TRAINING_LABEL):
                self.queue.add_after((DT, namespace, training), delay)
            if serving := labels.get(meta.SPEC_DECODE_LABEL):
                self.queue.add_after((SDD, namespace, serving), delay)
        metrics.WORKQUEUE_DEPTH.set(len(self.queue))

    # ---- workers ---------------------------------------------------------------------------------

    def start(self) -> None:
        for index in range(self.settings.workers):
            worker = threading.Thread(target=self._work, name=f"reconcile-{index}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def stop(self, timeout: float = 10.0) -> None:
        """No new reconciles; wait a little for the running ones."""
        self.queue.shut_down()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        # A standby replica caches and queues, but reconciles nothing.
        while not self.leading.wait(timeout=1.0):
            if self.queue.closed:
                return
        while (item := self.queue.get()) is not None:
            try:
                next_pass = self._process(item)
            except NotLeader:
                # Fenced: the Lease went unrenewed past the renew deadline (the API server was
                # unreachable). A replica that has lost it exits; one whose late renewal succeeds
                # leads on and must still reconcile this object, so the key stays queued.
                delay = self.queue.add_rate_limited(item)
                log.warning("%s %s/%s: not holding the leader Lease; again in %.1f s", *item, delay)
                next_pass = None
            except Exception:  # noqa: BLE001 - logged; the key comes back after its backoff
                delay = self.queue.add_rate_limited(item)
                log.exception("reconcile of %s %s/%s failed; again in %.1f s", *item, delay)
            else:
                self.queue.forget(item)
                if next_pass is not None:
                    self.queue.add_after(item, next_pass)
            finally:
                self.queue.done(item)
                metrics.WORKQUEUE_DEPTH.set(len(self.queue))

    def _process(self, item: Key) -> float | None:
        """Reconcile one key; seconds until its next pass (None: it is gone)."""
        kind, namespace, name = item
        reconcile = self._reconcile_training if kind == DT else self._reconcile_serving
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                requeue_after = reconcile(namespace, name, fresh=attempt > 0)
            except Conflict as conflict:
                # The object changed since the cached copy we planned from: read it, plan again.
                metrics.STATUS_CONFLICTS.labels(kind).inc()
                log.info("%s %s/%s changed during the reconcile (%s); planning again", *item, conflict.detail)
                continue
            except NamespaceTerminating:
                # Its objects go with the namespace; retrying would only log refusals.
                log.info("%s %s/%s: namespace is being deleted; not reconciling", *item)
                return None
            if requeue_after is None:
                with contextlib.suppress(KeyError):
                    metrics.LAST_RECONCILE.remove(*item)
                return None
            metrics.LAST_RECONCILE.labels(*item).set(time.time())
            resync = self.settings.resync_period * random.uniform(0.8, 1.0)
            return min(requeue_after, resync) if requeue_after > 0 else resync
        raise Conflict(
            409, f"{kind} {namespace}/{name}: the status write conflicted {CONFLICT_ATTEMPTS} times"
        )

    def _read(self, kind: str, namespace: str, name: str, fresh: bool) -> dict[str, Any] | None:
        """The object from the cache, or (after a conflict) from the API server into the cache."""
        if not fresh:
            return self.store.get(kind, namespace, name)
        body = self.kube.get(API_VERSION, kind, namespace, name)
        if body is not None:
            self.store.upsert(kind, API_VERSION, body)
        return body

    # ---- DraftTraining ---------------------------------------------------------------------------

    def _reconcile_training(self, namespace: str, name: str, fresh: bool) -> float | None:
        """One reconcile: 0 or the plan's requeue delay; None when the object is gone."""
        with metrics.reconcile_timer(DT, retried=(Conflict,)):
            body = self._read(DT, namespace, name, fresh)
            if body is None or body["metadata"].get("deletionTimestamp"):
                metrics.forget_training(namespace, name)
                self._queue_consumers(namespace, name)  # they keep their pinned draft and say why
                return None
            listed = {
                kind: self.store.owned(kind, namespace, meta.DRAFT_TRAINING_LABEL, name)
                for kind in TRAINING_CHILDREN
            }
            children = split_children(body, listed)
            ours = children.ours
            observed = TrainingObserved(
                now=datetime.now(UTC),
                jobs={j["metadata"]["name"]: j for j in ours["Job"]},
                pods=ours["Pod"],
                deployments={d["metadata"]["name"]: d for d in ours["Deployment"]},
                network_policies=ours["NetworkPolicy"],
                foreign=children.foreign,
            )
            if observed.jobs_lacking_pods():
                observed.job_events = self._failed_create_events(namespace)
            plan = plan_training(body, observed)
            live = {key(o): o for items in listed.values() for o in items}
            observed.refused, deferred, wrote = self._apply(body, plan, live)
            if observed.refused:
                plan = plan_training(body, observed)  # the same decision, with the refusals in its status
            if wrote and not observed.refused and self._burst_of_new_objects(body):
                # Other new objects wait for their first children: this one's first status write
                # (planned again from the cache, which holds its children now) waits in the other
                # lane until no new object does (in the first lane, 563 status patches went ahead of
                # the last object's children in a burst of 2000; now about 40: docs/benchmarks.md).
                self.queue.add((DT, namespace, name))
                return _requeue_after(plan, deferred)
            self._write_status(DT, body, plan)
            metrics.record_training(namespace, name, plan.status)
            if (body.get("status") or {}).get("phase") != plan.status.get("phase"):
                # Its consumers look again: a new export rolls in; a re-opened or failed training
                # leaves them their pinned draft, with a Warning.
                self._queue_consumers(namespace, name)
            return _requeue_after(plan, deferred)

    def _apply(
        self, owner: dict[str, Any], plan: Any, live: dict[tuple[str, str], dict[str, Any]]
    ) -> tuple[list[Any], int, bool]:
        """(refusals, writes deferred, whether any child was written)."""
        refused, written, deferred = apply_children(self.kube, owner, plan, live)
        for obj in written:  # into the cache at once, so the next pass does not plan them again
            current = live.get(key(obj))
            self.store.write_through(obj, (current or {}).get("metadata", {}).get("resourceVersion"))
        return refused, deferred, bool(written)

    def _burst_of_new_objects(self, body: dict[str, Any]) -> bool:
        """This object's spec was not acted on yet, and other such objects wait in the queue."""
        return _unacted(body) and self.queue.first_lane_waiting()

    def _write_status(self, kind: str, body: dict[str, Any], plan: Any) -> None:
        written = write_status(self.kube, body, plan)
        if written is not None:
            # The watch event of our own write then finds the cache up to date and queues nothing.
            self.store.write_through(written, body["metadata"].get("resourceVersion"))

    def _queue_consumers(self, namespace: str, training: str) -> None:
        for sdd in self.store.all(SDD, namespace):
            if ((sdd.get("spec") or {}).get("draft") or {}).get("fromDraftTraining") == training:
                self.queue.add((SDD, namespace, sdd["metadata"]["name"]))

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

    def monitor_kinds(self) -> set[str]:
        with self._lock:
            fetched_at, kinds = self._monitor_kinds
        if time.monotonic() - fetched_at > MONITOR_KINDS_TTL_S:
            kinds = self.kube.served_kinds(MONITORING_API) & {"ServiceMonitor", "PodMonitor"}
            with self._lock:
                self._monitor_kinds = (time.monotonic(), kinds)
        return kinds

    def _reconcile_serving(self, namespace: str, name: str, fresh: bool) -> float | None:
        with metrics.reconcile_timer(SDD, retried=(Conflict,)):
            body = self._read(SDD, namespace, name, fresh)
            if body is None or body["metadata"].get("deletionTimestamp"):
                metrics.PHASES.set(SDD, namespace, name, None)
                metrics.forget_serving(namespace, name)
                with self._lock:
                    self._counters.pop((namespace, name), None)
                return None
            listed = {
                kind: self.store.owned(kind, namespace, meta.SPEC_DECODE_LABEL, name)
                for kind in ("Deployment", "Service", "Pod", "Job", "NetworkPolicy")
            }
            # Monitors and the disruption budget are few and not watched (monitor CRDs may come and
            # go): listed live.
            selector = f"{meta.SPEC_DECODE_LABEL}={name}"
            listed["PodDisruptionBudget"] = [
                b | {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget"}
                for b in self.kube.list("policy/v1", "PodDisruptionBudget", namespace, selector)
            ]
            kinds = self.monitor_kinds()
            for kind in sorted(kinds):
                listed[kind] = [
                    m | {"apiVersion": MONITORING_API, "kind": kind}
                    for m in self.kube.list(MONITORING_API, kind, namespace, selector)
                ]
            children = split_children(body, listed)
            owned = children.ours
            verify_pods = [p for p in owned["Pod"] if _component(p) == verification.COMPONENT]
            source = (body["spec"].get("draft") or {}).get("fromDraftTraining")
            training = self.store.get(DT, namespace, source) if source else None
            deployments = {d["metadata"]["name"]: d for d in owned["Deployment"]}
            deployment = deployments.get(name)
            now = datetime.now(UTC)
            observed = ServingObserved(
                now=now,
                deployment=deployment,
                canary_deployment=deployments.get(name + CANARY_SUFFIX),
                draft_training=training,
                monitor_kinds=kinds,
                pods=[p for p in owned["Pod"] if _component(p) != verification.COMPONENT],
                counters=self._read_counters(body, owned["Pod"], now),
                verify_jobs={j["metadata"]["name"]: j for j in owned["Job"]},
                verify_pods=verify_pods,
            )
            plan = self._plan_serving(body, observed, owned["NetworkPolicy"], children.foreign)
            live = [o for kind, objects in owned.items() if kind != "Pod" for o in objects]
            observed.refused, deferred, _ = self._apply(body, plan, {key(o): o for o in live})
            if observed.refused:
                # The same decision, with the refusals in its status.
                plan = self._plan_serving(body, observed, owned["NetworkPolicy"], children.foreign)
            self._write_status(SDD, body, plan)
            conditions = {c["type"]: c["status"] for c in plan.status.get("conditions") or []}
            metrics.PHASES.set(
                SDD, namespace, name, "Available" if conditions.get("Available") == "True" else "Unavailable"
            )
            metrics.record_serving(namespace, name, plan.status)
            return _requeue_after(plan, deferred)

    @staticmethod
    def _plan_serving(
        body: dict[str, Any],
        observed: ServingObserved,
        policies: list[dict[str, Any]],
        foreign: list[dict[str, Any]],
    ) -> Any:
        """plan_serving, with the NetworkPolicy and without writes to children of another owner (a
        deleted SpecDecodeDeployment of the same name whose children the garbage collector has not
        removed yet): those wait, with a Warning Event."""
        plan = plan_serving(body, observed)
        plan_network_policy(plan, body, meta.SPEC_DECODE_LABEL, policies)
        for child in withhold_foreign(plan, foreign):
            problem = foreign_problem(child, body)
            plan.events.append(Event("Warning", problem.reason, problem.message))
        return plan

    # ---- live acceptance -------------------------------------------------------------------------

    def _read_counters(
        self, body: dict[str, Any], pods: list[dict[str, Any]], now: datetime
    ) -> History | None:
        """The counter reads of the object's vLLM pods over its live window, with a new read when the
        last is an interval old; None while live acceptance is off."""
        live = LiveAcceptanceSpec.model_validate((body.get("spec") or {}).get("liveAcceptance") or {})
        key_ = (body["metadata"]["namespace"], body["metadata"]["name"])
        if not live.enabled:
            with self._lock:
                self._counters.pop(key_, None)
            return None
        with self._lock:
            history = self._counters.setdefault(key_, History())
        # Ready pods of a revision: a starting or terminating pod's counters are not the service's.
        serving = {
            p["metadata"]["name"]: p
            for p in pods
            if p.get("status", {}).get("podIP")
            and not p["metadata"].get("deletionTimestamp")
            and REVISION_ANNOTATION in (p["metadata"].get("annotations") or {})
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in p.get("status", {}).get("conditions") or []
            )
        }
        last = history.last_read()
        # A little early is fine: requeues land about an interval apart, not exactly.
        if serving and (last is None or (now - last).total_seconds() >= 0.8 * live.interval_seconds):
            if live.prometheus_url:
                reads = read_prometheus_counters(live.prometheus_url, *key_, set(serving))
            else:
                # In parallel: a slow or unreachable pod costs one timeout, not one per pod.
                with ThreadPoolExecutor(max_workers=min(len(serving), COUNTER_READ_WORKERS)) as pool:
                    reads = dict(zip(serving, pool.map(read_pod_counters, serving.values()), strict=True))
            for pod, counters in reads.items():
                if counters is not None:
                    annotations = serving[pod]["metadata"]["annotations"]
                    draft = annotations.get(DRAFT_EXPORT_ANNOTATION)
                    history.add(pod, PodRead(now, annotations[REVISION_ANNOTATION], draft, counters))
        # The canary's analysis may look further back than the live window.
        rollout = RolloutSpec.model_validate((body.get("spec") or {}).get("rollout") or {})
        window_s = live.window_seconds
        if rollout.strategy == "Canary":
            window_s = max(window_s, rollout.canary.analysis_seconds)
        history.prune(now, window_s, set(serving))
        return history


def _unacted(body: dict[str, Any]) -> bool:
    """The object's spec has not been acted on yet: new, or edited since its last status write."""
    return body["metadata"].get("generation") != (body.get("status") or {}).get("observedGeneration")


def _requeue_after(plan: Any, deferred_writes: int) -> float:
    """When to reconcile again (0: on the next event): the plan's wish, sooner for deferred writes."""
    wishes = [plan.requeue_after] if plan.requeue_after else []
    return min([*wishes, DEFERRED_WRITE_RETRY_S]) if deferred_writes else (plan.requeue_after or 0.0)


def read_pod_counters(pod: dict[str, Any]) -> PodCounters | None:
    """A vLLM pod's counters from its /metrics; None when it cannot be read (logged)."""
    url = f"http://{pod['status']['podIP']}:{VLLM_PORT}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=COUNTER_READ_TIMEOUT_S) as response:
            return parse_metrics(response.read().decode())
    except (OSError, ValueError) as error:  # unreachable, slow, or not Prometheus text
        log.info("cannot read %s: %s", url, error)
        return None


def read_prometheus_counters(
    base_url: str, namespace: str, name: str, pods: set[str]
) -> dict[str, PodCounters]:
    """The latest value of each counter per pod, as the user's Prometheus scraped them."""
    samples: dict[str, list[tuple[str, dict[str, str], float]]] = {pod: [] for pod in pods}
    for metric in COUNTERS:
        query = f'{metric}{{namespace="{namespace}",specdecodedeployment="{name}"}}'
        url = f"{base_url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(url, timeout=COUNTER_READ_TIMEOUT_S) as response:
                result = json.loads(response.read())["data"]["result"]
        except (OSError, ValueError, KeyError) as error:
            log.info("cannot query %s: %s", base_url, error)
            return {}
        for series in result:
            labels = series["metric"]
            if labels.get("pod") in samples:
                samples[labels["pod"]].append((metric, labels, float(series["value"][1])))
    return {pod: counters_from_samples(found) for pod, found in samples.items() if found}


def _component(obj: dict[str, Any]) -> str | None:
    return (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
