"""The operator tests' harness on the test bed: what it waits for before it plays a stage's pods."""

from __future__ import annotations

import pytest

from tests.operator.harness import items, wait_for_stage_pods
from tests.support.cluster import LocalCluster, wait_until


def _pair_job(node: str) -> dict:
    """A Job of two pods at once (as a two-node trainer's Indexed Job) that can place only one: both
    must go to `node`, and neither may share a node with the other."""
    labels = {"pair": "trainers"}
    spread = {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pair"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "affinity": {
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [spread]}
                    },
                    "containers": [
                        {"name": "stage", "image": "eagle3-runtime", "command": ["eagle3", "train"]}
                    ],
                },
            },
        },
    }


def test_a_stage_s_pods_are_played_only_once_all_of_a_job_s_pods_run(cluster: LocalCluster, manual_namespace):
    """One of two pods Running is not yet the stage's pods: completing it alone (what complete_stage
    did when the scheduler was slow to place the second trainer rank) leaves the other Running and
    the Job never completes."""
    ns = manual_namespace
    cluster.apply(_pair_job(cluster.cpu_nodes[0]), namespace=ns)

    def one_running_one_pending() -> bool:
        phases = sorted(
            p["status"].get("phase") for p in items(cluster, f"/api/v1/namespaces/{ns}/pods", "job-name=pair")
        )
        return phases == ["Pending", "Running"]

    wait_until(one_running_one_pending, timeout=30, what="one pod of the pair Running, the other Pending")
    with pytest.raises(TimeoutError, match="all running pods of"):
        wait_for_stage_pods(cluster, ns, ["pair"], timeout=2)
