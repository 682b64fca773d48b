"""Which labelled children are really an object's own: matched by the owner's uid, not by name.

A child carries its owner's name in a label, but a name outlives its object: a DraftTraining deleted
and created again under the same name finds the first one's Jobs, Deployments and Services until
the garbage collector removes them (seconds, or never for children orphaned with
`propagationPolicy: Orphan`). Read as ours, an old Job's StageResult would pass for a stage of the
new object. So a child is ours only when its controller ownerReference has our uid; a Job's pods are
ours when their Job is. A foreign child under a name we want is never read, patched, adopted or
deleted: the owner waits (a condition says why) until it is gone; an orphan stays until a person
deletes it. The one exception is an unowned workspace PVC: the operator leaves it unowned on purpose
(`storage.retainOnDelete`), it holds user data, and each object works in its own directory of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.stuck import Problem

FOREIGN_CHILD = "ChildOfAnotherOwner"  # condition reason and Warning Event reason
# Without a watch event (an orphan is never deleted by the garbage collector), look again this often.
FOREIGN_RETRY_S = 30.0


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's controller (ownerReferences[].controller), None when it has none."""
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def _created_before(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    created, born = obj["metadata"].get("creationTimestamp"), owner["metadata"].get("creationTimestamp")
    # RFC 3339 in UTC with a Z, as the API server writes it: comparable as text.
    return bool(created and born and created < born)


@dataclass
class Children:
    """An owner's labelled children, split by ownership (kind -> objects)."""

    ours: dict[str, list[dict[str, Any]]]
    foreign: list[dict[str, Any]]


def split_children(owner: dict[str, Any], listed: dict[str, list[dict[str, Any]]]) -> Children:
    """Split what the owner label lists into the owner's own children and foreign ones.

    Pods are not the owner's direct children: a Job's pods are ours when the Job is; a Deployment's
    pods (through a ReplicaSet the operator does not watch) when they are not older than the owner,
    which is all a pod can show of its lineage (they are read only to say why a server does not
    start). Foreign pods are dropped, not reported: their Job or Deployment is.
    """
    uid = owner["metadata"]["uid"]
    ours: dict[str, list[dict[str, Any]]] = {}
    foreign: list[dict[str, Any]] = []
    for kind, objects in listed.items():
        if kind == "Pod":
            continue
        ours[kind] = []
        for obj in objects:
            owner_uid = controller_uid(obj)
            if owner_uid == uid or (kind == "PersistentVolumeClaim" and owner_uid is None):
                ours[kind].append(obj)
            else:
                foreign.append(obj)
    if "Pod" in listed:
        jobs = {j["metadata"]["uid"] for j in ours.get("Job", [])}
        foreign_jobs = {j["metadata"]["uid"] for j in foreign if j["kind"] == "Job"}
        ours["Pod"] = [
            p
            for p in listed["Pod"]
            if controller_uid(p) in jobs
            or (controller_uid(p) not in foreign_jobs and not _created_before(p, owner))
        ]
    return Children(ours, foreign)


def foreign_problem(child: dict[str, Any], owner: dict[str, Any]) -> Problem:
    owner_uid = controller_uid(child)
    whose = (
        f"another owner (uid {owner_uid}; an earlier {owner['kind']} of this name)"
        if owner_uid
        else "no owner (it was orphaned)"
    )
    wait = (
        "waiting for the garbage collector to remove it"
        if owner_uid
        else "delete it, or create this object under another name"
    )
    return Problem(
        FOREIGN_CHILD,
        f"{child['kind']} {child['metadata']['name']} belongs to {whose}, not to this one: {wait}",
    )


def withhold_foreign(plan: Plan, foreign: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Take out of the plan every write or deletion of a child whose name a foreign child holds;
    the foreign children that held up a desired one (component label -> why is the caller's)."""
    taken = {(c["kind"], c["metadata"]["name"]): c for c in foreign}
    blocking: list[dict[str, Any]] = []

    def free(obj: dict[str, Any]) -> bool:
        holder = taken.get((obj["kind"], obj["metadata"]["name"]))
        if holder is not None and holder not in blocking:
            blocking.append(holder)
        return holder is None

    plan.create = [o for o in plan.create if free(o)]
    plan.sync = [o for o in plan.sync if free(o)]
    plan.delete = [d for d in plan.delete if (d["kind"], d["name"]) not in taken]
    if blocking:
        plan.requeue_after = min(plan.requeue_after or FOREIGN_RETRY_S, FOREIGN_RETRY_S)
    return blocking
