"""SpecDecodeDeployment on the test bed, with the operator running as a process."""

from __future__ import annotations

import json

from eagle3_api.workspace import export_version
from tests.operator import fakes
from tests.operator.harness import (
    bind_volume,
    condition,
    draft_training_path,
    drive_to_success,
    events_of,
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
    assert _speculative_config(deployment) == {
        "method": "eagle3",
        "model": "/models/draft/llama-eagle3",
        "num_speculative_tokens": 4,
    }
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


def _draft_resolved_reason(cluster, ns: str, reason: str) -> dict:
    return wait_until(
        lambda: (
            condition(b := cluster.request("GET", spec_decode_path(ns, "chat")), "DraftResolved").get(
                "reason"
            )
            == reason
            and b
        ),
        timeout=30,
        what=f"DraftResolved reason {reason}",
    )


def _template_of(deployment: dict) -> tuple:
    return deployment["metadata"]["generation"], deployment["spec"]["template"]


def test_from_draft_training_rolls_the_draft_in_and_keeps_it(crds, manual_namespace, start_operator):
    """Waits for the DraftTraining, rolls its draft in, then keeps that draft when the training
    is re-opened and deleted; only a change of spec.draft replaces it."""
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

    training = cluster.request("POST", draft_training_path(ns), training_body(ns))
    _draft_resolved_reason(cluster, ns, "WaitingForDraftTraining")
    deployment = wait_until(lambda: _deployment(cluster, ns), timeout=30, what="vLLM Deployment")
    assert _speculative_config(deployment) is None, "the target is served alone until the draft exists"

    drive_to_success(cluster, ns, "llama")
    rolled = wait_until(
        lambda: _speculative_config(d := _deployment(cluster, ns)) and d, timeout=60, what="draft rolled in"
    )
    # The export's versioned directory (named by its digest), never a path a later export rewrites.
    # In the training's own directory of its workspace claim.
    export = f"runs/{training['metadata']['uid']}/export/{export_version(fakes.EXPORT_DIGEST)}"
    assert _speculative_config(rolled) == {
        "method": "eagle3",
        "model": f"/models/draft/{export}",
        "num_speculative_tokens": 3,
    }
    volume = next(v for v in rolled["spec"]["template"]["spec"]["volumes"] if v["name"] == "draft-model")
    assert volume["persistentVolumeClaim"] == {"claimName": "llama-workspace", "readOnly": True}
    assert (
        rolled["spec"]["template"]["metadata"]["annotations"]["eagle3.ai/draft-export"] == fakes.EXPORT_DIGEST
    )
    # The status is written after the Deployment in the same reconcile: wait for it, do not race it.
    body = wait_until(
        lambda: (
            condition(b := cluster.request("GET", spec_decode_path(ns, "chat")), "DraftResolved").get(
                "status"
            )
            == "True"
            and b
        ),
        timeout=30,
        what="DraftResolved True",
    )
    pinned = {
        "model": f"/models/draft/{export}",
        "uri": f"pvc://llama-workspace/{export}",
        "source": "DraftTraining/llama",
        "draftTraining": {"name": "llama", "uid": training["metadata"]["uid"], "generation": 1},
        "acceptanceLength": 2.4,
        "digest": fakes.EXPORT_DIGEST,
    }
    assert body["status"]["resolvedDraft"] == pinned

    # Re-opened: adding export.quantize starts a quantize Job; the served draft stays.
    cluster.request("PATCH", draft_training_path(ns, "llama"), {"spec": {"export": {"quantize": "fp8"}}})
    reopened = _draft_resolved_reason(cluster, ns, "DraftTrainingNotExported")
    assert condition(reopened, "DraftResolved")["status"] == "False"
    assert reopened["status"]["resolvedDraft"] == pinned
    assert _template_of(_deployment(cluster, ns)) == _template_of(rolled), "no rollout"

    # Deleted: its consumers hear of it at once (not at the next resync) and keep the draft.
    cluster.request("DELETE", draft_training_path(ns, "llama"))
    deleted = _draft_resolved_reason(cluster, ns, "DraftTrainingDeleted")
    resolved = condition(deleted, "DraftResolved")
    assert (
        resolved["status"] == "False" and resolved["observedGeneration"] == deleted["metadata"]["generation"]
    )
    assert resolved["message"] == (
        f"DraftTraining llama was deleted; keeps serving the pinned draft pvc://llama-workspace/{export} "
        "(exported by generation 1) until a newer export succeeds"
    )
    assert deleted["status"]["resolvedDraft"] == pinned
    assert _template_of(_deployment(cluster, ns)) == _template_of(rolled), "no rollout"
    warnings = wait_until(
        lambda: (
            (
                found := {
                    e["reason"]: e["message"]
                    for e in events_of(cluster, ns, "chat")
                    if e["type"] == "Warning"
                }
            ).keys()
            >= {"DraftTrainingNotExported", "DraftTrainingDeleted"}
            and found
        ),
        timeout=30,
        what="Warning events of the SpecDecodeDeployment",
    )
    assert warnings["DraftTrainingDeleted"] == resolved["message"]
    # Scaling is a spec edit too, but it keeps the pin.
    cluster.kubectl("scale", "sdd/chat", "-n", ns, "--replicas=2")
    wait_until(
        lambda: _deployment(cluster, ns)["spec"]["replicas"] == 2, timeout=30, what="Deployment scaled"
    )
    assert _speculative_config(_deployment(cluster, ns))["model"] == f"/models/draft/{export}"
    scaled = cluster.request("GET", spec_decode_path(ns, "chat"))
    assert condition(scaled, "DraftResolved")["reason"] == "DraftTrainingDeleted"
    assert scaled["status"]["resolvedDraft"] == pinned

    # A change of spec.draft resets the pin.
    cluster.request(
        "PATCH",
        spec_decode_path(ns, "chat"),
        {"spec": {"draft": {"fromDraftTraining": None, "model": "pvc://drafts/llama-eagle3"}}},
    )
    direct = _draft_resolved_reason(cluster, ns, "FromSpec")
    assert direct["status"]["resolvedDraft"] == {
        "model": "/models/draft/llama-eagle3",
        "uri": "pvc://drafts/llama-eagle3",
        "source": "spec.draft.model",
    }
    replaced = _deployment(cluster, ns)
    assert _speculative_config(replaced)["model"] == "/models/draft/llama-eagle3"
    assert "eagle3.ai/draft-export" not in replaced["spec"]["template"]["metadata"]["annotations"]
