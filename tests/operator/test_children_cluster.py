"""Children you can trust, on the test bed: the operator (a real process) against a real API server,
garbage collector and Job controller; kwok pods (tests/operator/test_training_cluster.py says how).

The test bed's bridge CNI does not enforce NetworkPolicies: the policy is checked as the API server
stores it (valid, owned, selecting the right pods), not by trying connections.
"""

from __future__ import annotations

import time

import pytest
from eagle3_operator.reconcile.training_children import server_service

from eagle3_api.draft_training import DraftTraining
from tests.operator import fakes
from tests.operator.harness import (
    complete_stage,
    condition,
    draft_training_path,
    drive_to_success,
    get,
    jobs_of,
    prepare_training_volumes,
    spec_decode_path,
    stage_record,
    training_body,
    wait_stage_succeeded,
)
from tests.support.cluster import ApiError, wait_until

HOLD = "eagle3.ai/test-hold"  # a finalizer that keeps a deleted Job, as a slow garbage collector would


def test_a_recreated_training_never_reads_the_children_of_its_predecessor(
    crds, manual_namespace, start_operator
):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    start_operator(ns)
    cluster.request("POST", draft_training_path(ns), training_body(ns))
    complete_stage(cluster, ns, "generate", ["llama-generate"])
    first = wait_stage_succeeded(cluster, ns, "llama", "generate")
    old_uid = first["metadata"]["uid"]
    assert first["status"]["workspacePath"] == f"runs/{old_uid}"
    job_path = f"/apis/batch/v1/namespaces/{ns}/jobs/llama-generate"
    cluster.request("PATCH", job_path, {"metadata": {"finalizers": [HOLD]}})

    # Deleted and created again under the same name while the old, finished generate Job lingers.
    cluster.request("DELETE", draft_training_path(ns, "llama"))
    wait_until(
        lambda: get(cluster, draft_training_path(ns, "llama")) is None, timeout=30, what="old object gone"
    )
    cluster.request("POST", draft_training_path(ns), training_body(ns))

    def blocked() -> dict | None:
        body = cluster.request("GET", draft_training_path(ns, "llama"))
        return body if condition(body, "Generated").get("reason") == "ChildOfAnotherOwner" else None

    second = wait_until(blocked, timeout=60, interval=0.3, what="generate held up by the old Job")
    new_uid = second["metadata"]["uid"]
    assert new_uid != old_uid
    message = condition(second, "Generated")["message"]
    assert f"Job llama-generate belongs to another owner (uid {old_uid}" in message, message
    assert "waiting for the garbage collector" in message
    # The old Job's StageResult is not this object's: generate has not succeeded.
    assert stage_record(second, "generate").get("state") != "Succeeded"
    assert second["status"]["workspacePath"] == f"runs/{new_uid}"
    old_job = cluster.request("GET", job_path)
    assert old_job["metadata"]["ownerReferences"][0]["uid"] == old_uid, "the operator never adopts it"

    # Once the garbage collector has removed it, the new object runs its own generate Job.
    cluster.request("PATCH", job_path, {"metadata": {"finalizers": []}})

    def own_job() -> dict | None:
        job = jobs_of(cluster, ns, "llama").get("llama-generate")
        return job if job and job["metadata"]["ownerReferences"][0]["uid"] == new_uid else None

    job = wait_until(own_job, timeout=60, interval=0.3, what="the new object's generate Job")
    assert fakes.flag(fakes.command(job), "--workspace") == f"/workspace/runs/{new_uid}"
    complete_stage(cluster, ns, "generate", ["llama-generate"])
    body = wait_stage_succeeded(cluster, ns, "llama", "generate")
    assert condition(body, "Generated")["reason"] == "Completed"


