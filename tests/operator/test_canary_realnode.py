"""A canary rollout of real vLLM pods on the test bed's real node: a bad draft rolled back, a good one promoted.

The operator runs as the harness runs it and reads the pods' vLLM /metrics. Two replicas serve the
tiny target with the constant draft of tests/monitoring/constant_draft.py (proposing the token the
target emits most often) behind the one Service; the prompts are those after which the target
emits that token most, so the stable track accepts plenty. Then, with `rollout.strategy: Canary`:

- spec.draft moves to a draft that proposes a token the target never emits (acceptance 0): a
  canary pod takes one of the two replicas, the analysis rolls it back (scaled to zero, its draft in
  status.rejectedDrafts, RolledBack, a Warning Event) before its window is full;
- spec.draft moves to a copy of the stable draft (another artifact, as good as stable): promoted
  once its window is full, the stable track moves to it and the canary Deployment goes.

A client in a pod on the real node (ClusterIPs are reachable only from pods) sends completions
through the Service's ClusterIP, one new connection each, from before the first rollout to after
the promotion and the deletion of a serving pod after it; none may fail.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.monitoring.constant_draft import build_constant_draft, greedy_outputs
from tests.operator.harness import condition, events_of, get, spec_decode_path
from tests.operator.test_serving_realnode import SPEC_TOKENS
from tests.operator.test_serving_realnode import manifest as serving_manifest
from tests.support import realnode
from tests.support.cluster import wait_until

SDD = "canary"
MAX_TOKENS = 32
INTERVAL_S = 5
ANALYSIS_S = 30
VLLM_START_TIMEOUT_S = 600  # image start, vLLM start-up on a shared 2-core machine
CLIENT = "canary-client"
# A completion through the Service per line: "ok SECONDS" or "FAIL ERROR". SIGTERM ends it.
CLIENT_SCRIPT = """
import json, signal, sys, time, urllib.request
base, prompts, max_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
with urllib.request.urlopen(base + "/v1/models", timeout=60) as response:
    model = json.load(response)["data"][0]["id"]
