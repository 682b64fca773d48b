"""Children matched by the owner's uid, per-object workspace directories, spec.restart and the
NetworkPolicy, in the planners (no cluster; test_children_cluster.py runs them against the API server)."""

from __future__ import annotations

import copy

from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.network_policy import network_policy, plan_network_policy
from eagle3_operator.reconcile.ownership import FOREIGN_CHILD, split_children, withhold_foreign
from eagle3_operator.reconcile.plan import Plan
from eagle3_operator.reconcile.training import TrainingObserved, plan_training

from eagle3_api.common import NetworkPolicySpec
from tests.operator import fakes
from tests.operator.test_training_unit import Cluster


def _child(kind: str, name: str, owner_uid: str | None, created: str = "2026-11-29T08:00:00Z") -> dict:
    metadata = {"name": name, "uid": f"{name}-uid", "creationTimestamp": created, "labels": {}}
    if owner_uid:
        metadata["ownerReferences"] = [{"uid": owner_uid, "controller": True, "kind": "X", "name": "n"}]
    return {"kind": kind, "metadata": metadata}


def _owner(uid: str = "uid-new", created: str = "2026-11-29T09:00:00Z") -> dict:
    return {"kind": "DraftTraining", "metadata": {"name": "llama", "uid": uid, "creationTimestamp": created}}


def test_children_are_ours_only_when_their_controller_has_our_uid():
    ours_job, old_job = _child("Job", "llama-generate", "uid-new"), _child("Job", "llama-train", "uid-old")
    orphan = _child("Deployment", "llama-target", None)
    retained_claim = _child("PersistentVolumeClaim", "llama-workspace", None)
    old_claim = _child("PersistentVolumeClaim", "other-workspace", "uid-old")
    pods = [
        _child("Pod", "of-ours", ours_job["metadata"]["uid"]),  # older than the owner, but its Job is ours
        _child("Pod", "of-old-job", old_job["metadata"]["uid"], created="2026-11-29T09:00:05Z"),
        _child("Pod", "gone-job-pod", "uid-of-a-deleted-job"),  # its Job is gone; older than the owner
        _child("Pod", "server", "some-replicaset", created="2026-11-29T09:00:01Z"),
    ]
    listed = {
        "Job": [ours_job, old_job],
        "Deployment": [orphan],
        "PersistentVolumeClaim": [retained_claim, old_claim],
        "Pod": pods,
    }
    children = split_children(_owner(), listed)
    assert children.ours["Job"] == [ours_job]
    assert children.ours["Deployment"] == []
    assert children.ours["PersistentVolumeClaim"] == [retained_claim]  # retainOnDelete leaves it unowned
    assert [p["metadata"]["name"] for p in children.ours["Pod"]] == ["of-ours", "server"]
    assert children.foreign == [old_job, orphan, old_claim]


def test_a_foreign_child_is_never_written_deleted_or_read_and_the_stage_says_why():
    """The training was deleted and created again: the first object's generate Job (Succeeded, with a
    StageResult) is still there under the name the new one wants."""
    first = Cluster(fakes.draft_training())
    first.reconcile()
    first.reconcile()
    (old_job,) = first.running_jobs()
    first.finish(old_job)
    body = fakes.draft_training()
    body["metadata"]["uid"] = "uid-2"
    old_children = [first.observed.jobs["llama-generate"], *first.observed.deployments.values()]
    old_children[0]["metadata"]["uid"] = "old-generate-job-uid"
    for pod in first.observed.pods:  # as the Job controller creates them
        pod["metadata"]["ownerReferences"] = [{"uid": "old-generate-job-uid", "controller": True}]
    listed = {"Job": [old_children[0]], "Deployment": old_children[1:], "Pod": first.observed.pods}
    children = split_children(body, listed)
    assert children.ours["Job"] == [] and children.ours["Pod"] == []
    observed = TrainingObserved(now=fakes.NOW, foreign=children.foreign)

    plan = plan_training(copy.deepcopy(body), observed)
    written = {(o["kind"], o["metadata"]["name"]) for o in plan.create + plan.sync}
    assert ("Deployment", "llama-target") not in written and ("Service", "llama-target") in written
    target = next(c for c in plan.status["conditions"] if c["type"] == "TargetReady")
    assert target["reason"] == FOREIGN_CHILD
    assert (
        "Deployment llama-target belongs to another owner (uid uid-1; an earlier DraftTraining"
        in (target["message"])
    )
    assert "waiting for the garbage collector" in target["message"]
    assert any(e.reason == FOREIGN_CHILD and e.type == "Warning" for e in plan.events)
    assert plan.requeue_after is not None and plan.requeue_after <= 30
    assert plan.status["workspacePath"] == "runs/uid-2"

    # Once the target is ours and ready, the old generate Job still blocks generate: its result is
    # never read as this object's.
    body["status"] = plan.status
    observed.deployments = {
        "llama-target": fakes.ready_deployment(first.observed.deployments["llama-target"])
    }
    observed.deployments["llama-target"]["metadata"]["ownerReferences"][0]["uid"] = "uid-2"
    observed.foreign = [old_children[0]]
    plan = plan_training(copy.deepcopy(body), observed)
    assert not any(o["kind"] == "Job" for o in plan.create)
    generated = next(c for c in plan.status["conditions"] if c["type"] == "Generated")
    assert generated["reason"] == FOREIGN_CHILD and "Job llama-generate" in generated["message"]
    assert next(s for s in plan.status["stages"] if s["name"] == "generate")["state"] != "Succeeded"


