"""The correctness gate of a SpecDecodeDeployment (spec.verification): a newly resolved draft serves
only after an `eagle3 verify` Job passes with it; meanwhile the pods keep the draft they serve.

Pure: from the spec, the draft resolve_draft chose (the candidate), the draft the pods serve, and
the observed verify Jobs and their pods to the draft to serve, the Job to create, status.verification,
status.rejectedDrafts and the DraftVerified condition with its Events. A draft that fails goes to
status.rejectedDrafts (phase Verification) and is not checked again until spec.draft changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eagle3_api.command_line import flags
from eagle3_api.spec_decode_deployment import SpecDecodeDeployment
from eagle3_api.stage_plan import source_arg
from eagle3_api.workspace import content_hash
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.conditions import set_condition
from eagle3_operator.reconcile.jobs import STAGE_CONTAINER, job_outcome
from eagle3_operator.reconcile.plan import Event
from eagle3_operator.reconcile.pods import (
    TERMINATION_LOG,
    Mounts,
    PodPolicy,
    apply_pod_policy,
    gpu_resources,
    model_location,
    vllm_env,
)
from eagle3_operator.reconcile.speculation import applied_speculation
from eagle3_operator.reconcile.training_children import ClaimLocations

COMPONENT = "verify"
PHASE = "Verification"
CONDITION = "DraftVerified"


def draft_identity(draft: dict[str, Any]) -> dict[str, Any]:
    """What names a draft artifact for the gate: its digest when known, else where it is."""
    return {"digest": draft.get("digest"), "uri": draft["uri"]}


def same_draft(record: dict[str, Any] | None, draft: dict[str, Any]) -> bool:
    return record is not None and draft_identity(record) == draft_identity(draft)


def job_name(sdd_name: str, draft: dict[str, Any], draft_spec: str) -> str:
    """One Job per draft and spec.draft (a changed spec.draft checks a rejected draft again); at
    most 63 characters, as the name is also a pod label."""
    return f"{sdd_name}-verify-{content_hash([draft_identity(draft), draft_spec])[:5]}"


def verify_job(
    body: dict[str, Any], sdd: SpecDecodeDeployment, draft: dict[str, Any], name: str
) -> dict[str, Any]:
    """The Job that runs `eagle3 verify` for `draft`: a pod like the serving pod (the target and the
    draft mounted the same way, its GPUs, scheduling, security and vLLM settings)."""
    spec, check = sdd.spec, sdd.spec.verification
    target = spec.target
    mounts = Mounts()
    # The K the pods will serve (with auto, the schedule's largest: the most drafted per step).
    served_k = applied_speculation(spec, draft.get("speculationSchedule"))["numSpeculativeTokens"]
    argv = ["verify"]
    argv += flags(
        {
            "--target": model_location(target.model, "target", mounts),
            "--draft": model_location(draft["uri"], "draft", mounts),
            "--num-prompts": check.num_prompts,
            "--max-tokens": check.max_tokens,
            "--num-speculative-tokens": served_k,
            "--max-flips": check.max_flips,
            "--flip-tolerance": format(check.flip_tolerance, "g"),
            "--min-acceptance-length": format(check.min_acceptance_length, "g"),
        }
    )
    locations = ClaimLocations(mounts)
    for source in check.prompts:
        argv += ["--prompts", source_arg(source, locations)]
    argv += flags(
        {
            "--attention-backend": target.attention_backend or None,
            "--max-model-len": target.max_model_len or None,
        }
    )
    argv += [f"--vllm-arg={arg}" for arg in [*target.vllm_model_args, *target.extra_args]]
    mounts.add_shm(target.shm_size)
    mounts.add({"name": "hf-cache", "emptyDir": {}}, "/cache")
    container = {
        "name": STAGE_CONTAINER,
        "image": check.image,
        "imagePullPolicy": check.image_pull_policy,
        "command": ["eagle3", *argv, "--result-file", TERMINATION_LOG],
        "env": vllm_env(target),
        "resources": gpu_resources(target, target.gpus, target.resources.to_json()),
        "volumeMounts": mounts.mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": mounts.volumes,
        "automountServiceAccountToken": False,
    }
    apply_pod_policy(
        pod_spec,
        PodPolicy.of(spec),
        gpus=target.gpus,
        gpu_resource=target.gpu_resource_name,
        runtime_user=True,
    )
    labels = meta.labels(body["metadata"]["name"], COMPONENT, meta.SPEC_DECODE_LABEL)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta.object_meta(body, name, labels),
        "spec": {
            "backoffLimit": 0,  # a failed check is a verdict, not a flake to retry
            "activeDeadlineSeconds": check.deadline_seconds,
            # The verdict lives on in status; the finished Job stays a day for its logs.
            "ttlSecondsAfterFinished": 86_400,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


@dataclass
class Gate:
    """The gate's decision for one reconcile."""

    serve: dict[str, Any] | None  # the resolvedDraft record the pods serve (None: the target alone)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # verify Jobs to create
    verification: dict[str, Any] | None = None  # status.verification
    rejected: list[dict[str, Any]] = field(default_factory=list)  # status.rejectedDrafts
    condition: tuple[str, str, str] | None = None  # DraftVerified (status, reason, message); None: none
    events: list[Event] = field(default_factory=list)


