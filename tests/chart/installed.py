"""The chart installed into the test bed, with the real operator running under the chart's ServiceAccount.

Shared by tests/chart/test_install.py (RBAC) and tests/monitoring/test_live_prometheus.py (which
needs a running operator with real metrics). By default the chart's Deployment gets a fake (kwok)
pod and the operator process that does the work runs here, out of cluster, with a kubeconfig that
holds only the ServiceAccount's token, so it has exactly the chart's rights. With
`operator_in_cluster`, the chart's Deployment itself runs the operator on the real node
(realnode.OPERATOR_IMAGE, built from this checkout), as a user's cluster would.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import CHART_DIR, helm, values_args
from tests.operator import fakes
from tests.operator.harness import (
    OperatorProcess,
    bind_volume,
    draft_training_path,
    get,
    items,
)
from tests.support import realnode
from tests.support.cluster import ApiError, LocalCluster, wait_until

RUNTIME_ACCOUNT = "eagle3-runtime"
DATA_CLAIM = "prompts"


def pod_bound_token(cluster: LocalCluster, namespace: str, account: str, pod: str) -> str:
    """A ServiceAccount token bound to a pod (what the kubelet projects into it): the API server adds
    the pod's name and uid to the user's extra (authentication.kubernetes.io/pod-name, -pod-uid)."""
    uid = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")["metadata"]["uid"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 600,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
        },
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    return cluster.request("POST", path, request)["status"]["token"]


class AsServiceAccount:
    """The test bed as seen through a kubeconfig holding a ServiceAccount's token (no admin rights);
    bound_pod: the token is bound to that pod, as in the pod itself."""

    def __init__(
        self, cluster: LocalCluster, namespace: str, account: str, workdir: Path, *, bound_pod: str = ""
    ):
        admin = yaml.safe_load(cluster.kubeconfig.read_text())
        if bound_pod:
            token = pod_bound_token(cluster, namespace, account, bound_pod)
        else:
            # Valid for the whole test session: the end-to-end operator runs for more than an hour on
            # a loaded machine.
            token = cluster.service_account_token(namespace, account, expiration_s=6 * 3600)
        self.cluster = cluster
        self.namespace, self.account, self.workdir = namespace, account, workdir
        self.kubeconfig = workdir / f"{namespace}-{account}{'-' + bound_pod if bound_pod else ''}.kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "testbed", "cluster": admin["clusters"][0]["cluster"]}],
                    "users": [{"name": account, "user": {"token": token}}],
                    "contexts": [{"name": account, "context": {"cluster": "testbed", "user": account}}],
                    "current-context": account,
                }
            )
        )

    def in_pod(self, pod: str) -> AsServiceAccount:
        """The same ServiceAccount with a token bound to `pod` (in its namespace)."""
        return AsServiceAccount(self.cluster, self.namespace, self.account, self.workdir, bound_pod=pod)

    def env(self) -> dict[str, str]:
        """What OperatorProcess runs with: the test bed's environment, this kubeconfig."""
        return self.cluster.env() | {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.cluster.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, timeout=60, input=input,
        )  # fmt: skip

    def can(self, verb: str, resource: str, namespace: str) -> bool:
        return self.kubectl("auth", "can-i", verb, resource, "-n", namespace).stdout.strip() == "yes"

    def annotate_pod(self, namespace: str, pod: str, key: str, value: str) -> None:
        """What a stage does: annotate its own pod, with the token bound to it."""
        result = self.in_pod(pod).kubectl(
            "annotate", "--overwrite", "-n", namespace, f"pod/{pod}", f"{key}={value}"
        )
        assert result.returncode == 0, f"annotating pod {pod} as {self.kubeconfig.stem}: {result.stderr}"