print("model", model, flush=True)
sent = 0
while not stopping:
    body = {"model": model, "prompt": prompts[sent % len(prompts)], "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            json.load(response)["choices"][0]["text"]
        print("ok", round(time.monotonic() - started, 3), flush=True)
    except Exception as error:
        print("FAIL", repr(error), flush=True)
    sent += 1
"""


def accepted_length(outputs: list[list[int]], token: int, k: int = SPEC_TOKENS) -> float:
    """The mean acceptance length a draft always proposing `token` gets on these greedy outputs."""
    drafts = accepted = 0
    for output in outputs:
        i = 0
        while i < len(output):
            n = 0
            while n < k and i + n < len(output) and output[i + n] == token:
                n += 1
            drafts, accepted, i = drafts + 1, accepted + n, i + n + 1
    return 1 + accepted / drafts


def manifest(namespace: str) -> dict:
    """The live-acceptance test's SpecDecodeDeployment, with two replicas and a canary rollout."""
    body = serving_manifest(namespace)
    body["metadata"]["name"] = SDD
    spec = body["spec"]
    spec["replicas"] = 2
    spec["draft"] = {"model": "pvc://drafts/stable"}
    spec["target"]["resources"]["requests"]["memory"] = "1Gi"  # three vLLM pods at a time on the node
    spec["liveAcceptance"] = {"intervalSeconds": INTERVAL_S, "windowSeconds": ANALYSIS_S, "minDrafts": 20}
    spec["rollout"] = {
        "strategy": "Canary",
        "maxSurge": "1",
        "canary": {
            "replicas": 1,
            "analysisSeconds": ANALYSIS_S,
            "minDrafts": 30,
            # Two vLLM pods on 2 shared cores: latency differs by neighbours more than by draft.
            "gates": {"minAcceptanceRatio": 0.8, "maxLatencyRatio": 4},
        },
    }
    return body


@pytest.mark.slow
@pytest.mark.timeout(3000)  # four vLLM start-ups one after another: about 30 min at load average 25
def test_a_bad_draft_is_rolled_back_and_a_good_one_promoted_without_a_failed_request(
    cluster, real_node_namespace, start_operator, tmp_path
):
    ns = real_node_namespace
    target = ensure_tiny_target()
    candidates = [text[:400] for text in stdlib_corpus(0.3)]
    outputs = greedy_outputs(target, candidates, MAX_TOKENS)
    emitted = [token for output in outputs for token in output]
    token = max(set(emitted), key=emitted.count)
    prompts = [p for p, out in zip(candidates, outputs, strict=True) if accepted_length([out], token) >= 1.5]
    assert len(prompts) >= 2, f"too few prompts after which the target emits {token} often"
    never = next(t for t in range(1, 4096) if t not in emitted)
    drafts = tmp_path / "claims" / "drafts"
    build_constant_draft(target, drafts / "stable", token)
    shutil.copytree(drafts / "stable", drafts / "good")  # the same draft, published again
    build_constant_draft(target, drafts / "bad", never)
    cluster.real_node.host_folder_claims(cluster, ns, tmp_path / "claims", tiny_target="target/target")
    start_operator(ns)
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest(ns)))
    wait_until(
        lambda: _ready_replicas(cluster, ns) == 2,
        timeout=VLLM_START_TIMEOUT_S,
        interval=2,
        what="2 ready vLLM pods",
    )
    print(f"stable track ready after {time.monotonic() - started:.0f} s")

    service = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/{SDD}")
    base = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    _start_client(cluster, ns, base, prompts)
    try:
        wait_until(
            lambda: _results(cluster, ns)[0] >= 3, timeout=120, interval=1, what="the client's answers"
        )

        # The bad draft: rolled back by the analysis, before its window is full.
        phase_started = time.monotonic()
        _set_draft(cluster, ns, "pvc://drafts/bad")
        body = wait_until(
            lambda: _with(cluster, ns, "RolledBack", "True"),
            timeout=VLLM_START_TIMEOUT_S + 120,
            interval=2,
            what="RolledBack True",
        )
        print(
            f"bad draft rolled back {time.monotonic() - phase_started:.0f} s after the change; "
            f"status.canary {body['status']['canary']}"
        )
        canary = body["status"]["canary"]
        assert canary["phase"] == "RolledBack" and canary["draft"]["uri"] == "pvc://drafts/bad"
        assert canary["canary"]["windowSeconds"] < ANALYSIS_S, "decided within the window"
        assert canary["canary"]["meanAcceptanceLength"] < 1.05 < canary["stable"]["meanAcceptanceLength"]
        assert canary["canary"]["requests"] > 0, "the canary served through the Service"
        (rejected,) = body["status"]["rejectedDrafts"]
        assert (rejected["uri"], rejected["phase"], rejected["reason"]) == (
            "pvc://drafts/bad",
            "Canary",
            "AcceptanceBelowGate",
        )
        assert rejected["message"].startswith("acceptance length canary 1.000 / stable ")
        assert condition(body, "CanaryProgressing")["reason"] == "RolledBack"
        events = [(e["type"], e["reason"]) for e in events_of(cluster, ns, SDD)]
        assert ("Normal", "CanaryStarted") in events and ("Warning", "CanaryRolledBack") in events
        wait_until(
            lambda: _deployment_replicas(cluster, ns) == {SDD: 2, f"{SDD}-canary": 0},
            timeout=60,
            interval=1,
            what="stable back at 2 replicas, the canary at 0",
        )

        # The good draft: promoted after a full window; the stable track moves to it.
        phase_started = time.monotonic()
        _set_draft(cluster, ns, "pvc://drafts/good")
        body = wait_until(
            lambda: _with(cluster, ns, "Promoted", "True"),
            timeout=2 * VLLM_START_TIMEOUT_S,
            interval=2,
            what="Promoted True",
        )
        print(
            f"good draft promoted {time.monotonic() - phase_started:.0f} s after the change; "
            f"status.canary {body['status']['canary']}"
        )
        canary = body["status"]["canary"]
        assert canary["phase"] == "Promoted" and canary["reason"] == "GatesPassed"
        assert canary["canary"]["windowSeconds"] >= 0.9 * ANALYSIS_S
        assert body["status"]["resolvedDraft"]["uri"] == "pvc://drafts/good"
        assert len(body["status"]["rejectedDrafts"]) == 1
        assert ("Normal", "CanaryPromoted") in [(e["type"], e["reason"]) for e in events_of(cluster, ns, SDD)]
        wait_until(
            lambda: _deployment_replicas(cluster, ns) == {SDD: 2},
            timeout=60,
            interval=1,
            what="the canary Deployment gone, stable at 2 replicas",
        )
        answered_before = _results(cluster, ns)[0]
        wait_until(
            lambda: _results(cluster, ns)[0] >= answered_before + 3,
            timeout=120,
            interval=1,
            what="answers after the promotion",
        )

        # A serving pod deleted as a drain or `kubectl delete pod` deletes it, once the promoted track's
        # two pods serve: it leaves the Service's endpoints while it still serves (preStop), so the
        # client's requests go to the other one. (Deleting the only ready pod fails requests: seen.)
        wait_until(
            lambda: _rolled_out(cluster, ns),
            timeout=VLLM_START_TIMEOUT_S,
            interval=2,
            what="2 promoted pods ready",
        )
        serving = f"/api/v1/namespaces/{ns}/pods?labelSelector=eagle3.ai/spec-decode-deployment={SDD}"
        victim = next(
            p["metadata"]["name"]
            for p in cluster.request("GET", serving)["items"]
            if not p["metadata"].get("deletionTimestamp")
        )
        answered_before = _results(cluster, ns)[0]
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{victim}")
        wait_until(
            lambda: get(cluster, f"/api/v1/namespaces/{ns}/pods/{victim}") is None,
            timeout=120,
            interval=1,
            what=f"the deleted pod {victim} gone",
        )
        wait_until(
            lambda: _results(cluster, ns)[0] >= answered_before + 3,
            timeout=120,
            interval=1,
            what="answers after a serving pod was deleted",
        )
        print(f"serving pod {victim} deleted: {_results(cluster, ns)[0] - answered_before} answers since")
    except BaseException:
        _print_diagnosis(cluster, ns)
        raise
    finally:
        ok, failed = _results(cluster, ns)
        print(f"client: {ok} completions, {len(failed)} failed; test {time.monotonic() - started:.0f} s")
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{CLIENT}")
    assert failed == [], f"requests through the Service failed: {failed[:5]}"


