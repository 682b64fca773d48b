"""End to end as a user does it, on the session test bed's real node (tests/support/realnode.py).

`helm install` the chart (its real RBAC; the operator runs with the chart's ServiceAccount,
tests/chart/installed.py), make the claims that examples/drafttraining-tiny-cpu.yaml's header names,
`kubectl apply` that example, and let the operator's real pods train, evaluate and export a draft;
then serve it with a SpecDecodeDeployment. One draft per test session: later tests (live
Prometheus) take `tiny_cpu_serving` instead of training another one.

The only changes to the example are the test bed's (applied with `kubectl patch --local`, as a user
of such a cluster would): the real node is tainted and labelled (realnode.REAL_NODE_SELECTOR,
REAL_NODE_TOLERATIONS), its volumes come from its own storage class (there is no default class), and
vLLM's CPU build keeps its KV cache in the shared machine's memory (VLLM_CPU_KVCACHE_SPACE=1, as
eagle3_runtime.vllm_server sets it for the local pipeline).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_runtime.pipeline.prompts import write_prompt_sets
from tests.chart.installed import Installation
from tests.support import realnode
from tests.support.cluster import REPO_ROOT, LocalCluster, wait_until

EXAMPLE = REPO_ROOT / "examples" / "drafttraining-tiny-cpu.yaml"
TRAINING = "tiny-cpu"  # the example's metadata.name
SERVING = "tiny-cpu-serve"
SERVED_MODEL = "tiny"
MODELS_CLAIM, PROMPTS_CLAIM = "models", "prompts"  # the claims the example's header names
TRAINING_TIMEOUT_S = (
    6000  # see docs/testing.md (End to end): about an hour at load 20 with 180 steps; the preset has 360
)
SERVING_TIMEOUT_S = 600
POLL_S = 10
CPU_ENV = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]


def say(config: pytest.Config, text: str) -> None:
    """Print now, past pytest's capture: progress of a run that takes many minutes."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(text, flush=True)


def test_bed_scheduling() -> dict[str, Any]:
    """spec.scheduling that puts pods on the tainted real node."""
    return {"nodeSelector": realnode.REAL_NODE_SELECTOR, "tolerations": realnode.REAL_NODE_TOLERATIONS}


@dataclass
class TrainingRun:
    """The example's DraftTraining, as the session ran it."""

    installation: Installation
    name: str
    status: dict[str, Any]
    rows: list[str] = field(default_factory=list)  # `kubectl get dt` lines (Age column cut), as they changed
    columns: list[dict[str, Any]] = field(default_factory=list)  # the same rows' columns, parsed
    seconds: float = 0.0  # kubectl apply to phase Succeeded
    workspace: Path | None = None  # the workspace volume's directory on this machine

    @property
    def namespace(self) -> str:
        return self.installation.work


@dataclass
class ServedDraft:
    """The SpecDecodeDeployment serving the session's draft."""

    training: TrainingRun
    name: str
    status: dict[str, Any]
    service: str
    port: int
    cluster_ip: str
    seconds: float  # kubectl apply to Available

    @property
    def namespace(self) -> str:
        return self.training.namespace

    @property
    def dns_name(self) -> str:
        return f"{self.service}.{self.namespace}.svc.{realnode.CLUSTER_DOMAIN}"


def make_claims(cluster: LocalCluster, namespace: str, data: Path) -> None:
    """The example's prerequisites: `models` holding tiny-target/, `prompts` holding the prompt sets."""
    write_prompt_sets(data / PROMPTS_CLAIM)
    cluster.real_node.host_folder_claims(cluster, namespace, data, tiny_target=f"{MODELS_CLAIM}/tiny-target")


def patched_example(cluster: LocalCluster) -> str:
    """examples/drafttraining-tiny-cpu.yaml with the test bed's patch (module doc), as YAML."""
    patch = {
        "spec": {
            "scheduling": test_bed_scheduling(),
            "storage": {"storageClassName": realnode.STORAGE_CLASS},
            "target": {"env": CPU_ENV},
        }
    }
    return cluster.kubectl(
        "patch", "--local", "-f", EXAMPLE, "--type", "merge", "-p", json.dumps(patch), "-o", "yaml"
    )


def columns(line: str, header: str) -> dict[str, str]:
    """One `kubectl get` line split by its header's column starts."""
    names, starts = header.split(), []
    for name in names:  # in order: "AGE" is also inside "STAGE"
        starts.append(header.index(name, starts[-1] + 1 if starts else 0))
    bounds = [*starts, None]
    return {n: line[bounds[i] : bounds[i + 1]].strip() for i, n in enumerate(names)}


def workspace_directory(cluster: LocalCluster, namespace: str, claim: str) -> Path:
    """Where the real node's local volume of `claim` lives on this machine."""
    bound = cluster.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    volume = cluster.request("GET", f"/api/v1/persistentvolumes/{bound['spec']['volumeName']}")
    return Path(volume["spec"]["local"]["path"])