@dataclass
class Installation:
    release: str
    system: str  # the release's namespace
    work: str  # where the DraftTraining and SpecDecodeDeployment live
    as_operator: AsServiceAccount
    as_runtime: AsServiceAccount
    operator: OperatorProcess | None  # None: the chart's Deployment runs it (operator_in_cluster)
    notes: str  # what `helm install` printed

    @property
    def deployment(self) -> str:
        """The chart's operator Deployment (also its ServiceAccount's and Lease's name)."""
        return f"{self.release}-eagle3-operator"


@contextmanager
def installed(
    cluster: LocalCluster,
    tmp_path: Path,
    *,
    mode: str,
    release: str,
    values: dict[str, Any] | None = None,
    monitoring: bool = True,
    operator_in_cluster: bool = False,
    data_claim: bool = True,
) -> Iterator[Installation]:
    """helm install (monitors and rules on unless not `monitoring`, plus `values`) and the operator
    started with the chart's ServiceAccount: here, or (operator_in_cluster) as the chart's
    Deployment on the real node, one replica, ready before this yields.

    mode "namespaced" lists the work namespace in watchNamespaces; "cluster-wide" only gives it the
    runtime ServiceAccount (runtime.namespaces). data_claim: bind the DATA_CLAIM PVC (for the played
    stage pods); without it the test makes its own claims.
    """
    work = cluster.create_namespace(manual=True)  # stage pods stay Running until the test ends them
    system = cluster.create_namespace()
    key = "watchNamespaces" if mode == "namespaced" else "runtime.namespaces"
    on = str(monitoring).lower()
    operator = None
    deployment = f"{release}-eagle3-operator"
    try:
        notes = helm(
            "install", release, str(CHART_DIR), "--namespace", system, "--set", f"{key}={{{work}}}",
            "--set", f"metrics.serviceMonitor.enabled={on},metrics.podMonitor.enabled={on},prometheusRule.enabled={on}",
            *values_args(tmp_path, values or {}, IN_CLUSTER_VALUES if operator_in_cluster else {}),
            env=cluster.env(), timeout=180,
        )  # fmt: skip
        as_operator = AsServiceAccount(cluster, system, deployment, tmp_path)
        as_runtime = AsServiceAccount(cluster, work, RUNTIME_ACCOUNT, tmp_path)
        if data_claim:
            bind_volume(cluster, work, DATA_CLAIM, create_claim=True)
        if operator_in_cluster:
            wait_until(
                lambda: _leading_pod(cluster, system, deployment),
                timeout=180,
                interval=1,
                what=f"the chart's operator pod on the real node to lead (Lease {system}/{deployment})",
            )
        else:
            # Leader election as the chart's Deployment runs it: the Lease in the release's namespace.
            election = ("--leader-elect", f"--leader-elect-resource-name={deployment}",
                        f"--leader-elect-resource-namespace={system}")  # fmt: skip
            operator = OperatorProcess(
                as_operator, [work] if mode == "namespaced" else [], tmp_path / "operator.log", election
            )
            operator.start()
        yield Installation(release, system, work, as_operator, as_runtime, operator, notes)
    except BaseException:
        if operator and operator.proc:
            print(f"--- operator log ---\n{operator.log_tail(150)}")
        if operator_in_cluster:
            logs = cluster.kubectl("logs", "-n", system, f"deploy/{deployment}", "--tail=150", check=False)
            print(f"--- operator pod log ---\n{logs}")
        raise
    finally:
        if operator:
            operator.stop()
        helm("uninstall", release, "--namespace", system, "--wait", env=cluster.env(), timeout=120)
        cluster.delete_namespace(work)
        cluster.delete_namespace(system)


# The chart's Deployment on the real node: its image (the chart's default repository and appVersion)
# is built from this checkout and imported there; one replica, so one operator exports metrics.
IN_CLUSTER_VALUES = {
    "replicas": 1,
    "image": {"pullPolicy": "Never"},
    "nodeSelector": realnode.REAL_NODE_SELECTOR,
    "tolerations": realnode.REAL_NODE_TOLERATIONS,
}


