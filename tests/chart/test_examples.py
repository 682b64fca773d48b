"""examples/ as a user meets them: accepted by a real API server with the chart's CRDs (server-side
dry run, strict fields), applied with `kubectl apply` and run by the operator (a real process) on the
test bed, and the prerequisites the examples name either made by the chart or explained in the
example.

Every example needs real GPUs, so on the test bed its pods are scheduled by the real scheduler onto
kwok's AMD GPU nodes (labelled as the AMD node labeller does) and the stage pods end with the
harness's stage results (tests/operator/harness.py). examples/drafttraining-tiny-cpu.yaml runs end to
end on the real node in tests/e2e; here it is only dry-run."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
import yaml

from eagle3_api.workspace import export_version
from tests.chart.helm import CHART_DIR, RELEASE, by_kind, helm, install_chart_crds, render
from tests.operator import fakes
from tests.operator.harness import (
    OperatorProcess,
    bind_volume,
    condition,
    draft_training_path,
    drive_to_success,
    items,
    spec_decode_path,
)
from tests.support import testbed_kwok
from tests.support.cluster import REPO_ROOT, KubectlError, wait_until

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
SERVING_EXAMPLES = [path for path in EXAMPLES if path.name.startswith("specdecodedeployment")]


def dry_run(cluster, namespace: str, manifest: str) -> str:
    return cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", input=manifest
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_is_accepted(path: Path, cluster, namespace):
    install_chart_crds(cluster)
    out = dry_run(cluster, namespace, path.read_text())
    obj = yaml.safe_load(path.read_text())
    assert f"{obj['kind'].lower()}.eagle3.ai/{obj['metadata']['name']} created (server dry run)" in out


def test_strict_validation_catches_a_misspelt_field(cluster, namespace):
    """The dry run above is meaningful: a typo in an example would fail it, naming the field."""
    install_chart_crds(cluster)
    obj = yaml.safe_load((REPO_ROOT / "examples" / "specdecodedeployment.yaml").read_text())
    obj["spec"]["numSpeculativeTokenz"] = obj["spec"].pop("numSpeculativeTokens")
    with pytest.raises(KubectlError) as failure:
        dry_run(cluster, namespace, yaml.safe_dump(obj))
    assert 'unknown field "spec.numSpeculativeTokenz"' in str(failure.value)


def test_serving_examples_get_deployments_whose_pods_are_scheduled(cluster, namespace, tmp_path):
    """`kubectl apply` of each serving example gives a Deployment (one that sets an env variable the
    operator sets too used to be refused by server-side apply), whose pods the real scheduler places
    on the test bed's MI355X nodes (labelled like the AMD node labeller does): on nodes that carry
    the example's node selector, with its tolerations and its GPUs."""
    install_chart_crds(cluster)
    operator = OperatorProcess(cluster, [namespace], tmp_path / "operator.log").start()
    try:
        for path in SERVING_EXAMPLES:
            cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        for path in SERVING_EXAMPLES:
            example = yaml.safe_load(path.read_text())
            name = example["metadata"]["name"]
            deployment = wait_until(
                lambda name=name: _json(cluster, "get", "deployment", name, "-n", namespace),
                timeout=60,
                what=f"the Deployment of {path.name}",
            )
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            names = Counter(entry["name"] for entry in container["env"])
            assert max(names.values()) == 1, f"{path.name}: duplicate env names {names}"
            for entry in example["spec"]["target"].get("env") or []:
                assert entry in container["env"], f"{path.name}: {entry} is not in the container"
            assert deployment["spec"]["template"]["spec"].get("nodeSelector") == (
                example["spec"].get("scheduling") or {}
            ).get("nodeSelector")
            wait_until(
                lambda name=name, example=example: (
                    condition(
                        b := cluster.request("GET", spec_decode_path(namespace, name)), "Available"
                    ).get("status")
                    == "True"
                    and b["status"].get("readyReplicas") == example["spec"].get("replicas", 1)
                    and b
                ),
                timeout=90,
                interval=0.5,
                what=f"{path.name} Available with all its replicas (pods scheduled and run by kwok)",
            )
            scheduling = example["spec"].get("scheduling") or {}
            for pod in _pods(cluster, namespace, f"eagle3.ai/spec-decode-deployment={name}"):
                node = cluster.request("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
                assert node["metadata"]["labels"].items() >= (scheduling.get("nodeSelector") or {}).items()
                assert node["metadata"]["labels"]["feature.node.kubernetes.io/amd-gpu"] == "true"
                assert all(t in pod["spec"]["tolerations"] for t in scheduling.get("tolerations") or [])
                limits = pod["spec"]["containers"][0]["resources"]["limits"]
                assert limits["amd.com/gpu"] == str(example["spec"]["target"]["gpus"]), (path.name, limits)
    except BaseException:
        print(f"--- operator log ---\n{operator.log_tail(80)}")
        raise
    finally:
        operator.stop()


def _json(cluster, *args: str) -> dict | None:
    try:
        return json.loads(cluster.kubectl(*args, "-o", "json"))
    except KubectlError:
        return None


def test_the_drafttraining_example_says_how_to_get_its_service_account(cluster, tmp_path):
    """The example's runtime ServiceAccount: a default install makes none (and its notes say how to
    add it), and the command the example gives makes it, bound to the runtime role, in the example's
    namespace."""
    path = REPO_ROOT / "examples" / "drafttraining.yaml"
    account = yaml.safe_load(path.read_text())["spec"]["runtime"]["serviceAccountName"]
    namespace = re.search(r"kubectl -n (\S+) create secret", path.read_text()).group(1)

    def runtime_accounts(objects):
        return [
            (sa["metadata"]["namespace"], sa["metadata"]["name"])
            for sa in by_kind(objects, "ServiceAccount")
            if sa["metadata"]["name"] == account
        ]

    assert runtime_accounts(render(tmp_path)) == [], (
        "a default install creates it nowhere: the example must say"
    )
    notes = helm(
        "install", "--dry-run=client", RELEASE, str(CHART_DIR), "-n", "eagle3-system", env=cluster.env()
    )
    assert "--reuse-values --set 'runtime.namespaces={<namespace>}'" in notes, notes
    (command,) = [
        line.lstrip("# ").strip() for line in path.read_text().splitlines() if "helm upgrade" in line
    ]
    words = shlex.split(command)
    assert words[:3] == ["helm", "upgrade", RELEASE] and "--reuse-values" in words, command
    sets = {
        words[i + 1].split("=", 1)[0]: words[i + 1].split("=", 1)[1]
        for i, w in enumerate(words)
        if w == "--set"
    }
    values = {"runtime": {"namespaces": sets["runtime.namespaces"].strip("{}").split(",")}}
    objects = render(tmp_path, values)
    assert runtime_accounts(objects) == [(namespace, account)]
    (binding,) = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == namespace]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert binding["roleRef"]["name"] == f"{RELEASE}-eagle3-operator-runtime"


