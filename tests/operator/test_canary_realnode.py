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
through the Service's ClusterIP with the OpenAI SDK, one new connection each, from before the first
rollout to the end. The rollouts and a serving pod's deletion after them need no retry. Then the
vLLM of a serving pod that answers a request is SIGKILLed: the client's retries absorb what that
fails. No request may fail.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest
from eagle3_operator.reconcile.pods import VLLM_PORT
from prometheus_client.parser import text_string_to_metric_families

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
# The OpenAI SDK's retry policy (its exponential backoff from 0.5 s, capped at 8 s, with jitter): a
# request a killed replica drops, or a connection refused before the endpoints drop it, is sent again.
# 5 retries wait 0.38-0.5, 0.75-1, 1.5-2, 3-4 and 6-8 s; the SDK's default of 2 covers 1.5 s at most.
CLIENT_RETRIES = 5
# A completion through the Service per line: "ok SECONDS", "retry MESSAGE" (the SDK's log of a
# retry it took) or "FAIL ERROR" (no retry left). SIGTERM ends it.
CLIENT_SCRIPT = """
import json, logging, signal, sys, time
import httpx2, openai
base, prompts, max_tokens, retries = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
class PrintRetries(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("Retrying request"):
            print("retry", record.getMessage(), flush=True)
sdk_log = logging.getLogger("openai")
sdk_log.setLevel(logging.INFO)
sdk_log.addHandler(PrintRetries())
# A new connection per request, so the Service spreads requests over the replicas (and tracks).
http = openai.DefaultHttpxClient(limits=httpx2.Limits(max_keepalive_connections=0))
client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=retries, timeout=300, http_client=http)
model = client.models.list().data[0].id
print("model", model, flush=True)
sent = 0
while not stopping:
    started = time.monotonic()
    try:
        client.completions.create(model=model, prompt=prompts[sent % len(prompts)], max_tokens=max_tokens, temperature=0)
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
        _wait_for_answers(cluster, ns, "the promotion")

        _wait_rolled_out(cluster, ns)
        _delete_a_serving_pod(cluster, ns)
        retries_before_kill = len(_results(cluster, ns)[1])
        assert retries_before_kill == 0, "rollouts and a deletion must need no retry: the pods leave first"

        # A serving pod's vLLM killed (SIGKILL: an OOM kill or a crash) while it answers a request:
        # that request and connections opened before the endpoints drop the pod fail, and the client's
        # retries (CLIENT_RETRIES) absorb them. The kubelet restarts the container in the same pod.
        _wait_rolled_out(cluster, ns)
        _kill_a_busy_serving_pod(cluster, ns)
        retried = _results(cluster, ns)[1]
        print(f"client retries after the kill: {len(retried)}: {retried[:4]}")
        assert retried, "the kill hit no request in flight and no connection: nothing was retried"
    except BaseException:
        _print_diagnosis(cluster, ns)
        raise
    finally:
        ok, retried, failed = _results(cluster, ns)
        print(
            f"client: {ok} completions, {len(retried)} retries, {len(failed)} failed; "
            f"test {time.monotonic() - started:.0f} s"
        )
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{CLIENT}")
    assert failed == [], f"requests through the Service failed: {failed[:5]}"


def _start_client(cluster, namespace: str, base: str, prompts: list[str]) -> None:
    container = {
        "name": "main",
        "image": realnode.RUNTIME_IMAGE_NAMES[0],
        "imagePullPolicy": "Never",
        "command": [
            "python",
            "-c",
            CLIENT_SCRIPT,
            base,
            json.dumps(prompts),
            str(MAX_TOKENS),
            str(CLIENT_RETRIES),
        ],
    }
    spec = realnode.on_real_node(
        {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [container]}
    )
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT}, "spec": spec}
    cluster.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)


def _results(cluster, namespace: str) -> tuple[int, list[str], list[str]]:
    """(completions answered, retries taken, failures) so far, from the client's log."""
    lines = cluster.kubectl("logs", "-n", namespace, CLIENT, check=False).splitlines()  # empty until it runs
    return (
        sum(line.startswith("ok ") for line in lines),
        [line for line in lines if line.startswith("retry ")],
        [line for line in lines if line.startswith("FAIL")],
    )


def _wait_for_answers(cluster, namespace: str, after: str) -> None:
    answered_before = _results(cluster, namespace)[0]
    wait_until(
        lambda: _results(cluster, namespace)[0] >= answered_before + 3,
        timeout=120,
        interval=1,
        what=f"answers after {after}",
    )