def test_a_finished_training_changes_target_only_through_a_restart(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    start_operator(ns)
    policy = {"enabled": True, "allowedClients": [{"namespaceSelector": {"matchLabels": {"team": "ml"}}}]}
    cluster.request("POST", draft_training_path(ns), training_body(ns, networkPolicy=policy))
    path = draft_training_path(ns, "llama")

    policy_path = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/llama-pods"
    stored = wait_until(lambda: get(cluster, policy_path), timeout=30, what="the NetworkPolicy")
    done = drive_to_success(cluster, ns, "llama")
    uid = done["metadata"]["uid"]
    assert stored["metadata"]["ownerReferences"][0]["uid"] == uid
    assert stored["spec"]["podSelector"] == {"matchLabels": {"eagle3.ai/draft-training": "llama"}}
    assert stored["spec"]["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert done["status"]["export"]["path"].startswith(f"runs/{uid}/export/")

    # The API server refuses a new target for a finished run (CEL), with the way out in its message.
    with pytest.raises(ApiError) as refused:
        cluster.request("PATCH", path, {"spec": {"target": {"model": "org/other-model"}}})
    assert refused.value.status == 422
    assert "spec.target cannot change once a stage has run" in str(refused.value), refused.value
    assert "Set spec.restart to a higher value" in str(refused.value)

    cluster.request("PATCH", path, {"spec": {"target": {"model": "org/other-model"}, "restart": 1}})

    def restarted() -> dict | None:
        body = cluster.request("GET", path)
        return body if (body.get("status") or {}).get("restart") == 1 else None

    body = wait_until(restarted, timeout=30, interval=0.3, what="the new run")
    # No result of the old run is left to describe a draft trained for the old target.
    assert "export" not in body["status"] and "bestCheckpoint" not in body["status"]
    assert condition(body, "Ready")["status"] == "False"
    job = wait_until(
        lambda: jobs_of(cluster, ns, "llama").get("llama-generate-r1"), timeout=30, what="the new run's Job"
    )
    assert fakes.flag(fakes.command(job), "--workspace") == f"/workspace/runs/{uid}-restart-1"
    assert fakes.flag(fakes.command(job), "--model") == "org/other-model"
    wait_until(
        lambda: "llama-train" not in jobs_of(cluster, ns, "llama"), timeout=30, what="old Jobs deleted"
    )

    # Turned off, the policy goes.
    cluster.request("PATCH", path, {"spec": {"networkPolicy": {"enabled": False}}})
    wait_until(lambda: get(cluster, policy_path) is None, timeout=30, what="the NetworkPolicy removed")

    # A SpecDecodeDeployment's: its vLLM pods admit the listed clients on the HTTP port.
    serving = fakes.spec_decode(networkPolicy=policy)
    serving["metadata"] = {"name": "chat", "namespace": ns}
    created = cluster.request("POST", spec_decode_path(ns), serving)
    serving_policy = wait_until(
        lambda: get(cluster, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/chat-pods"),
        timeout=30,
        what="the SpecDecodeDeployment's NetworkPolicy",
    )
    assert serving_policy["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert serving_policy["spec"]["podSelector"] == {
        "matchLabels": {"eagle3.ai/spec-decode-deployment": "chat"}
    }
    assert serving_policy["spec"]["ingress"][1]["from"] == policy["allowedClients"]


def test_a_target_service_made_with_a_cluster_ip_is_replaced_by_a_headless_one(
    crds, manual_namespace, start_operator
):
    """Operators before the headless server Services gave the target a ClusterIP, which the API server
    never lets change: the operator deletes that Service and creates it again, once."""
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    created = cluster.request("POST", draft_training_path(ns), training_body(ns))
    older = server_service(created, DraftTraining.model_validate(created), "target")
    del older["spec"]["clusterIP"]
    service_path = f"/api/v1/namespaces/{ns}/services/llama-target"
    before = cluster.request("POST", f"/api/v1/namespaces/{ns}/services", older)
    assert before["spec"]["clusterIP"] not in (None, "None")

    start_operator(ns)

    def headless() -> dict | None:
        service = get(cluster, service_path)
        return service if service and service["spec"]["clusterIP"] == "None" else None

    after = wait_until(headless, timeout=30, interval=0.3, what="the target Service made headless")
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert after["spec"]["ports"][0]["port"] == 8000
    # Replaced once: the headless Service is what the operator wants, so later passes leave it.
    cluster.request("PATCH", draft_training_path(ns, "llama"), {"metadata": {"labels": {"touched": "1"}}})
    time.sleep(3)
    assert cluster.request("GET", service_path)["metadata"]["uid"] == after["metadata"]["uid"]
    body = cluster.request("GET", draft_training_path(ns, "llama"))
    reasons = [c.get("reason") for c in body["status"]["conditions"]]
    assert "ApplyFailed" not in reasons, body["status"]["conditions"]
