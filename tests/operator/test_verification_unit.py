"""The verification gate (reconcile/verification.py) through the SpecDecodeDeployment planner,
without a cluster: a new draft serves only after its `eagle3 verify` Job passes; the old draft
(or the target alone) serves meanwhile; a failing draft is rejected with the reason and not
checked again until spec.draft changes."""

from __future__ import annotations

import json

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from eagle3_runtime.cli import build_parser
from tests.operator import fakes

GATED = {"enabled": True, "numPrompts": 8, "maxTokens": 32, "maxFlips": 0, "minAcceptanceLength": 1.4}
TARGET = {"model": "pvc://models/llama", "gpus": 1, "attentionBackend": "ROCM_AITER_FA",
          "maxModelLen": 4096, "extraArgs": ["--enforce-eager"]}  # fmt: skip
PASSED = fakes.result(
    "verify",
    message="8/8 outputs identical with the draft, 0 near-tie flips (max 0), acceptance length 2.100",
    identical=8,
    flips=0,
    mismatches=0,
    acceptance_length=2.1,
)
FAILED = fakes.result(
    "verify",
    ok=False,
    message="acceptance length 1.100 over 40 drafts is below the floor 1.4",
    identical=8,
    flips=0,
    mismatches=0,
    acceptance_length=1.1,
)


def _body(draft: str = "pvc://drafts/v1", status: dict | None = None, **spec) -> dict:
    body = fakes.spec_decode(target=TARGET, draft={"model": draft}, verification=GATED, **spec)
    if status is not None:
        body["status"] = status
    return body


def _served(plan) -> dict | None:
    args = next(o for o in plan.sync if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]["args"]
    if "--speculative-config" not in args:
        return None
    return json.loads(args[args.index("--speculative-config") + 1])["model"]


def _condition(plan, type_: str = "DraftVerified") -> dict:
    return next(c for c in plan.status["conditions"] if c["type"] == type_)


def _reasons(plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in plan.events]


def _finish(plan, body, result: str, ok: bool) -> tuple[dict, ServingObserved]:
    """The next reconcile's input: the status written, the Job finished with `result`."""
    (job,) = plan.create
    done = fakes.finished_job(job, ok=ok)
    pod = fakes.job_pod(job, phase="Succeeded" if ok else "Failed", message=result, exit_code=0 if ok else 1)
    pod["metadata"]["labels"] |= {"app.kubernetes.io/component": "verify"}
    body = body | {"status": plan.status}
    return body, ServingObserved(
        now=fakes.NOW, verify_jobs={job["metadata"]["name"]: done}, verify_pods=[pod]
    )