def train(config: pytest.Config, installation: Installation, data: Path) -> TrainingRun:
    cluster, namespace = installation.as_runtime.cluster, installation.work
    make_claims(cluster, namespace, data)
    run = TrainingRun(installation, TRAINING, {})
    started = time.monotonic()
    say(config, f"\n[e2e] kubectl apply -f {EXAMPLE.relative_to(REPO_ROOT)} (namespace {namespace})")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=patched_example(cluster))

    def succeeded() -> dict[str, Any] | None:
        table = cluster.kubectl("get", "dt", TRAINING, "-n", namespace).splitlines()
        row = {k: v for k, v in columns(table[1], table[0]).items() if k != "AGE"}
        line = "  ".join(f"{k}={v}" for k, v in row.items())
        if not run.rows or run.rows[-1] != line:
            run.rows.append(line)
            run.columns.append(row)
            say(config, f"[e2e] {time.monotonic() - started:6.0f} s  kubectl get dt: {line}")
        status = (
            cluster.request(
                "GET", f"/apis/eagle3.ai/v1alpha1/namespaces/{namespace}/drafttrainings/{TRAINING}"
            ).get("status")
            or {}
        )
        if status.get("phase") == "Failed":
            raise AssertionError(
                f"DraftTraining failed:\n{json.dumps(status, indent=1)}\n{cluster.describe_namespace(namespace)}"
            )
        return status if status.get("phase") == "Succeeded" else None

    try:
        run.status = wait_until(
            succeeded, timeout=TRAINING_TIMEOUT_S, interval=POLL_S, what="DraftTraining tiny-cpu Succeeded"
        )
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{cluster.describe_namespace(namespace)}") from error
    run.seconds = time.monotonic() - started
    run.workspace = workspace_directory(cluster, namespace, run.status["workspaceClaim"])
    say(config, f"[e2e] DraftTraining Succeeded after {run.seconds:.0f} s")
    return run


def serving_manifest(training: TrainingRun) -> dict[str, Any]:
    """Serve the example's target with the draft its DraftTraining exported."""
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": SERVING},
        "spec": {
            "target": {
                "model": f"pvc://{MODELS_CLAIM}/tiny-target",
                "maxModelLen": 1024,
                "extraArgs": ["--enforce-eager"],  # as the example's target (its comment says why)
                "env": CPU_ENV,
            },
            "draft": {"fromDraftTraining": training.name},
            "numSpeculativeTokens": 3,
            "replicas": 1,
            "servedModelName": SERVED_MODEL,
            "scheduling": test_bed_scheduling(),
        },
    }


def serve(config: pytest.Config, training: TrainingRun) -> ServedDraft:
    cluster, namespace = training.installation.as_runtime.cluster, training.namespace
    started = time.monotonic()
    say(config, f"[e2e] kubectl apply SpecDecodeDeployment {SERVING} (draft.fromDraftTraining {TRAINING})")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(serving_manifest(training)))
    path = f"/apis/eagle3.ai/v1alpha1/namespaces/{namespace}/specdecodedeployments/{SERVING}"

    def available() -> dict[str, Any] | None:
        status = cluster.request("GET", path).get("status") or {}
        condition = {c["type"]: c for c in status.get("conditions") or []}.get("Available") or {}
        return status if condition.get("status") == "True" else None

    try:
        status = wait_until(available, timeout=SERVING_TIMEOUT_S, interval=2, what=f"{SERVING} Available")
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{cluster.describe_namespace(namespace)}") from error
    service = cluster.request("GET", f"/api/v1/namespaces/{namespace}/services/{SERVING}")
    (port,) = service["spec"]["ports"]
    seconds = time.monotonic() - started
    say(
        config,
        f"[e2e] {SERVING} Available after {seconds:.0f} s; Service ClusterIP {service['spec']['clusterIP']}",
    )
    return ServedDraft(
        training, SERVING, status, SERVING, port["port"], service["spec"]["clusterIP"], seconds
    )


def run_in_pod(
    cluster: LocalCluster, namespace: str, name: str, script: str, *, args: list[str], timeout: float = 300
) -> str:
    """Run a Python script (with `args`) in a short-lived pod on the real node (the runtime image); its stdout.
    ClusterIPs are reachable only from pods."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": realnode.on_real_node(
            {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": realnode.RUNTIME_IMAGE_NAMES[0],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", script, *args],
                    }
                ],
            }
        ),
    }
    cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)

    def finished() -> dict[str, Any] | None:
        pod = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    pod = wait_until(finished, timeout=timeout, interval=1, what=f"pod {name} to finish")
    logs = cluster.kubectl("logs", "-n", namespace, name)
    cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert pod["status"]["phase"] == "Succeeded", f"pod {name} failed:\n{logs}"
    return logs
