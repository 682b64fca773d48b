"""Tests can end pods the way a kubelet reports them: phase, exit code and termination message."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cluster import LocalCluster, wait_until
from tests.support.testbed_kwok import JOB_POD_RUN_MS, MANUAL_LABEL


def job(name: str, backoff_limit: int = 0) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "stage", "image": "eagle3-runtime", "command": ["eagle3", "train"]}
                    ],
                }
            },
        },
    }


def job_pod(cluster: LocalCluster, namespace: str, job_name: str) -> dict:
    def running_pod():
        pods = cluster.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=job-name%3D{job_name}"
        )
        return next((p for p in pods["items"] if p["status"].get("phase") == "Running"), None)

    return wait_until(running_pod, timeout=30, what=f"a Running pod of Job {job_name}")


def job_condition(cluster: LocalCluster, namespace: str, name: str, kind: str) -> dict | None:
    job_obj = cluster.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    return next((c for c in job_obj["status"].get("conditions", []) if c["type"] == kind), None)


def test_manual_job_pod_stays_running_until_completed_with_a_message(cluster, manual_namespace):
    cluster.apply(job("train"), namespace=manual_namespace)
    pod = job_pod(cluster, manual_namespace, "train")
    name = pod["metadata"]["name"]
    # kwok would have ended an ordinary Job pod by now; a manual one waits for the test.
    time.sleep(2 * JOB_POD_RUN_MS / 1000)
    assert (
        cluster.request("GET", f"/api/v1/namespaces/{manual_namespace}/pods/{name}")["status"]["phase"]
        == "Running"
    )

    result = json.dumps({"stage": "train", "ok": True, "metrics": {"acceptance_length": 3.1}})
    ended = cluster.complete_pod(manual_namespace, name, message=result)

    assert ended["status"]["phase"] == "Succeeded"
    terminated = ended["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    assert json.loads(terminated["message"])["metrics"]["acceptance_length"] == 3.1
    complete = wait_until(
        lambda: job_condition(cluster, manual_namespace, "train", "Complete"), timeout=30, what="Job Complete"
    )
    assert complete["status"] == "True"


def test_failed_job_pod_carries_exit_code_and_message_and_fails_the_job(cluster, manual_namespace):
    cluster.apply(job("train"), namespace=manual_namespace)
    name = job_pod(cluster, manual_namespace, "train")["metadata"]["name"]

    ended = cluster.fail_pod(
        manual_namespace, name, message="CUDA out of memory", exit_code=137, reason="OOMKilled"
    )

    assert ended["status"]["phase"] == "Failed"
    terminated = ended["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
        137,
        "OOMKilled",
        "CUDA out of memory",
    )
    failed = wait_until(
        lambda: job_condition(cluster, manual_namespace, "train", "Failed"), timeout=30, what="Job Failed"
    )
    assert failed["reason"] == "BackoffLimitExceeded"


def test_bare_pod_can_be_failed_in_an_ordinary_namespace(cluster, namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "server"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "vllm", "image": "vllm"}, {"name": "sidecar", "image": "exporter"}],
        },
    }
    cluster.apply(pod, namespace=namespace)

    ended = cluster.fail_pod(namespace, "server", container="sidecar", message="exporter crashed")

    statuses = {s["name"]: s["state"]["terminated"] for s in ended["status"]["containerStatuses"]}
    assert ended["status"]["phase"] == "Failed"
    assert statuses["sidecar"]["exitCode"] == 1 and statuses["sidecar"]["message"] == "exporter crashed"
    assert statuses["vllm"]["exitCode"] == 0 and "message" not in statuses["vllm"]


def test_ending_a_pod_kwok_would_end_itself_is_refused(cluster, namespace):
    cluster.apply(job("auto"), namespace=namespace)
    name = job_pod(cluster, namespace, "auto")["metadata"]["name"]

    with pytest.raises(ValueError, match="kwok ends it by itself"):
        cluster.complete_pod(namespace, name, message="too late")


def test_termination_message_longer_than_the_kubelet_keeps_is_refused(cluster, namespace):
    with pytest.raises(ValueError, match="4096"):
        cluster.complete_pod(namespace, "any", message="x" * 4097)


def test_job_pod_labelled_manual_waits_for_the_test_in_an_ordinary_namespace(cluster, namespace):
    manifest = job("labelled")
    manifest["spec"]["template"]["metadata"] = {"labels": {MANUAL_LABEL: "true"}}
    cluster.apply(manifest, namespace=namespace)
    name = job_pod(cluster, namespace, "labelled")["metadata"]["name"]
    time.sleep(2 * JOB_POD_RUN_MS / 1000)

    ended = cluster.complete_pod(namespace, name, message="done")

    assert ended["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "done"


def test_namespace_name_must_match_whether_kwok_ends_its_job_pods(cluster):
    with pytest.raises(ValueError, match="a manual one must start with 'manual-'"):
        cluster.create_namespace("plain", manual=True)
    with pytest.raises(ValueError, match="a non-manual one may not start with 'manual-'"):
        cluster.create_namespace("manual-by-mistake")