def _leading_pod(cluster: LocalCluster, namespace: str, deployment: str) -> str | None:
    """The operator pod that holds the Lease, once it runs on the real node and is Ready."""
    try:
        lease = cluster.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{deployment}"
        )
    except ApiError as error:
        if error.status == 404:  # no leader yet
            return None
        raise
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""  # POD_NAME_<random>
    pods = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    for pod in pods:
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod.get("status", {}).get("conditions", [])
        )
        if (
            holder.startswith(pod["metadata"]["name"] + "_")
            and pod["spec"].get("nodeName") == realnode.NODE_NAME
            and ready
        ):
            return pod["metadata"]["name"]
    return None


TRAINING_STEPS = 40


def training_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "DraftTraining",
        "metadata": {"name": name},
        "spec": {
            "target": {"model": "org/tiny-llama", "gpus": 1},
            "runtime": {"serviceAccountName": RUNTIME_ACCOUNT, "backoffLimit": 0},
            "data": {"sources": [{"claimName": DATA_CLAIM, "path": "chat.jsonl"}], "numSamples": 64},
            "hiddenStates": {"mode": "offline"},
            "training": {"steps": TRAINING_STEPS, "checkpointEvery": TRAINING_STEPS // 2},
            "evaluation": {"everyCheckpoints": 1, "numSpeculativeTokens": 3},
            "storage": {"size": "1Gi"},
        },
    }


def serving_manifest(name: str, training: str) -> dict[str, Any]:
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": name},
        "spec": {
            "target": {"model": "org/tiny-llama", "gpus": 1},
            "draft": {"fromDraftTraining": training},
            "numSpeculativeTokens": 3,
            "replicas": 1,
        },
    }


def play_stage_pods(installation: Installation, training: str) -> None:
    """End every running stage pod of the training with its StageResult, after a progress report
    sent as the pod's own (runtime) ServiceAccount."""
    cluster, work = installation.as_runtime.cluster, installation.work
    pods = items(cluster, f"/api/v1/namespaces/{work}/pods", f"eagle3.ai/draft-training={training}")
    for pod in pods:
        stage = (pod["metadata"].get("labels") or {}).get("eagle3.ai/stage")
        if not stage or pod["status"].get("phase") != "Running":
            continue
        name = pod["metadata"]["name"]
        assert pod["spec"].get("serviceAccountName") == RUNTIME_ACCOUNT, pod["spec"].get("serviceAccountName")
        progress = {
            "stage": stage,
            "step": 20,
            "totalSteps": 40,
            "loss": 1.5,
            "updatedAt": "2026-11-29T09:00:00Z",
        }
        installation.as_runtime.annotate_pod(work, name, "eagle3.ai/progress", json.dumps(progress))
        job = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]
        cluster.complete_pod(work, name, message=fakes.stage_report(stage, job, total_steps=TRAINING_STEPS))


def run_training(installation: Installation, name: str, timeout: float = 240) -> dict[str, Any]:
    """Create a DraftTraining, play its stage pods until it Succeeded; its final status."""
    cluster, work = installation.as_runtime.cluster, installation.work
    bind_volume(cluster, work, f"{name}-workspace", create_claim=False)
    cluster.apply(training_manifest(name), namespace=work)

    def succeeded() -> dict[str, Any] | None:
        play_stage_pods(installation, name)
        status = (get(cluster, draft_training_path(work, name)) or {}).get("status") or {}
        assert status.get("phase") != "Failed", json.dumps(status, indent=1)
        return status if status.get("phase") == "Succeeded" else None

    try:
        return wait_until(succeeded, timeout=timeout, interval=0.5, what=f"DraftTraining {name} Succeeded")
    except TimeoutError as error:
        status = (get(cluster, draft_training_path(work, name)) or {}).get("status")
        where = [cluster.describe_namespace(ns) for ns in (work, installation.system)]
        raise AssertionError("\n".join([str(error), json.dumps(status, indent=1), *where])) from error
