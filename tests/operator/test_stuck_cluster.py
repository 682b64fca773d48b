"""Stuck work on the test bed: the real scheduler, Job controller and API server say why, and the
operator (a real process) puts their words into conditions and Warning Events.

Image pulls and crash loops need a real kubelet: tests/operator/test_stuck_unit.py covers them on
statuses shaped as the kubelet writes them.
"""

from __future__ import annotations

import re

from tests.operator import fakes
from tests.operator.harness import (
    condition,
    draft_training_path,
    events_of,
    spec_decode_path,
    training_body,
)
from tests.support.cluster import wait_until

ABSENT_BOARD = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}  # the test bed has MI355X nodes
PRESENT_BOARD = {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"}


def _reason(cluster, path: str, type_: str, reason: str) -> dict:
    """The object once its condition `type_` has this reason."""
    return wait_until(
        lambda: condition(body := cluster.request("GET", path), type_).get("reason") == reason and body,
        timeout=60,
        interval=0.3,
        what=f"{type_} reason {reason} on {path}",
    )


def _warning(cluster, ns: str, name: str, reason: str) -> dict:
    return wait_until(
        lambda: next(
            (e for e in events_of(cluster, ns, name) if e["type"] == "Warning" and e["reason"] == reason),
            None,
        ),
        timeout=10,
        what=f"Warning {reason} Event of {name}",
    )


def test_unschedulable_pods_are_reported_with_the_schedulers_message(crds, namespace, start_operator):
    cluster, ns = crds, namespace
    start_operator(ns)
    cluster.request(
        "POST", draft_training_path(ns), training_body(ns, scheduling={"nodeSelector": ABSENT_BOARD})
    )
    serving = fakes.spec_decode(
        draft={"model": "org/eagle3-draft"}, scheduling={"nodeSelector": ABSENT_BOARD}
    )
    serving["metadata"] = {"name": "chat", "namespace": ns}
    cluster.request("POST", spec_decode_path(ns), serving)

    body = _reason(cluster, draft_training_path(ns, "llama"), "TargetReady", "Unschedulable")
    ready = condition(body, "TargetReady")
    assert ready["status"] == "False" and ready["message"].startswith("pod llama-target-")
    # The node count is the test bed's: kwok's nodes, and the real node when it runs.
    assert re.search(r"cannot be scheduled: 0/\d+ nodes are available", ready["message"]), ready["message"]
    assert "didn't match Pod's node affinity/selector" in ready["message"], ready["message"]
    assert body["status"]["phase"] == "Pending"
    assert _warning(cluster, ns, "llama", "Unschedulable")["message"] == ready["message"]

    sdd = _reason(cluster, spec_decode_path(ns, "chat"), "Available", "Unschedulable")
    assert "didn't match Pod's node affinity/selector" in condition(sdd, "Available")["message"]
    assert condition(sdd, "Progressing")["reason"] == "Unschedulable"
    _warning(cluster, ns, "chat", "Unschedulable")

    # Scheduling is not part of the immutable target: fixing it lets the new pod run.
    patch = {"spec": {"scheduling": {"nodeSelector": PRESENT_BOARD}}}
    cluster.request("PATCH", draft_training_path(ns, "llama"), patch)
    _reason(cluster, draft_training_path(ns, "llama"), "TargetReady", "Serving")


def test_a_missing_service_account_is_the_jobs_failed_create(crds, namespace, start_operator):
    cluster, ns = crds, namespace
    start_operator(ns)
    body = training_body(ns, runtime={"serviceAccountName": "eagle3-runtime"})
    cluster.request("POST", draft_training_path(ns), body)
    body = _reason(cluster, draft_training_path(ns, "llama"), "Generated", "FailedCreate")
    generated = condition(body, "Generated")
    assert generated["message"].startswith("Job llama-generate cannot create its pods: pods ")
    assert (
        f'error looking up service account {ns}/eagle3-runtime: serviceaccount "eagle3-runtime" not found'
        in (generated["message"])
    )
    assert body["status"]["phase"] == "Running" and body["status"]["stage"] == "generate"
    assert _warning(cluster, ns, "llama", "FailedCreate")["message"] == generated["message"]


def test_a_child_the_api_server_refuses_is_reported_and_written_again(crds, namespace, start_operator):
    cluster, ns = crds, namespace
    quota = {"metadata": {"name": "no-deployments"}, "spec": {"hard": {"count/deployments.apps": "0"}}}
    cluster.request("POST", f"/api/v1/namespaces/{ns}/resourcequotas", quota)
    # The quota admission plugin refuses everything it counts until the quota controller has
    # computed the usage: wait for it, so the refusal below is the quota's, not "status unknown".
    wait_until(
        lambda: (
            cluster.request("GET", f"/api/v1/namespaces/{ns}/resourcequotas/no-deployments").get("status")
            or {}
        ).get("hard"),
        timeout=30,
        what="the quota's status",
    )
    start_operator(ns)
    cluster.request("POST", draft_training_path(ns), training_body(ns))
    body = _reason(cluster, draft_training_path(ns, "llama"), "TargetReady", "ApplyFailed")
    message = condition(body, "TargetReady")["message"]
    assert message.startswith("the API server refused Deployment llama-target: ")
    assert "exceeded quota: no-deployments" in message, message
    assert _warning(cluster, ns, "llama", "ApplyFailed")["message"] == message
    # The Service beside it was written: one refusal does not stop the other children.
    assert cluster.request("GET", f"/api/v1/namespaces/{ns}/services/llama-target")

    cluster.request("DELETE", f"/api/v1/namespaces/{ns}/resourcequotas/no-deployments")
    wait_until(
        lambda: (
            condition(cluster.request("GET", draft_training_path(ns, "llama")), "TargetReady").get("reason")
            in ("Starting", "Serving")
        ),
        timeout=60,
        interval=0.5,
        what="the operator to write the target Deployment again after the refusal",
    )
