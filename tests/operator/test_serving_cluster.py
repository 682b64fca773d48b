"""SpecDecodeDeployment on the test bed, with the operator running as a process."""

from __future__ import annotations

import json

from tests.operator import fakes
from tests.operator.harness import (
    bind_volume,
    condition,
    draft_training_path,
    drive_to_success,
    get,
    prepare_training_volumes,
    spec_decode_path,
    training_body,
)
from tests.support.cluster import wait_until
from tests.support.prometheus_operator import prometheus_operator_crds


def _body(ns: str, **spec) -> dict:
    body = fakes.spec_decode(**spec)
    body["metadata"] = {"name": "chat", "namespace": ns}
    return body


def _deployment(cluster, ns, name="chat"):
    return get(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")


def _args(deployment) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _speculative_config(deployment) -> dict | None:
    args = _args(deployment)
    return (
        json.loads(args[args.index("--speculative-config") + 1]) if "--speculative-config" in args else None
    )


def test_serving_deployment_scale_and_service_monitor(crds, namespace, start_operator):
    cluster, ns = crds, namespace
    with prometheus_operator_crds(cluster, kinds=["ServiceMonitor"]):
        _check_serving(cluster, ns, start_operator)


def _check_serving(cluster, ns, start_operator) -> None:
    bind_volume(cluster, ns, "drafts", create_claim=True)
    operator = start_operator(ns)
    cluster.request("POST", spec_decode_path(ns), _body(ns, numSpeculativeTokens=4))

    deployment = wait_until(lambda: _deployment(cluster, ns), timeout=30, what="vLLM Deployment")
    assert _speculative_config(deployment) == {"method": "eagle3", "model": "/models/draft/llama-eagle3",
                                                "num_speculative_tokens": 4}  # fmt: skip
    args = _args(deployment)
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == "2"
    assert container["resources"]["requests"]["amd.com/gpu"] == "2"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["securityContext"]["supplementalGroups"] == [44]
    assert deployment["metadata"]["ownerReferences"][0]["kind"] == "SpecDecodeDeployment"
    service = wait_until(
        lambda: get(cluster, f"/api/v1/namespaces/{ns}/services/chat"), timeout=30, what="Service"
    )
    assert service["spec"]["ports"][0]["port"] == 8000
    monitor = wait_until(
        lambda: get(cluster, f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors/chat"),
        timeout=30,
        what="ServiceMonitor",
    )
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"

    available = wait_until(
        lambda: (
            condition(b := cluster.request("GET", spec_decode_path(ns, "chat")), "Available").get("status")
            == "True"
            and b
        ),
        timeout=60,
        what="Available (kwok runs the pod)",
    )
    assert available["status"]["readyReplicas"] == 1
    assert available["status"]["endpoint"] == f"http://chat.{ns}.svc:8000/v1"

    # The scale subresource: what HPA/KEDA and `kubectl scale` use.
    cluster.kubectl("scale", "sdd/chat", "-n", ns, "--replicas=3")
    wait_until(
        lambda: _deployment(cluster, ns)["spec"]["replicas"] == 3, timeout=30, what="Deployment scaled"
    )
    scaled = wait_until(
        lambda: (
            (b := cluster.request("GET", spec_decode_path(ns, "chat")))["status"].get("readyReplicas") == 3
            and b
        ),
        timeout=60,
        what="3 ready replicas in status",
    )
    scale = cluster.request("GET", spec_decode_path(ns, "chat") + "/scale")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == scaled["status"]["selector"]
    assert "app.kubernetes.io/instance=chat" in scale["status"]["selector"]
    assert (
        operator.metric("eagle3_operator_reconcile_total", kind="SpecDecodeDeployment", result="success") > 0
    )


def test_from_draft_training_waits_then_rolls_the_draft_in(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    prepare_training_volumes(cluster, ns)
    start_operator(ns)
    cluster.request("POST", spec_decode_path(ns), _body(ns, draft={"fromDraftTraining": "llama"}))
    waiting = wait_until(
        lambda: condition(b := cluster.request("GET", spec_decode_path(ns, "chat")), "DraftResolved") and b,
        timeout=30,
        what="DraftResolved condition",
    )
    assert condition(waiting, "DraftResolved")["status"] == "False"
    assert condition(waiting, "DraftResolved")["reason"] == "DraftTrainingNotFound"

    cluster.request("POST", draft_training_path(ns), training_body(ns))
    wait_until(
        lambda: (
            condition(cluster.request("GET", spec_decode_path(ns, "chat")), "DraftResolved").get("reason")
            == "WaitingForDraftTraining"
        ),
        timeout=30,
        what="WaitingForDraftTraining",
    )
    deployment = wait_until(lambda: _deployment(cluster, ns), timeout=30, what="vLLM Deployment")
    assert _speculative_config(deployment) is None, "the target is served alone until the draft exists"

    drive_to_success(cluster, ns, "llama")
    rolled = wait_until(
        lambda: _speculative_config(d := _deployment(cluster, ns)) and d, timeout=60, what="draft rolled in"
    )
    assert _speculative_config(rolled) == {"method": "eagle3", "model": "/models/draft/export",
                                            "num_speculative_tokens": 3}  # fmt: skip
    volume = next(v for v in rolled["spec"]["template"]["spec"]["volumes"] if v["name"] == "draft-model")
    assert volume["persistentVolumeClaim"] == {"claimName": "llama-workspace", "readOnly": True}
    body = cluster.request("GET", spec_decode_path(ns, "chat"))
    assert condition(body, "DraftResolved")["status"] == "True"
    assert body["status"]["resolvedDraft"] == {"model": "/models/draft/export", "source": "DraftTraining/llama",
                                               "acceptanceLength": 2.4}  # fmt: skip