def _start_client(cluster, namespace: str, base: str, prompts: list[str]) -> None:
    container = {
        "name": "main",
        "image": realnode.RUNTIME_IMAGE_NAMES[0],
        "imagePullPolicy": "Never",
        "command": ["python", "-c", CLIENT_SCRIPT, base, json.dumps(prompts), str(MAX_TOKENS)],
    }
    spec = realnode.on_real_node(
        {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [container]}
    )
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT}, "spec": spec}
    cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)


def _results(cluster, namespace: str) -> tuple[int, list[str]]:
    """(completions answered, failures) so far, from the client's log."""
    lines = cluster.kubectl("logs", "-n", namespace, CLIENT, check=False).splitlines()  # empty until it runs
    return sum(line.startswith("ok ") for line in lines), [line for line in lines if line.startswith("FAIL")]


def _ready_replicas(cluster, namespace: str) -> int:
    return (
        cluster.request("GET", spec_decode_path(namespace, SDD)).get("status", {}).get("readyReplicas") or 0
    )


def _rolled_out(cluster, namespace: str) -> bool:
    """The stable Deployment's rollout is complete: its 2 pods are of the current template and ready."""
    deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{SDD}")
    status = deployment.get("status") or {}
    return status.get("observedGeneration") == deployment["metadata"]["generation"] and all(
        status.get(field) == 2
        for field in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
    )


def _set_draft(cluster, namespace: str, uri: str) -> None:
    patch = json.dumps({"spec": {"draft": {"model": uri}}})
    cluster.kubectl("patch", "sdd", SDD, "-n", namespace, "--type=merge", "-p", patch)


def _with(cluster, namespace: str, type_: str, status: str) -> dict | None:
    body = cluster.request("GET", spec_decode_path(namespace, SDD))
    return body if condition(body, type_).get("status") == status else None


def _deployment_replicas(cluster, namespace: str) -> dict[str, int]:
    found = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments")["items"]
    return {d["metadata"]["name"]: d["spec"]["replicas"] for d in found}


def _print_diagnosis(cluster, namespace: str) -> None:
    """What a failed run needs to be understood from CI's log alone: the rollout's status, every pod on
    the real node (this test's and other tests' still running), this namespace's workloads, Events and logs."""
    status = cluster.request("GET", spec_decode_path(namespace, SDD)).get("status", {})
    print("status.canary:", json.dumps(status.get("canary")))
    print(
        "conditions:",
        json.dumps([(c["type"], c["status"], c["reason"]) for c in status.get("conditions", [])]),
    )
    for pod in cluster.request("GET", "/api/v1/pods")["items"]:
        if pod["spec"].get("nodeName") != realnode.NODE_NAME:
            continue
        states = [
            (c["name"], c.get("ready"), c.get("restartCount"), next(iter(c.get("state", {})), None))
            for c in pod["status"].get("containerStatuses") or []
        ]
        requests = [c.get("resources", {}).get("requests") for c in pod["spec"]["containers"]]
        print(
            "pod",
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["status"].get("phase"),
            states,
            requests,
        )
    print(cluster.describe_namespace(namespace))
