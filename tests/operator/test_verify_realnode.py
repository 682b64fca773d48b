"""The verification gate on the test bed's real node: the verify Job really runs `eagle3 verify`
(real vLLM, CPU build, in the test bed's runtime image) over the tiny target and the constant draft
of tests/monitoring/constant_draft.py (a real EAGLE-3 draft, accepted at a modest rate).

One SpecDecodeDeployment with spec.verification on and replicas 0 (the check's Job needs the
real node's CPU; a serving pod would only slow it), its draft asked for an acceptance floor above
what it reaches: the Job serves the target with and without the draft, the outputs are identical,
the floor fails, and the draft lands in status.rejectedDrafts with the measured reason while the
pod template keeps serving the target alone. The Job runs with the target's attention backend
(CPU_ATTN, the CPU build's own). One Job (two vLLM start-ups) keeps the suite within its budget:
a passing draft rolling out after its check, and a rejected one leaving the previous draft in
place, are covered by tests/operator/test_verification_unit.py, and the check itself passing and
failing on real vLLM by tests/runtime/test_verify.py.
"""

from __future__ import annotations

import json
import time

import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target
from eagle3_runtime.verify import BUILTIN_PROMPTS
from tests.monitoring.constant_draft import build_constant_draft, most_frequent_output_token
from tests.operator.harness import condition, events_of, spec_decode_path
from tests.operator.test_serving_realnode import manifest as serving_manifest
from tests.support.cluster import wait_until

SDD = "gate"
NUM_PROMPTS, MAX_TOKENS = 4, 24
FLOOR = 3.9  # above what the constant draft reaches (about 1.1 over these prompts)
JOB_TIMEOUT_S = 600  # two vLLM start-ups in one pod on a shared 2-core machine


def manifest(namespace: str) -> dict:
    """The real-node serving test's SpecDecodeDeployment, with the check on and no serving pod."""
    body = serving_manifest(namespace)
    body["metadata"]["name"] = SDD
    spec = body["spec"]
    spec["target"]["attentionBackend"] = "CPU_ATTN"
    spec["draft"] = {"model": "pvc://drafts/good"}
    spec["replicas"] = 0
    del spec["liveAcceptance"]
    spec["verification"] = {
        "enabled": True,
        "imagePullPolicy": "Never",
        "numPrompts": NUM_PROMPTS,
        "maxTokens": MAX_TOKENS,
        "minAcceptanceLength": FLOOR,
    }
    return body


def _verified(cluster, namespace: str, result: str) -> dict | None:
    body = cluster.request("GET", spec_decode_path(namespace, SDD))
    verification = (body.get("status") or {}).get("verification") or {}
    return body if verification.get("result") == result else None


def _template_draft(cluster, namespace: str) -> str | None:
    deployment = cluster.request("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{SDD}")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])["model"]


def _jobs(cluster, namespace: str) -> list[dict]:
    selector = f"eagle3.ai/spec-decode-deployment={SDD}"
    return cluster.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs?labelSelector={selector}")[
        "items"
    ]


@pytest.mark.slow
def test_a_draft_below_its_floor_is_rejected_and_never_served(
    cluster, real_node_namespace, start_operator, tmp_path
):
    ns = real_node_namespace
    target = ensure_tiny_target()
    token = most_frequent_output_token(target, list(BUILTIN_PROMPTS[:NUM_PROMPTS]), MAX_TOKENS)
    claims = tmp_path / "claims"
    build_constant_draft(target, claims / "drafts" / "good", token)
    cluster.real_node.host_folder_claims(cluster, ns, claims, tiny_target="target/target")
    start_operator(ns)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest(ns)))

    # Verifying: the Deployment serves the target alone meanwhile.
    running = wait_until(
        lambda: _verified(cluster, ns, "Running"), timeout=60, interval=1, what="a verify Job"
    )
    assert condition(running, "DraftVerified")["reason"] == "Verifying"
    assert _template_draft(cluster, ns) is None
    (job,) = _jobs(cluster, ns)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--attention-backend") + 1] == "CPU_ATTN"

    started = time.monotonic()
    body = wait_until(
        lambda: _verified(cluster, ns, "Failed"), timeout=JOB_TIMEOUT_S, interval=2, what="rejected"
    )
    print(f"draft rejected after {time.monotonic() - started:.0f} s: {body['status']['verification']}")
    verification = body["status"]["verification"]
    # The outputs matched (speculation was lossless); only the floor failed.
    assert verification["mismatches"] == 0
    assert verification["identical"] + verification["flips"] == NUM_PROMPTS
    assert 1 < verification["acceptanceLength"] < FLOOR
    (rejected,) = body["status"]["rejectedDrafts"]
    assert (rejected["uri"], rejected["phase"], rejected["reason"]) == (
        "pvc://drafts/good",
        "Verification",
        "VerificationFailed",
    )
    assert f"is below the floor {FLOOR}" in rejected["message"]
    verified = condition(body, "DraftVerified")
    assert (verified["status"], verified["reason"]) == ("False", "VerificationFailed")
    assert _template_draft(cluster, ns) is None
    assert "resolvedDraft" not in body["status"]
    reasons = [(e["type"], e["reason"]) for e in events_of(cluster, ns, SDD)]
    assert ("Warning", "DraftRejected") in reasons
    time.sleep(5)
    assert len(_jobs(cluster, ns)) == 1, "a rejected draft is not checked again"
