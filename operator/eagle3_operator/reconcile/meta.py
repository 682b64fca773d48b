"""Names, labels and owner references of the children the operator creates."""

from __future__ import annotations

import hashlib
from typing import Any

from eagle3_api import API_VERSION

MANAGED_BY = "eagle3-operator"
DRAFT_TRAINING_LABEL = "eagle3.ai/draft-training"
SPEC_DECODE_LABEL = "eagle3.ai/spec-decode-deployment"
STAGE_LABEL = "eagle3.ai/stage"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# On a Deployment: the hash of the pod template the operator last applied. A live Deployment with
# another hash has not received the new template yet, however settled its status looks.
TEMPLATE_HASH_ANNOTATION = "eagle3.ai/pod-template-hash"
MAX_NAME = 63


def dns_label(name: str) -> str:
    """A name that fits a DNS label; long names keep a hash so they stay unique."""
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME - 9].rstrip('-')}-{digest}"


def labels(instance: str, component: str, owner_label: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "eagle3",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "eagle3",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        owner_label: instance,
    }


def selector_labels(instance: str, component: str, owner_label: str) -> dict[str, str]:
    """The stable subset used in Deployment selectors (selectors are immutable)."""
    return {
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        owner_label: instance,
    }


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    owner: dict[str, Any], name: str, obj_labels: dict[str, str], *, owned: bool = True
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": owner["metadata"]["namespace"], "labels": obj_labels}
    if owned:
        meta["ownerReferences"] = [owner_reference(owner)]
    return meta