def test_a_first_draft_serves_only_after_its_verify_job_passes():
    body = _body()
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _served(plan) is None, "the target serves alone while its first draft is checked"
    (job,) = plan.create
    assert plan.status["verification"]["result"] == "Running"
    assert plan.status["verification"]["job"] == job["metadata"]["name"]
    assert "resolvedDraft" not in plan.status
    assert (_condition(plan)["status"], _condition(plan)["reason"]) == ("Unknown", "Verifying")
    assert ("Normal", "VerificationStarted") in _reasons(plan)

    # The check's pod is the serving pod's twin: the same target, draft, GPUs, backend and vLLM flags.
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["eagle3", "verify"] and job["spec"]["backoffLimit"] == 0
    args = build_parser(command[1:]).parse_args(command[1:])  # the runtime's own CLI accepts it
    assert (args.target, args.draft) == ("/models/target/llama", "/models/draft/v1")
    assert (args.attention_backend, args.max_model_len, args.vllm_arg) == (
        "ROCM_AITER_FA",
        4096,
        ["--tensor-parallel-size", "1", "--enforce-eager"],
    )
    assert (args.num_prompts, args.max_tokens, args.max_flips, args.min_acceptance_length) == (8, 32, 0, 1.4)
    assert args.num_speculative_tokens == 3 and args.result_file == "/dev/termination-log"
    assert container["resources"]["limits"]["amd.com/gpu"] == "1"
    assert {
        v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v
    } == {
        "target-model": {"claimName": "models", "readOnly": True},
        "draft-model": {"claimName": "drafts", "readOnly": True},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["restartPolicy"] == "Never"
    assert job["metadata"]["labels"]["eagle3.ai/spec-decode-deployment"] == "chat"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "SpecDecodeDeployment"
    serving_args = next(o for o in plan.sync if o["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert serving_args[serving_args.index("--attention-backend") + 1] == "ROCM_AITER_FA"

    body, observed = _finish(plan, body, PASSED, ok=True)
    plan = plan_serving(body, observed)
    assert _served(plan) == "/models/draft/v1" and plan.create == []
    assert plan.status["resolvedDraft"]["uri"] == "pvc://drafts/v1"
    verification = plan.status["verification"]
    assert (verification["result"], verification["identical"], verification["flips"]) == ("Passed", 8, 0)
    assert verification["acceptanceLength"] == 2.1
    assert (_condition(plan)["status"], _condition(plan)["reason"]) == ("True", "Verified")
    assert ("Normal", "DraftVerified") in _reasons(plan)

    # Later reconciles (the Job gone after its TTL) keep serving it and start nothing.
    again = plan_serving(body | {"status": plan.status}, ServingObserved(now=fakes.NOW))
    assert _served(again) == "/models/draft/v1" and again.create == []
    assert not [e for e in again.events if e.reason in ("DraftVerified", "VerificationStarted")]


def test_a_failing_draft_is_rejected_and_the_old_one_keeps_serving():
    serving = {
        "resolvedDraft": {"model": "/models/draft/v1", "uri": "pvc://drafts/v1", "source": "spec.draft.model"}
    }
    body = _body("pvc://drafts/v2", status=serving)
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _served(plan) == "/models/draft/v1" and len(plan.create) == 1
    assert "keep serving pvc://drafts/v1" in plan.status["verification"]["message"]

    body, observed = _finish(plan, body, FAILED, ok=False)
    plan = plan_serving(body, observed)
    assert _served(plan) == "/models/draft/v1" and plan.create == []
    (rejected,) = plan.status["rejectedDrafts"]
    assert (rejected["uri"], rejected["phase"], rejected["reason"]) == (
        "pvc://drafts/v2",
        "Verification",
        "VerificationFailed",
    )
    assert rejected["message"] == "acceptance length 1.100 over 40 drafts is below the floor 1.4"
    assert plan.status["verification"]["result"] == "Failed"
    condition = _condition(plan)
    assert (condition["status"], condition["reason"]) == ("False", "VerificationFailed")
    assert (
        "below the floor 1.4" in condition["message"] and "until spec.draft changes" in condition["message"]
    )
    assert ("Warning", "DraftRejected") in _reasons(plan)

    # Not retried: the Job gone, the next reconciles still serve v1 and create nothing.
    body = body | {"status": plan.status}
    again = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _served(again) == "/models/draft/v1" and again.create == [] and again.events == []

    # A change of spec.draft (here its revision) checks the draft again, with a Job of another name.
    body["spec"]["draft"]["revision"] = "v2-fixed"
    retried = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert "rejectedDrafts" not in retried.status and len(retried.create) == 1
    assert retried.create[0]["metadata"]["name"] != observed.verify_jobs.popitem()[0]


def test_without_verification_a_draft_serves_at_once():
    body = fakes.spec_decode(target=TARGET)
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    assert _served(plan) == "/models/draft/llama-eagle3" and plan.create == []
    assert "verification" not in plan.status
    assert all(c["type"] != "DraftVerified" for c in plan.status["conditions"])


def test_verify_prompts_on_a_claim_are_mounted_read_only_and_passed_to_eagle3_verify():
    prompts = {"claimName": "eval-data", "path": "chat/prompts.jsonl", "mode": "chat"}
    body = fakes.spec_decode(
        target=TARGET, draft={"model": "pvc://drafts/v1"}, verification=GATED | {"prompts": [prompts]}
    )
    plan = plan_serving(body, ServingObserved(now=fakes.NOW))
    (job,) = plan.create
    pod = job["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--prompts") + 1] == "/sources/eval-data/chat/prompts.jsonl,mode=chat"
    (volume,) = [
        v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "eval-data"
    ]
    assert volume["persistentVolumeClaim"]["readOnly"] is True
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == "/sources/eval-data"
    args = build_parser(command[1:]).parse_args(command[1:])  # the runtime's own CLI accepts it
    assert [(p.path, p.mode) for p in args.prompts] == [("/sources/eval-data/chat/prompts.jsonl", "chat")]