def gate(
    body: dict[str, Any],
    sdd: SpecDecodeDeployment,
    candidate: dict[str, Any] | None,
    served: dict[str, Any] | None,
    jobs: dict[str, dict[str, Any]],
    pods: list[dict[str, Any]],
    now: str,
) -> Gate:
    """What serves while `candidate` (resolve_draft's choice) is checked, and what the check says.

    `served` is what the pods serve now (status.resolvedDraft); `jobs` the verify Jobs by name and
    `pods` their pods."""
    status = body.get("status") or {}
    rejected = list(status.get("rejectedDrafts") or [])
    if not sdd.spec.verification.enabled or candidate is None:
        return Gate(serve=candidate, rejected=rejected)
    draft_spec = content_hash(body["spec"].get("draft") or {})
    previous = status.get("verification")
    if previous and previous.get("draftSpec") != draft_spec:
        # spec.draft changed: drafts it rejected may be checked again.
        rejected = [r for r in rejected if r.get("phase") != PHASE]
        previous = None
    uri = candidate["uri"]
    refused = next((r for r in rejected if r.get("phase") == PHASE and same_draft(r, candidate)), None)
    if refused:
        message = f"draft {uri} failed verification: {refused['message']}; {_keeps(served)} until spec.draft changes"
        return Gate(
            served,
            verification=previous,
            rejected=rejected,
            condition=("False", "VerificationFailed", message),
        )
    checked = previous if same_draft(previous, candidate) else None
    if same_draft(served, candidate) or (checked and checked["result"] == "Passed"):
        # Verified, or served from before the gate was enabled.
        passed = checked is not None and checked["result"] == "Passed"
        condition = ("True", "Verified", checked["message"]) if passed else None
        return Gate(candidate, verification=previous, rejected=rejected, condition=condition)
    name = job_name(body["metadata"]["name"], candidate, draft_spec)
    record = {**draft_identity(candidate), "job": name, "draftSpec": draft_spec}
    record = {k: v for k, v in record.items() if v is not None}
    running = f"verifying draft {uri} (Job {name}); {_keeps(served)} meanwhile"
    job = jobs.get(name)
    if job is None:
        return Gate(
            served,
            jobs=[verify_job(body, sdd, candidate, name)],
            verification=record | {"result": "Running", "message": running},
            rejected=rejected,
            condition=("Unknown", "Verifying", running),
            events=[Event("Normal", "VerificationStarted", running)],
        )
    outcome = job_outcome(job, [p for p in pods if p["metadata"].get("labels", {}).get("job-name") == name])
    if outcome.state == "Running":
        return Gate(
            served,
            verification=record | {"result": "Running", "message": running},
            rejected=rejected,
            condition=("Unknown", "Verifying", running),
        )
    metrics = outcome.result.metrics if outcome.result else {}
    figures = {
        "identical": metrics.get("identical"),
        "flips": metrics.get("flips"),
        "mismatches": metrics.get("mismatches"),
        "acceptanceLength": metrics.get("acceptance_length"),
    }
    figures = {k: v for k, v in figures.items() if v is not None}
    if outcome.state == "Succeeded":
        verdict = outcome.result.message if outcome.result else f"Job {name} succeeded"
        message = f"draft {uri} verified: {verdict}"
        return Gate(
            candidate,
            verification=record | figures | {"result": "Passed", "message": message},
            rejected=rejected,
            condition=("True", "Verified", message),
            events=[Event("Normal", "DraftVerified", message)],
        )
    reason = outcome.result.message if outcome.result and outcome.result.message else outcome.message
    message = f"draft {uri} failed verification: {reason}"
    entry = {
        **draft_identity(candidate),
        "phase": PHASE,
        "reason": "VerificationFailed",
        "message": reason,
        "rejectedAt": outcome.finished_at or now,
    }
    rejected.append({k: v for k, v in entry.items() if v is not None})
    return Gate(
        served,
        verification=record | figures | {"result": "Failed", "message": message},
        rejected=rejected,
        condition=("False", "VerificationFailed", f"{message}; {_keeps(served)} until spec.draft changes"),
        events=[Event("Warning", "DraftRejected", message)],
    )


def _keeps(served: dict[str, Any] | None) -> str:
    return f"the pods keep serving {served['uri']}" if served else "the target serves without a draft"


def apply_gate(
    result: Gate, status: dict[str, Any], conditions: list[dict[str, Any]], generation: int | None, now: str
) -> None:
    """Write the gate's status fields and DraftVerified into `status` and `conditions`."""
    for key, value in (("verification", result.verification), ("rejectedDrafts", result.rejected)):
        if value:
            status[key] = value
        else:
            status.pop(key, None)
    if result.condition is None:
        conditions[:] = [c for c in conditions if c["type"] != CONDITION]
    else:
        set_condition(conditions, CONDITION, *result.condition, generation, now)