def _serving_pods(cluster, namespace: str) -> list[dict]:
    path = f"/api/v1/namespaces/{namespace}/pods?labelSelector=eagle3.ai/spec-decode-deployment={SDD}"
    return [p for p in cluster.request("GET", path)["items"] if not p["metadata"].get("deletionTimestamp")]


def _delete_a_serving_pod(cluster, namespace: str) -> None:
    """A serving pod deleted as a drain or `kubectl delete pod` deletes it, once the promoted track's
    two pods serve: it leaves the Service's endpoints while it still serves (preStop), so the
    client's requests go to the other one. (Deleting the only ready pod fails requests: seen.)"""
    victim = _serving_pods(cluster, namespace)[0]["metadata"]["name"]
    answered_before = _results(cluster, namespace)[0]
    cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{victim}")
    wait_until(
        lambda: get(cluster, f"/api/v1/namespaces/{namespace}/pods/{victim}") is None,
        timeout=120,
        interval=1,
        what=f"the deleted pod {victim} gone",
    )
    _wait_for_answers(cluster, namespace, "a serving pod was deleted")
    print(f"serving pod {victim} deleted: {_results(cluster, namespace)[0] - answered_before} answers since")


def _kill_a_busy_serving_pod(cluster, namespace: str) -> None:
    """SIGKILL the vLLM of a serving pod that has a request running (its own /metrics says so), time
    until the Service's endpoints drop it, and wait until the kubelet has restarted it in place and
    it is ready again, with no new pod and no new ReplicaSet."""
    replica_sets = _replica_sets(cluster, namespace)
    victim = wait_until(
        lambda: next((p for p in _serving_pods(cluster, namespace) if _requests_running(p) > 0), None),
        timeout=60,
        interval=0.2,
        what="a serving pod with a request running",
    )
    name, ip = victim["metadata"]["name"], victim["status"]["podIP"]
    (container,) = victim["status"]["containerStatuses"]
    killed = time.monotonic()
    cluster.real_node.kill_container(container["containerID"])
    wait_until(
        lambda: ip not in _ready_endpoints(cluster, namespace),
        timeout=60,
        interval=0.1,
        what=f"the killed pod {name} out of the Service's ready endpoints",
    )
    print(f"serving pod {name} SIGKILLed: out of the ready endpoints after {time.monotonic() - killed:.1f} s")
    wait_until(
        lambda: _restarted_and_ready(cluster, namespace, name),
        timeout=VLLM_START_TIMEOUT_S,
        interval=2,
        what=f"the killed pod {name} restarted in place and ready",
    )
    print(f"serving pod {name} ready again {time.monotonic() - killed:.0f} s after the kill")
    _wait_for_answers(cluster, namespace, "a serving pod was killed")
    assert {p["metadata"]["name"] for p in _serving_pods(cluster, namespace)} >= {name}
    assert _replica_sets(cluster, namespace) == replica_sets, "a killed container is no new revision"


def _requests_running(pod: dict) -> float:
    """vllm:num_requests_running from the pod's own /metrics (pod IPs are routed from this host)."""
    ip = pod["status"].get("podIP")
    if not ip or not all(c.get("ready") for c in pod["status"].get("containerStatuses") or [{}]):
        return 0.0
    try:
        with urllib.request.urlopen(f"http://{ip}:{VLLM_PORT}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vllm:num_requests_running"
    )


def _ready_endpoints(cluster, namespace: str) -> set[str]:
    path = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector=kubernetes.io/service-name={SDD}"
    return {
        address
        for endpoint_slice in cluster.request("GET", path)["items"]
        for endpoint in endpoint_slice.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def _restarted_and_ready(cluster, namespace: str, name: str) -> bool:
    pod = get(cluster, f"/api/v1/namespaces/{namespace}/pods/{name}")
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("restartCount", 0) >= 1 and s.get("ready") for s in statuses)


def _replica_sets(cluster, namespace: str) -> set[str]:
    found = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/replicasets")["items"]
    return {r["metadata"]["name"] for r in found}


def _ready_replicas(cluster, namespace: str) -> int:
    return (
        cluster.request("GET", spec_decode_path(namespace, SDD)).get("status", {}).get("readyReplicas") or 0
    )


def _wait_rolled_out(cluster, namespace: str) -> None:
    wait_until(
        lambda: _rolled_out(cluster, namespace),
        timeout=VLLM_START_TIMEOUT_S,
        interval=2,
        what="the stable track's 2 pods ready",
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