# An MI300X node as the AMD node labeller labels it (product name from sysfs, spaces as underscores,
# `_OAM` on OAM boards; PCI device id 74a1), with the `amd.com/gpu:NoSchedule` taint clusters often
# add. The test bed's own GPU nodes are MI355X.
MI300X_NODE = "kwok-mi300x-0"
MI300X_LABELS = testbed_kwok.GPU_NODE_LABELS | {
    "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    "amd.com/gpu.device-id": "74a1",
    "amd.com/gpu.vram": "192G",
    "amd.com/gpu.cu-count": "304",
    "node.kubernetes.io/instance-type": "mi300x.8x",
}
GPU_TAINT = {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.fixture
def mi300x_node(cluster):
    node = testbed_kwok.node_manifest(MI300X_NODE, gpu=True)
    node["metadata"]["labels"] |= MI300X_LABELS
    node["spec"] = {"taints": [GPU_TAINT]}
    cluster.request("POST", "/api/v1/nodes", node)
    try:
        wait_until(
            lambda: (
                condition(cluster.request("GET", f"/api/v1/nodes/{MI300X_NODE}"), "Ready").get("status")
                == "True"
            ),
            timeout=60,
            what=f"node {MI300X_NODE} Ready",
        )
        yield MI300X_NODE
    finally:
        cluster.request("DELETE", f"/api/v1/nodes/{MI300X_NODE}")


def _pods(cluster, namespace: str, selector: str) -> list[dict]:
    return items(cluster, f"/api/v1/namespaces/{namespace}/pods", selector)


def test_drafttraining_example_trains_on_mi300x_nodes_and_the_serving_example_rolls_in_its_draft(
    cluster, manual_namespace, mi300x_node, tmp_path
):
    """examples/drafttraining.yaml with the prerequisites its header lists, and
    examples/specdecodedeployment.yaml, which serves its draft: the serving example serves the
    target alone until the DraftTraining succeeds, every stage pod lands on the MI300X node its
    selector names, with the GPUs, toleration, ServiceAccount and token the example asks for."""
    ns = manual_namespace
    install_chart_crds(cluster)
    training_path = REPO_ROOT / "examples" / "drafttraining.yaml"
    serving_path = REPO_ROOT / "examples" / "specdecodedeployment.yaml"
    training, serving = (yaml.safe_load(p.read_text()) for p in (training_path, serving_path))
    name, server = training["metadata"]["name"], serving["metadata"]["name"]
    assert serving["spec"]["draft"]["fromDraftTraining"] == name
    # The header's prerequisites: the claims, the token Secret and the stage pods' ServiceAccount.
    for claim in ("prompts", "drafts"):
        bind_volume(cluster, ns, claim, create_claim=True)
    bind_volume(cluster, ns, f"{name}-workspace", create_claim=False)
    cluster.kubectl("-n", ns, "create", "secret", "generic", "hf-token", "--from-literal=HF_TOKEN=hf_test")
    cluster.kubectl("-n", ns, "create", "serviceaccount", training["spec"]["runtime"]["serviceAccountName"])
    selector = training["spec"]["scheduling"]["nodeSelector"]
    assert set(selector) <= set(testbed_kwok.GPU_NODE_LABELS), f"not a node labeller label: {selector}"

    operator = OperatorProcess(cluster, [ns], tmp_path / "operator.log").start()
    try:
        for path in (training_path, serving_path):
            cluster.kubectl("apply", "-n", ns, "-f", str(path))
        waiting = wait_until(
            lambda: (
                condition(b := cluster.request("GET", spec_decode_path(ns, server)), "Available").get(
                    "status"
                )
                == "True"
                and b
            ),
            timeout=90,
            what=f"{serving_path.name} serving the target alone",
        )
        assert condition(waiting, "DraftResolved")["reason"] == "WaitingForDraftTraining"
        (deployment,) = [
            d
            for d in cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments")["items"]
            if d["metadata"]["name"] == server
        ]
        assert "--speculative-config" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

        # The target vLLM server runs while data is generated (scaled to zero after that).
        (target,) = wait_until(
            lambda: [
                p
                for p in _pods(cluster, ns, f"eagle3.ai/draft-training={name}")
                if p["status"].get("phase") == "Running" and "eagle3.ai/stage" not in p["metadata"]["labels"]
            ],
            timeout=60,
            what="the target server's pod running",
        )
        done = drive_to_success(cluster, ns, name)
        export = f"llama31-8b/eagle3/{export_version(fakes.EXPORT_DIGEST)}"  # published under its digest
        assert done["status"]["export"]["uri"] == f"pvc://drafts/{export}"
        stage_pods = [target, *_pods(cluster, ns, "eagle3.ai/stage")]
        by_stage = {}
        for pod in stage_pods:
            by_stage.setdefault(pod["metadata"]["labels"].get("eagle3.ai/stage", "target"), []).append(pod)
        assert sorted(by_stage) == ["evaluate", "export", "extract", "generate", "select", "target", "train"]
        for pod in stage_pods:
            spec, pod_name = pod["spec"], pod["metadata"]["name"]
            assert spec["nodeName"] == mi300x_node, f"{pod_name} on {spec['nodeName']}"
            assert spec["nodeSelector"] == selector, pod_name
            assert training["spec"]["scheduling"]["tolerations"][0] in spec["tolerations"], pod_name
            (container,) = spec["containers"]
            token = {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}},
            }
            assert token in container["env"], pod_name
        gpus = {
            stage: sorted(
                int(p["spec"]["containers"][0].get("resources", {}).get("limits", {}).get("amd.com/gpu", 0))
                for p in pods
            )
            for stage, pods in by_stage.items()
        }
        assert gpus == {
            "generate": [0],
            "target": [1],
            "extract": [1],
            "train": [8],
            "evaluate": [1, 1],
            "select": [0],
            "export": [0],
        }
        (train,) = by_stage["train"]
        assert train["spec"]["containers"][0]["command"][:4] == [
            "torchrun", "--nnodes=1", "--nproc-per-node=8", "--standalone",
        ]  # fmt: skip
        assert all(
            p["spec"]["serviceAccountName"] == training["spec"]["runtime"]["serviceAccountName"]
            for stage, pods in by_stage.items()
            if stage != "target"
            for p in pods
        )

        def rolled_in() -> dict | None:
            body = cluster.request("GET", spec_decode_path(ns, server))
            return body if condition(body, "DraftResolved").get("reason") == "FromDraftTraining" else None

        resolved = wait_until(rolled_in, timeout=60, what=f"{serving_path.name} resolving the trained draft")
        assert resolved["status"]["resolvedDraft"]["uri"] == f"pvc://drafts/{export}"
        deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{server}")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        config = json.loads(container["args"][container["args"].index("--speculative-config") + 1])
        assert config == {
            "method": "eagle3",
            "model": f"/models/draft/{export}",
            "num_speculative_tokens": 3,
        }
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in deployment["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert claims == ["drafts"]
        wait_until(
            lambda: (
                condition(cluster.request("GET", spec_decode_path(ns, server)), "Available").get("status")
                == "True"
                and all(
                    p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
                    for p in _pods(cluster, ns, f"eagle3.ai/spec-decode-deployment={server}")
                    if not p["metadata"].get("deletionTimestamp")
                )
            ),
            timeout=90,
            what=f"{serving_path.name} Available with its draft",
        )
        assert cluster.request("GET", draft_training_path(ns, name))["status"]["phase"] == "Succeeded"
    except BaseException:
        print(f"--- operator log ---\n{operator.log_tail(80)}")
        raise
    finally:
        operator.stop()
