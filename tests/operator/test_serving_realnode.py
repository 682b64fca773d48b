"""Live acceptance of a SpecDecodeDeployment whose vLLM pod really runs (the test bed's real node).

The operator runs as the harness runs it (its own process on this host) and reads the pod's vLLM
/metrics at the pod's IP; vLLM is the CPU build in the test bed's runtime image, serving the tiny
target with the constant draft of tests/monitoring/constant_draft.py (a real EAGLE-3 draft whose
proposals are accepted at a steady, modest rate). Both reach the pod read-only from this host's
directories through bound claims. Requests go straight to the pod while the operator measures.

Checked: the status's live figures are counter deltas over the window (bounded by the speculative
tokens, per-position rates adding up to the acceptance length), the printer column and the
operator's own metrics show them, DraftDegraded turns True (with a Warning Event) against a high
evaluated acceptance length and False after the user lowers it, and the serving objects carry the
PodDisruptionBudget, the draft's revision annotation and a Burstable (not BestEffort) pod.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.monitoring.constant_draft import build_constant_draft, most_frequent_output_token
from tests.monitoring.live_prometheus import Load
from tests.operator.harness import condition, events_of, spec_decode_path
from tests.support import realnode
from tests.support.cluster import wait_until

SDD = "live"
SPEC_TOKENS = 3
MAX_TOKENS = 48
WINDOW_S = 30
INTERVAL_S = 5
EVALUATED = 3.9  # far above what the constant draft reaches: DraftDegraded must turn True
POD_READY_TIMEOUT_S = 600  # image start, vLLM start-up and compilation on a shared 2-core machine


def manifest(namespace: str) -> dict:
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": SDD, "namespace": namespace},
        "spec": {
            "target": {
                "model": "pvc://target/target",
                "imagePullPolicy": "Never",
                "maxModelLen": 1024,
                # Eager mode: no torch.compile at start-up (minutes on a busy 2-core machine); what is
                # measured here is the operator, not vLLM's speed.
                "extraArgs": ["--dtype", "bfloat16", "--enforce-eager"],
                "env": [*realnode.VLLM_CPU_ENV, {"name": "HF_HUB_OFFLINE", "value": "1"}],
                "resources": {"requests": {"cpu": "100m"}},
                "shmSize": "1Gi",
            },
            "draft": {"model": "pvc://drafts/constant", "acceptanceLength": EVALUATED},
            "numSpeculativeTokens": SPEC_TOKENS,
            "scheduling": {
                "nodeSelector": realnode.REAL_NODE_SELECTOR,
                "tolerations": realnode.REAL_NODE_TOLERATIONS,
            },
            "monitoring": {"serviceMonitor": False},
            "liveAcceptance": {"intervalSeconds": INTERVAL_S, "windowSeconds": WINDOW_S, "minDrafts": 20},
        },
    }


@pytest.mark.slow
def test_live_acceptance_and_draft_degraded_from_a_real_vllm_pod(
    cluster, real_node_namespace, start_operator, tmp_path
):
    ns = real_node_namespace
    target = ensure_tiny_target()
    prompts = [text[:400] for text in stdlib_corpus(0.3)[:8]]
    token = most_frequent_output_token(target, prompts, MAX_TOKENS)
    # Claims "target" (the target under target/) and "drafts" on host folders.
    claims = tmp_path / "claims"
    build_constant_draft(target, claims / "drafts" / "constant", token)
    cluster.real_node.host_folder_claims(cluster, ns, claims, tiny_target="target/target")
    operator = start_operator(ns)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest(ns)))

    def ready_pod() -> dict | None:
        selector = f"eagle3.ai/spec-decode-deployment={SDD}"
        pods = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")
        for pod in pods["items"]:
            conditions = pod["status"].get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                return pod
        return None

    started = time.monotonic()
    pod = wait_until(ready_pod, timeout=POD_READY_TIMEOUT_S, interval=2, what="a Ready vLLM pod")
    print(f"vLLM pod ready after {time.monotonic() - started:.0f} s")
    assert pod["status"]["qosClass"] == "Burstable"
    revision = pod["metadata"]["annotations"]["eagle3.ai/revision"]
    draft_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "draft-model")
    assert draft_volume["persistentVolumeClaim"]["readOnly"] is True
    budget = cluster.request("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{SDD}")
    assert budget["spec"]["maxUnavailable"] == 1

    url = f"http://{pod['status']['podIP']}:8000"
    model = httpx.get(f"{url}/v1/models", timeout=30).raise_for_status().json()["data"][0]["id"]
    load = Load(url, model, prompts, MAX_TOKENS)
    load.start()
    try:
        body = wait_until(
            lambda: _with_degraded(cluster, ns, "True"),
            timeout=WINDOW_S * 4,
            interval=1,
            what="DraftDegraded True",
        )
        print(f"{load.completed} completions; status.liveAcceptance {body['status']['liveAcceptance']}")
        (live,) = body["status"]["liveAcceptance"]
        assert (live["revision"], live["pods"]) == (revision, 1)
        length = live["meanAcceptanceLength"]
        assert body["status"]["liveAcceptanceLength"] == length
        assert 1 < length <= 1 + SPEC_TOKENS, "the constant draft gets some, never all, tokens accepted"
        assert len(live["perPositionAcceptance"]) == SPEC_TOKENS
        # vLLM counts every accepted token at its position: the rates add up to accepted/drafts.
        assert sum(live["perPositionAcceptance"]) == pytest.approx(length - 1, abs=2e-3)
        assert live["drafts"] >= 20 and live["generatedTokensPerSecond"] > 0
        assert live["window"]["seconds"] >= 0.9 * WINDOW_S
        message = condition(body, "DraftDegraded")["message"]
        assert message.startswith(f"live mean acceptance length {length:g} over ")
        assert f"evaluated {EVALUATED:g}" in message
        assert [e["type"] for e in events_of(cluster, ns, SDD) if e["reason"] == "DraftDegraded"] == [
            "Warning"
        ]

        column = "custom-columns=AL:.status.liveAcceptanceLength"
        assert float(cluster.kubectl("get", "sdd", SDD, "-n", ns, "--no-headers", "-o", column)) > 1
        assert "LIVE-AL" in cluster.kubectl("get", "sdd", SDD, "-n", ns).splitlines()[0].split()
        wait_until(
            lambda: _gauges_match(cluster, operator, ns, revision),
            timeout=30,
            interval=0.5,
            what="the operator's gauges to equal the status",
        )

        # The user lowers the reference; the pods keep serving and the next window is as evaluated.
        patch = '{"spec": {"draft": {"acceptanceLength": 1.0}}}'
        cluster.kubectl("patch", "sdd", SDD, "-n", ns, "--type=merge", "-p", patch)
        body = wait_until(
            lambda: _with_degraded(cluster, ns, "False"),
            timeout=WINDOW_S * 2,
            interval=1,
            what="DraftDegraded False",
        )
        assert condition(body, "DraftDegraded")["reason"] == "AcceptanceAsEvaluated"
        assert "DraftRecovered" in [e["reason"] for e in events_of(cluster, ns, SDD)]
        wait_until(
            lambda: _gauges_match(cluster, operator, ns, revision),
            timeout=30,
            interval=0.5,
            what="the operator's gauges to follow",
        )
    finally:
        load.stop.set()
        load.join(timeout=180)
    assert load.error is None, f"request to vLLM failed: {load.error!r}"


def _with_degraded(cluster, namespace: str, status: str) -> dict | None:
    body = cluster.request("GET", spec_decode_path(namespace, SDD))
    return body if condition(body, "DraftDegraded").get("status") == status else None


def _gauges_match(cluster, operator, namespace: str, revision: str) -> bool:
    """The operator's metrics say what the status says (read in that order; a reconcile between the
    two reads makes one poll miss)."""
    body = cluster.request("GET", spec_decode_path(namespace, SDD))
    labels = {"namespace": namespace, "specdecodedeployment": SDD}
    degraded = 1.0 if condition(body, "DraftDegraded")["status"] == "True" else 0.0
    return (
        operator.metric("eagle3_specdecode_live_acceptance_length", **labels, revision=revision)
        == body["status"].get("liveAcceptanceLength")
        and operator.metric("eagle3_specdecode_draft_degraded", **labels) == degraded
    )
