"""The chart installed into the test bed, with the real operator running under the chart's ServiceAccount.

Shared by tests/chart/test_install.py (RBAC) and tests/monitoring/test_live_prometheus.py (which
needs a running operator with real metrics). The chart's Deployment gets a fake (kwok) pod; the
operator process that does the work runs here, out of cluster, with a kubeconfig that holds only the
ServiceAccount's token, so it has exactly the chart's rights.
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
from tests.operator.harness import (
    OperatorProcess,
    bind_volume,
    draft_training_path,
    get,
    items,
    stage_result,
)
from tests.support.cluster import LocalCluster, wait_until

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
    operator: OperatorProcess
    notes: str  # what `helm install` printed


@contextmanager
def installed(
    cluster: LocalCluster,
    tmp_path: Path,
    *,
    mode: str,
    release: str,
    values: dict[str, Any] | None = None,
    monitoring: bool = True,
    data_claim: bool = True,
) -> Iterator[Installation]:
    """helm install (monitors and rules on unless not `monitoring`, plus `values`) and the operator
    started with the chart's ServiceAccount.

    mode "namespaced" lists the work namespace in watchNamespaces; "cluster-wide" only gives it the
    runtime ServiceAccount (runtime.namespaces). data_claim: bind the DATA_CLAIM PVC (for the played
    stage pods); without it the test makes its own claims.
    """
    work = cluster.create_namespace(manual=True)  # stage pods stay Running until the test ends them
    system = cluster.create_namespace()
    key = "watchNamespaces" if mode == "namespaced" else "runtime.namespaces"
    on = str(monitoring).lower()
    operator = None
    try:
        notes = helm(
            "install", release, str(CHART_DIR), "--namespace", system, "--set", f"{key}={{{work}}}",
            "--set", f"metrics.serviceMonitor.enabled={on},metrics.podMonitor.enabled={on},prometheusRule.enabled={on}",
            *values_args(tmp_path, values or {}), env=cluster.env(), timeout=180,
        )  # fmt: skip
        as_operator = AsServiceAccount(cluster, system, f"{release}-eagle3-operator", tmp_path)
        as_runtime = AsServiceAccount(cluster, work, RUNTIME_ACCOUNT, tmp_path)
        if data_claim:
            bind_volume(cluster, work, DATA_CLAIM, create_claim=True)
        # Leader election as the chart's Deployment runs it: the Lease in the release's namespace.
        election = ("--leader-elect", f"--leader-elect-resource-name={release}-eagle3-operator",
                    f"--leader-elect-resource-namespace={system}")  # fmt: skip
        operator = OperatorProcess(
            as_operator, [work] if mode == "namespaced" else [], tmp_path / "operator.log", election
        )
        operator.start()
        yield Installation(release, system, work, as_operator, as_runtime, operator, notes)
    except BaseException:
        if operator and operator.proc:
            print(f"--- operator log ---\n{operator.log_tail(150)}")
        raise
    finally:
        if operator:
            operator.stop()
        helm("uninstall", release, "--namespace", system, "--wait", env=cluster.env(), timeout=120)
        cluster.delete_namespace(work)
        cluster.delete_namespace(system)


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
            "training": {"steps": 40, "checkpointEvery": 20},
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


def stage_metrics(stage: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Plausible results of each stage, per docs/contracts.md's table; best checkpoint: step 40, 2.5."""
    if stage == "generate":
        return {"samples": 64, "tokens": 20000, "tokens_per_second": 500.0, "bad_rows": 0}
    if stage == "extract":
        return {"samples": 64, "tokens": 20000}
    if stage == "train":
        return {
            "step": 40, "total_steps": 40, "loss": 1.25, "accuracy_per_position": [0.7, 0.5, 0.35],
            "simulated_acceptance_length": 2.4, "checkpoints": ["20", "40"],
        }  # fmt: skip
    if stage == "evaluate":
        command = pod["spec"]["containers"][0]["command"]
        step = int(command[command.index("--checkpoint") + 1].removeprefix("step-"))
        return {
            "step": step, "acceptance_length": 1.5 + step / 40, "acceptance_per_position": [0.6, 0.4, 0.2],
            "tokens_per_second": 300.0, "speedup": 1.8,
        }  # fmt: skip
    if stage == "select":
        return {"step": 40, "acceptance_length": 2.5}
    return {}


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
        cluster.complete_pod(work, name, message=stage_result(stage, **stage_metrics(stage, pod)))


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

    return wait_until(succeeded, timeout=timeout, interval=0.5, what=f"DraftTraining {name} Succeeded")
