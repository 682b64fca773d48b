"""The objects the operator's watches deliver, kept for reconciles to read (an informer's store).

kopf fills it: an index handler per watched kind upserts every object it lists or sees change,
and kopf calls no other handler before every watched kind's initial listing has been indexed, so
the store is complete before the first reconcile reads it. Reconciles read their object and its
children here instead of 1 GET and 5 LISTs each.

Objects are kept as `KEPT` projects them: their metadata whole but `managedFields`, and of Pods and
Jobs (the most numerous children, with the largest bodies) only the fields the planners read.
Returned objects are shared: callers must not change them.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from eagle3_api.progress import PROGRESS_ANNOTATION
from eagle3_operator.reconcile import meta

OWNER_LABELS = (meta.DRAFT_TRAINING_LABEL, meta.SPEC_DECODE_LABEL)
# What a change to an object was, as upsert saw it.
NEW, CHANGED, PROGRESS, UNCHANGED = "new", "changed", "progress", "unchanged"

WHOLE = None  # keep the field as it is
# Per kind, the top-level fields kept besides metadata (a dict keeps only its keys, and applies to
# each item of a list); a kind not here is kept whole. Deployments, Services and NetworkPolicies stay
# whole: apply.contains compares what the operator sets with them. PVCs and our own resources are
# few or small.
KEPT: dict[str, dict[str, Any]] = {
    # The operator never writes pods: their spec is never read.
    "Pod": {
        "status": {
            "phase": WHOLE,  # Job outcomes, live pods, stuck detection
            "reason": WHOLE,  # a failed pod's reason and message, without a termination message
            "message": WHOLE,
            "podIP": WHOLE,  # live acceptance reads each vLLM pod's /metrics
            "conditions": WHOLE,  # PodScheduled=False Unschedulable (stuck), Ready (live acceptance)
            # The stage container's termination message is its StageResult; waiting reasons and the
            # last exit say why a container is stuck.
            "initContainerStatuses": {"name": WHOLE, "state": WHOLE, "lastState": WHOLE},
            "containerStatuses": {"name": WHOLE, "state": WHOLE, "lastState": WHOLE},
        }
    },
    # Stage and verify Jobs are only created, never compared: not their pod template.
    "Job": {
        "spec": {
            "activeDeadlineSeconds": WHOLE,  # told in the DeadlineExceeded failure
            "suspend": WHOLE,  # a suspended Job lacks pods on purpose
        },
        "status": WHOLE,  # conditions (Complete, Failed), completionTime
    },
}


def _ident(body: dict[str, Any]) -> tuple[str, str]:
    return body["metadata"].get("namespace") or "", body["metadata"]["name"]


def _project(value: Any, kept: dict[str, Any] | None) -> Any:
    if kept is WHOLE:
        return value
    if isinstance(value, list):
        return [_project(item, kept) for item in value]
    if isinstance(value, dict):
        return {k: _project(value[k], sub) for k, sub in kept.items() if k in value}
    return value


def project(kind: str, api_version: str, body: dict[str, Any]) -> dict[str, Any]:
    """The object as the store keeps it (see KEPT)."""
    fields = {k: v for k, v in body.items() if k not in ("apiVersion", "kind", "metadata")}
    if kind in KEPT:
        fields = _project(fields, KEPT[kind])
    metadata = {k: v for k, v in body["metadata"].items() if k != "managedFields"}
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata} | fields


def _without_progress(body: dict[str, Any]) -> dict[str, Any]:
    metadata = dict(body["metadata"])
    metadata.pop("resourceVersion", None)
    annotations = dict(metadata.get("annotations") or {})
    annotations.pop(PROGRESS_ANNOTATION, None)
    metadata["annotations"] = annotations
    return body | {"metadata": metadata}


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = defaultdict(dict)
        # (kind, namespace, owner label, its value) -> names
        self._by_owner: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)

    def upsert(self, kind: str, api_version: str, body: dict[str, Any]) -> str:
        """Keep the object; NEW, UNCHANGED (same resourceVersion), PROGRESS (only the progress
        annotation changed) or CHANGED."""
        obj = project(kind, api_version, body)
        metadata = obj["metadata"]
        ident = _ident(obj)
        with self._lock:
            old = self._objects[kind].get(ident)
            self._objects[kind][ident] = obj
            if old is not None:
                self._unindex(kind, old)
            self._index(kind, obj)
        if old is None:
            return NEW
        if old["metadata"].get("resourceVersion") == metadata.get("resourceVersion"):
            return UNCHANGED
        if kind == "Pod" and _without_progress(old) == _without_progress(obj):
            return PROGRESS
        return CHANGED

    def write_through(self, obj: dict[str, Any], expected_version: str | None) -> None:
        """Keep what our own write returned, unless the watch already brought a newer version than the
        one we wrote over (`expected_version`, None: the object did not exist)."""
        current = self.get(obj["kind"], *_ident(obj))
        if (current or {}).get("metadata", {}).get("resourceVersion") == expected_version:
            self.upsert(obj["kind"], obj["apiVersion"], obj)

    def delete(self, kind: str, body: dict[str, Any]) -> None:
        ident = _ident(body)
        with self._lock:
            old = self._objects[kind].get(ident)
            # A re-created object of the same name may have arrived already: only this uid goes.
            if old is not None and old["metadata"].get("uid") == body["metadata"].get("uid"):
                del self._objects[kind][ident]
                self._unindex(kind, old)

    def _index(self, kind: str, obj: dict[str, Any]) -> None:
        labels = obj["metadata"].get("labels") or {}
        namespace, name = _ident(obj)
        for label in OWNER_LABELS:
            if label in labels:
                self._by_owner[(kind, namespace, label, labels[label])].add(name)

    def _unindex(self, kind: str, obj: dict[str, Any]) -> None:
        labels = obj["metadata"].get("labels") or {}
        namespace, name = _ident(obj)
        for label in OWNER_LABELS:
            if label in labels:
                key = (kind, namespace, label, labels[label])
                self._by_owner[key].discard(name)
                if not self._by_owner[key]:
                    del self._by_owner[key]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects[kind].get((namespace, name))

    def owned(self, kind: str, namespace: str, label: str, owner: str) -> list[dict[str, Any]]:
        """Objects of a kind labelled `label=owner` (the children of that owner)."""
        with self._lock:
            objects = self._objects[kind]
            return [
                objects[(namespace, n)]
                for n in sorted(self._by_owner.get((kind, namespace, label, owner), ()))
            ]

    def all(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [o for (ns, _), o in self._objects[kind].items() if namespace is None or ns == namespace]

    def size(self) -> int:
        with self._lock:
            return sum(len(objects) for objects in self._objects.values())