def test_withhold_foreign_keeps_deletions_off_an_orphan():
    orphan = _child("Job", "llama-generate", None)
    plan = Plan(delete=[{"apiVersion": "batch/v1", "kind": "Job", "name": "llama-generate"}])
    assert withhold_foreign(plan, [orphan]) == [] and plan.delete == []


def test_each_object_works_in_its_own_directory_and_keeps_it():
    plan = Cluster(fakes.draft_training()).run_to_end()
    assert plan.status["workspacePath"] == "runs/uid-1"
    assert plan.status["export"]["path"].startswith("runs/uid-1/export/sha256-")
    # An object that started before there were per-object directories keeps the claim's root.
    legacy = fakes.draft_training()
    legacy["status"] = {
        "phase": "Running",
        "stages": [
            {"name": "generate", "state": "Running", "attempt": 0, "jobs": ["llama-generate"], "message": ""}
        ],
    }
    plan = plan_training(legacy, TrainingObserved(now=fakes.NOW))
    assert plan.status["workspacePath"] == "" and plan.status["restart"] == 0


def test_a_raised_restart_trains_again_from_the_start_in_a_new_directory():
    cluster = Cluster(fakes.draft_training())
    done = cluster.run_to_end()
    assert done.status["phase"] == "Succeeded"
    old_jobs = set(cluster.observed.jobs)
    cluster.body["spec"]["target"]["model"] = "org/other-model"
    cluster.body["spec"]["restart"] = 1
    cluster.body["metadata"]["generation"] = 2
    plan = cluster.reconcile()
    assert {d["name"] for d in plan.delete} == old_jobs
    for stale in ("export", "checkpoints", "bestCheckpoint", "completionTime"):
        assert stale not in plan.status, stale
    assert plan.status["phase"] == "Pending" and plan.status["restart"] == 1
    assert plan.status["workspacePath"] == "runs/uid-1-restart-1"
    assert all(s["state"] == "Pending" and s["attempt"] == 1 for s in plan.status["stages"])
    assert any(e.reason == "Restarted" for e in plan.events)
    ready = next(c for c in plan.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    plan = cluster.reconcile()
    (generate,) = cluster.running_jobs()
    assert generate["metadata"]["name"] == "llama-generate-r1"
    command = fakes.command(generate)
    assert command[command.index("--workspace") + 1] == "/workspace/runs/uid-1-restart-1"
    assert command[command.index("--model") + 1] == "org/other-model"
    final = cluster.run_to_end()
    assert final.status["export"]["path"].startswith("runs/uid-1-restart-1/export/")


def test_network_policy_admits_own_pods_everywhere_and_clients_on_the_http_port_only():
    body = fakes.draft_training(
        networkPolicy={"enabled": True, "allowedClients": [{"podSelector": {"matchLabels": {"app": "gw"}}}]}
    )
    plan = plan_training(body, TrainingObserved(now=fakes.NOW))
    (policy,) = [o for o in plan.sync if o["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["name"] == "llama-pods"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    own = {"podSelector": {"matchLabels": {meta.DRAFT_TRAINING_LABEL: "llama"}}}
    assert policy["spec"] == {
        "podSelector": own["podSelector"],
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [own]},
            {
                "from": [{"podSelector": {"matchLabels": {"app": "gw"}}}],
                "ports": [{"protocol": "TCP", "port": 8000}],
            },
        ],
    }
    # The stage pods, the servers and the trainer ranks all carry the label the policy admits.
    cluster = Cluster(body)
    cluster.reconcile()
    cluster.reconcile()
    (job,) = cluster.running_jobs()
    assert job["spec"]["template"]["metadata"]["labels"][meta.DRAFT_TRAINING_LABEL] == "llama"
    deployment = cluster.observed.deployments["llama-target"]
    assert deployment["spec"]["template"]["metadata"]["labels"][meta.DRAFT_TRAINING_LABEL] == "llama"

    # Turned off: ours goes; none existing, nothing to do.
    body["spec"]["networkPolicy"] = {"enabled": False}
    off = Plan()
    plan_network_policy(off, body, meta.DRAFT_TRAINING_LABEL, [policy])
    assert off.delete == [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": "llama-pods"}
    ]
    nothing = Plan()
    plan_network_policy(nothing, body, meta.DRAFT_TRAINING_LABEL, [])
    assert nothing.delete == [] and nothing.sync == []


def test_serving_network_policy_without_clients_admits_only_its_own_pods():
    body = fakes.spec_decode(networkPolicy={"enabled": True})
    policy = network_policy(body, meta.SPEC_DECODE_LABEL, NetworkPolicySpec(enabled=True))
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {meta.SPEC_DECODE_LABEL: "chat"}}}]}
    ]
