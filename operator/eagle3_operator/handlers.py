"""kopf wiring: watch events of our resources and of their children trigger the Reconciler.

Only event handlers (plus the Reconciler's own periodic resync): kopf then keeps no per-handler
progress and adds no finalizer, so an unchanged object is never written to, and deleting an
object never waits for the operator (children go by owner references).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from eagle3_operator import GROUP, VERSION
from eagle3_operator.api.draft_training import PLURAL as DT_PLURAL
from eagle3_operator.api.spec_decode_deployment import PLURAL as SDD_PLURAL
from eagle3_operator.kube import Kube
from eagle3_operator.reconcile import meta
from eagle3_operator.reconciler import Reconciler

log = logging.getLogger(__name__)
FINALIZER = "eagle3.ai/finalizer"
MANAGED = f"app.kubernetes.io/managed-by={meta.MANAGED_BY}"
RESYNC_INTERVAL_S = 120.0
_state: dict[str, Reconciler] = {}


def reconciler() -> Reconciler:
    if "reconciler" not in _state:
        _state["reconciler"] = Reconciler(Kube())
    return _state["reconciler"]


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings per docs/architecture.md: own domain, bounded workers, watch timeouts."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="eagle3.ai")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="eagle3.ai", key="last-handled-configuration"
    )
    # Watches behind load balancers can freeze silently: reconnect well before the usual 5-10 min idle cuts.
    settings.watching.server_timeout = 270
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    # Server-side label selectors: the operator never streams the cluster's other pods, Jobs, Deployments.
    # Its own pods: stage results and progress, and why a pod is stuck (unschedulable, image pulls).
    settings.watching.label_selectors["pods"] = MANAGED
    settings.watching.label_selectors["jobs"] = meta.DRAFT_TRAINING_LABEL
    settings.watching.label_selectors["deployments"] = MANAGED
    settings.queueing.worker_limit = 64
    settings.execution.max_workers = 16
    settings.networking.request_timeout = 60
    # Only warnings from kopf's own logs become Events; the operator posts its transitions itself.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "eagle3-operator"
    reconciler().start_resync(RESYNC_INTERVAL_S)


@kopf.on.cleanup()
def stop(**_: Any) -> None:
    reconciler().stop_resync()


def _is_deleted(event: dict[str, Any]) -> bool:
    return event.get("type") == "DELETED"


@kopf.on.event(GROUP, VERSION, DT_PLURAL)
def draft_training_event(event: dict[str, Any], body: kopf.Body, name: str, namespace: str, **_: Any) -> None:
    reconciler().track("DraftTraining", namespace, name, deleted=_is_deleted(event))
    if not _is_deleted(event) and reconciler().caused_by_us("DraftTraining", dict(body)):
        return
    # On DELETED the reconcile finds nothing and clears the object's metrics.
    reconciler().reconcile_training(namespace, name)


@kopf.on.event("batch", "v1", "jobs", labels={meta.DRAFT_TRAINING_LABEL: kopf.PRESENT})
@kopf.on.event("", "v1", "pods", labels={"app.kubernetes.io/managed-by": meta.MANAGED_BY})
@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": meta.MANAGED_BY})
def child_event(labels: dict[str, str], namespace: str, **_: Any) -> None:
    """A child changed: reconcile the object it belongs to."""
    if training := labels.get(meta.DRAFT_TRAINING_LABEL):
        reconciler().reconcile_training(namespace, training)
    if serving := labels.get(meta.SPEC_DECODE_LABEL):
        reconciler().reconcile_serving(namespace, serving)


@kopf.on.event(GROUP, VERSION, SDD_PLURAL)
def spec_decode_event(event: dict[str, Any], body: kopf.Body, name: str, namespace: str, **_: Any) -> None:
    reconciler().track("SpecDecodeDeployment", namespace, name, deleted=_is_deleted(event))
    reconciler().note_serving(dict(body), deleted=_is_deleted(event))
    if not _is_deleted(event) and not reconciler().caused_by_us("SpecDecodeDeployment", dict(body)):
        reconciler().reconcile_serving(namespace, name)
