"""Carry out a Plan with as few writes as possible: nothing is written for an object already as desired."""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime
from typing import Any

from eagle3_operator.kube import FIELD_MANAGER, ApiError, Kube, NamespaceTerminating
from eagle3_operator.reconcile.plan import Plan, iso
from eagle3_operator.reconcile.stuck import Refusal

log = logging.getLogger(__name__)
INSTANCE = os.environ.get("POD_NAME") or socket.gethostname()
# The API server's OwnerReferencesPermissionEnforcement refuses `blockOwnerDeletion` while its own
# discovery cache does not know the owner's kind yet: up to half a minute after the chart installs
# the CRDs (kube-apiserver refreshes that cache periodically). A wait, not a refusal worth a Warning:
# the write is tried again soon.
UNDISCOVERED_OWNER = "cannot find RESTMapping"


def contains(live: Any, desired: Any) -> bool:
    """True when every field we set has our value in the live object (the server adds defaults)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(map(contains, live, desired))
    return live == desired


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch (RFC 7386) of the status keys that changed, None for removed ones.

    Objects are diffed key by key, since a merge patch merges them and would keep a nested key the
    new value lacks; lists such as conditions go whole.
    """
    patch = {}
    for k in sorted(set(old) | set(new)):
        before, after = old.get(k), new.get(k)
        if after != before:
            both_objects = isinstance(before, dict) and isinstance(after, dict)
            patch[k] = status_patch(before, after) if both_objects else after
    return patch


# Fields the API server refuses to change once set, by kind: a child whose desired value differs is
# deleted and created again (a Service made before the operator's servers went headless keeps its
# ClusterIP otherwise, and every apply would be refused).
IMMUTABLE: dict[str, tuple[tuple[str, ...], ...]] = {"Service": (("spec", "clusterIP"),)}


def _field(obj: dict[str, Any], path: tuple[str, ...]) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, dict) else None
    return obj


def must_replace(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    """True when `desired` sets an immutable field to another value than `live` has."""
    return any(
        _field(desired, path) is not None and _field(desired, path) != _field(live, path)
        for path in IMMUTABLE.get(desired["kind"], ())
    )


def key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _refusal(obj: dict[str, Any], error: ApiError) -> Refusal:
    component = (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component", "")
    return Refusal(obj["kind"], obj["metadata"]["name"], component, error.detail)


def apply_children(
    kube: Kube, owner: dict[str, Any], plan: Plan, live: dict[tuple[str, str], dict[str, Any]]
) -> tuple[list[Refusal], list[dict[str, Any]], int]:
    """Create, update and delete children; the writes the API server refused (for the status), the
    objects it returned for the writes it took, and how many writes wait for the API server to
    discover the owner's kind (to be tried again soon).

    A refused child (quota, admission, validation) does not stop the others: each is independent,
    and the refusal is reported on the owner instead of failing the reconcile.
    """
    writes = [(obj, "creating", kube.create) for obj in plan.create if key(obj) not in live]
    for obj in plan.sync:
        current = live.get(key(obj))
        # List items carry no apiVersion/kind; everything else we set must be there as we set it.
        wanted = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        if current is not None and must_replace(current, obj):
            log.info("replacing %s %s: an immutable field changes", *key(obj))
            kube.delete(
                obj["apiVersion"], obj["kind"], owner["metadata"]["namespace"], obj["metadata"]["name"]
            )
            current = None
        if current is None:
            writes.append((obj, "creating", kube.create))
        elif not contains(current, wanted):
            writes.append((obj, "updating", kube.apply_created))
    refused, written, deferred = [], [], 0
    for obj, verb, write in writes:
        log.info("%s %s %s", verb, obj["kind"], obj["metadata"]["name"])
        try:
            result = write(obj)
        except NamespaceTerminating:
            raise
        except ApiError as error:
            if UNDISCOVERED_OWNER in error.detail:
                log.info("the API server does not know the owner's kind yet; %s %s later", *key(obj))
                deferred += 1
            else:
                refused.append(_refusal(obj, error))
        else:
            if result:  # None: created meanwhile by someone else (the watch brings it)
                written.append(result)
    namespace = owner["metadata"]["namespace"]
    for gone in plan.delete:
        log.info("deleting %s %s", gone["kind"], gone["name"])
        kube.delete(gone["apiVersion"], gone["kind"], namespace, gone["name"])
    for refusal in refused:
        log.warning("the API server refused %s %s: %s", refusal.kind, refusal.name, refusal.message)
    return refused, written, deferred


def write_status(kube: Kube, owner: dict[str, Any], plan: Plan) -> dict[str, Any] | None:
    """Patch the status keys that changed, then post the plan's Events; the object as written.

    The status is the state machine's memory: it is written only over the version it was planned
    from (resourceVersion precondition). A Conflict leaves it, and the Events, unwritten, for the
    caller to plan again from the newer object.
    """
    written = None
    patch = status_patch(owner.get("status") or {}, plan.status)
    if patch:
        meta = owner["metadata"]
        written = kube.patch_status(
            owner["apiVersion"],
            owner["kind"],
            meta["namespace"],
            meta["name"],
            patch,
            meta["resourceVersion"],
        )
    for event in plan.events:
        post_event(kube, owner, event.type, event.reason, event.message)
    return written


def post_event(kube: Kube, owner: dict[str, Any], type_: str, reason: str, message: str) -> None:
    meta = owner["metadata"]
    now = iso(datetime.now(UTC))
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": INSTANCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.post_event(event)
    except Exception as exc:  # noqa: BLE001 - an event is never worth failing the reconcile for
        log.warning("could not post event %s for %s: %s", reason, meta["name"], exc)
