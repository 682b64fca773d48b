"""DraftTraining: the stage state machine, as pure functions: which stage runs next, which children
(reconcile/training_children.py) exist for it, the status, its conditions and Events."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eagle3_api import stage_plan
from eagle3_api.draft_training import DraftTraining
from eagle3_api.stage_plan import (
    WORKSPACE_RUNS,
    StageInputError,
    server_for,
    workspace_claim,
    workspace_path,
)
from eagle3_api.stages import STAGE_CONDITIONS
from eagle3_api.workspace import export_version
from eagle3_operator.reconcile import meta
from eagle3_operator.reconcile.conditions import get_condition, set_condition
from eagle3_operator.reconcile.disruption import disrupted_rank
from eagle3_operator.reconcile.jobs import (
    DEADLINE_EXCEEDED,
    POD_CREATION_GRACE_S,
    JobOutcome,
    job_age_s,
    job_outcome,
    lacks_pods,
    latest_progress,
)
from eagle3_operator.reconcile.network_policy import plan_network_policy
from eagle3_operator.reconcile.ownership import foreign_problem, withhold_foreign
from eagle3_operator.reconcile.plan import Event, Plan, iso, parse_iso
from eagle3_operator.reconcile.stuck import (
    REFUSAL_RETRY_S,
    Problem,
    Refusal,
    deployment_problem,
    first_pod_problem,
    job_creation_problem,
)
from eagle3_operator.reconcile.training_children import (
    server_name,
    server_service,
    stage_jobs,
    stream_server_deployment,
    target_deployment,
    trainer_service,
    workspace_pvc,
)

# A Job can be Complete a moment before its pod's termination message is visible; after this long a
# missing StageResult is a failure of the stage.
RESULT_GRACE_S = 60.0
RESULT_POLL_S = 5.0
# A Job without pods is looked at again until its pods appear or the Job controller says why not
# (FailedCreate Events are not watched); after this long the periodic resync does it.
POD_CREATION_WATCH_S = 300.0
# server -> (description, its condition type, the event reason when it is scaled down)
SERVERS = {
    "target": ("target vLLM server", "TargetReady", "TargetScaledDown"),
    "stream": ("streaming extraction server", "StreamServerReady", "StreamServerScaledDown"),
}
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
# Reasons of a stage condition in the normal course; any other reason is a stuck stage's problem.
STAGE_REASONS = {
    "Succeeded": "Completed",
    "Running": "Running",
    "Failed": "Failed",
    "Pending": "Pending",
}
WAITING_REASONS = {"target": "WaitingForTarget", "stream": "WaitingForStreamServer"}


@dataclass
class TrainingObserved:
    """The children of one DraftTraining as listed from the API server: its own (matched by its uid,
    reconcile.ownership) and, in `foreign`, those that carry its name but belong to another owner."""

    now: datetime
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    network_policies: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    # FailedCreate Events of Jobs in the namespace, read only while jobs_lacking_pods() is not empty.
    job_events: list[dict[str, Any]] = field(default_factory=list)
    # Children the API server refused in this reconcile's writes.
    refused: list[Refusal] = field(default_factory=list)

    def pods_of(self, job_name: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods
            if any((p["metadata"].get("labels") or {}).get(k) == job_name for k in JOB_NAME_LABELS)
        ]

    def server_pods(self, server: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods
            if (p["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == server
            and meta.STAGE_LABEL not in (p["metadata"].get("labels") or {})
        ]

    def jobs_lacking_pods(self) -> list[dict[str, Any]]:
        """Jobs whose FailedCreate Events are worth reading: active, past their first moments, podless."""
        return [
            job
            for name, job in sorted(self.jobs.items())
            if job_age_s(job, self.now) >= POD_CREATION_GRACE_S and lacks_pods(job, self.pods_of(name))
        ]


class TrainingPlanner:
    """Builds one reconcile's Plan for a DraftTraining from its body and observed children."""

    def __init__(self, body: dict[str, Any], observed: TrainingObserved):
        self.body = body
        self.dt = DraftTraining.model_validate(body)
        self.observed = observed
        self.now = iso(observed.now)
        self.generation = body["metadata"].get("generation")
        self.plan = Plan()

    def _event(self, type_: str, reason: str, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def _fail(self, stage: str, reason: str, message: str) -> None:
        record = self.records[stage]
        record |= {"state": "Failed", "message": message, "completionTime": self.now}
        self.failure = (reason, f"stage {stage} failed: {message}")
        self._event("Warning", "StageFailed", f"{stage}: {reason}: {message}")

    def _new_attempt(self, record: dict[str, Any]) -> dict[str, Any]:
        """A stage's next attempt (new Job names): its current Jobs go, its record starts Pending."""
        for job in record.get("jobs") or []:
            self.plan.delete.append({"apiVersion": "batch/v1", "kind": "Job", "name": job})
        return {"state": "Pending", "attempt": record.get("attempt", 0) + 1, "jobs": [], "message": ""}

    def _start_run(self, status: dict[str, Any]) -> None:
        """Fix this run's workspace directory when the object starts; on a raised spec.restart, start a
        new run: every stage again (new Jobs), in a new directory, with no result of the last run left
        in the status. The last run's Jobs go; its files stay on the claim."""
        restart, uid = self.dt.spec.restart, self.body["metadata"]["uid"]
        if status.get("restart") is None:
            # Objects that started before runs had their own directory keep the claim's root.
            status["restart"] = restart
            status.setdefault("workspacePath", "" if status.get("stages") else workspace_path(self.dt))
        elif status["restart"] < restart:
            for stage, record in self.records.items():
                self.records[stage] = {"name": stage, **self._new_attempt(record)}
            for stale in (
                "export",
                "checkpoints",
                "bestCheckpoint",
                "progress",
                "startTime",
                "completionTime",
            ):
                status.pop(stale, None)
            status["restart"] = restart
            status["workspacePath"] = f"{WORKSPACE_RUNS}/{uid}-restart-{restart}"
            again = f"training again from the first stage in {status['workspacePath']} of the workspace"
            self._event("Normal", "Restarted", f"spec.restart is {restart}: {again}")
        self.dt.status.workspace_path = status["workspacePath"]

    def _retry_if_spec_changed(self, status: dict[str, Any]) -> None:
        """After a failure, a spec edit (a new generation) retries the failed stage with new Jobs."""
        failed = get_condition(status.get("conditions") or [], "Failed")
        if status.get("phase") != "Failed" or not failed or failed.get("status") != "True":
            return
        if (failed.get("observedGeneration") or 0) >= (self.generation or 0):
            return
        for stage, record in self.records.items():
            if record["state"] != "Failed":
                continue
            record |= self._new_attempt(record)
            record.pop("groupRestarts", None)  # a retry has the whole budget again
            record.pop("disruptionRestarts", None)
            record.pop("disruption", None)
            record.pop("startTime", None)
            record.pop("completionTime", None)
            self._event("Normal", "Retrying", f"spec changed after failure: retrying stage {stage}")
        status.pop("completionTime", None)

    def _server_ready(self, server: str) -> bool:
        deployment = self.observed.deployments.get(server_name(self.dt, server))
        if not deployment:
            return False
        status = deployment.get("status") or {}
        return (status.get("readyReplicas") or 0) >= 1 and (deployment["spec"].get("replicas") or 0) >= 1

    def _record_success(self, stage: str, outcomes: list[JobOutcome], status: dict[str, Any]) -> None:
        """Store a finished stage's results; raises KeyError/ValueError on a result without its metrics."""
        record = self.records[stage]
        finished = max((o.finished_at or self.now) for o in outcomes)
        results = [o.result for o in outcomes if o.result]
        metrics = {k: v for k, v in results[0].metrics.items() if v is not None} if len(results) == 1 else {}
        updates: dict[str, Any] = {}
        if stage == "evaluate":
            evaluations = [_checkpoint_evaluation(r.metrics) for r in results]
            updates["checkpoints"] = sorted(evaluations, key=lambda e: e["step"])
            metrics = {"checkpoints": len(evaluations)}
        if stage == "select":
            filled = zip(
                metrics.get("context_lengths", []),
                metrics.get("context_acceptance_length", []),
                metrics.get("context_drafts", []),
                strict=True,
            )
            by_context = [
                {"contextLength": n, "acceptanceLength": length, "drafts": drafts}
                for n, length, drafts in filled
            ]
            by_context += [{"contextLength": n} for n in metrics.get("context_lengths_unfilled", [])]
            best = {
                "step": int(metrics["step"]),
                "acceptanceLength": metrics.get("acceptance_length"),
                "acceptanceByContextLength": sorted(by_context, key=lambda c: c["contextLength"]) or None,
            }
            updates["bestCheckpoint"] = {k: v for k, v in best.items() if v is not None}
        if stage == "sweep":
            updates["sweep"] = _sweep_result(metrics)
            metrics = {"num_speculative_tokens": metrics["num_speculative_tokens"]}
        if stage == stage_plan.stages(self.dt)[-1]:
            claim, destination = stage_plan.export_destination(self.dt)
            # The stage published the draft under its digest, beside earlier exports (never over them).
            digest = str(results[0].metrics["digest"])
            path = f"{destination}/{export_version(digest)}"
            updates["export"] = {
                "claimName": claim,
                "path": path,
                "uri": f"pvc://{claim}/{path}",
                "digest": digest,
                "format": self.dt.spec.export.format,
                "quantization": self.dt.spec.export.quantize,
            }
        status.update(updates)
        record |= {
            "state": "Succeeded",
            "completionTime": finished,
            "metrics": metrics,
            "message": "completed",
        }
        if results and results[0].message:
            record["message"] = results[0].message[:1000]
        self._event(
            "Normal", "StageSucceeded", f"{stage} completed" + (f": {_brief(metrics)}" if metrics else "")
        )
        minimum = self.dt.spec.evaluation.min_acceptance_length
        if stage == "select" and minimum is not None:
            measured = updates["bestCheckpoint"].get("acceptanceLength")
            if measured is None or measured < minimum:
                self._fail(
                    stage,
                    "AcceptanceBelowMinimum",
                    f"best checkpoint step {updates['bestCheckpoint']['step']} has acceptance length {measured}, "
                    f"below evaluation.minAcceptanceLength {minimum}",
                )

    def _advance(self, stage: str, status: dict[str, Any]) -> bool:
        """Drive one stage; True when it is done and the next one may start now."""
        record = self.records[stage]
        train_metrics = self.records["train"].get("metrics") or {}
        try:
            desired = stage_jobs(self.body, self.dt, stage, record.get("attempt", 0), train_metrics)
        except StageInputError as exc:
            self._fail(stage, "InvalidStageInput", str(exc))
            return False
        outcomes = []
        for job in desired:
            name = job["metadata"]["name"]
            observed = self.observed.jobs.get(name)
            if observed is None:
                self.plan.create.append(job)
                outcomes.append(JobOutcome("Running"))
            else:
                outcomes.append(job_outcome(observed, self.observed.pods_of(name)))
        record["jobs"] = [j["metadata"]["name"] for j in desired]
        if record["state"] == "Pending":
            record |= {"state": "Running", "startTime": self.now, "message": "running"}
            self._event("Normal", "StageStarted", f"{stage} started: " + ", ".join(record["jobs"]))
        if stage == "train" and self.dt.spec.training.nodes > 1:
            self.plan.sync.append(trainer_service(self.body, self.dt))
        progress = latest_progress([p for name in record["jobs"] for p in self.observed.pods_of(name)])
        if progress is not None:
            status["progress"] = progress.to_json()
        group = stage == "train" and self.dt.spec.training.nodes > 1
        disruption = self._disrupted_rank(record) if group else None
        if disruption:
            # The disrupted pod is gone soon after it ended, possibly before the group's Job fails
            # (when a surviving rank fails first): its record keeps the first one seen.
            record.setdefault("disruption", disruption[:1000])
        failed = [o for o in outcomes if o.state == "Failed"]
        if failed:
            message = failed[0].message
            if failed[0].reason == DEADLINE_EXCEEDED and (stuck := self._stuck_before(stage)):
                message += f"; it was stuck: {stuck}"
            disruption = disruption or record.get("disruption")
            if self._restart_trainer_group(stage, failed[0].reason, message, disruption):
                return False
            if restarts := self.records[stage].get("groupRestarts"):
                message += f" (after {restarts} restarts of the trainer group)"
            self._fail(stage, failed[0].reason, message)
            return False
        if any(o.state == "Running" for o in outcomes):
            self._look_for_stuck_pods(stage, [j["metadata"]["name"] for j in desired])
            return False
        missing = [o for o in outcomes if o.result is None]
        if missing:
            finished = [parse_iso(o.finished_at) for o in missing if o.finished_at]
            waited = max(((self.observed.now - at).total_seconds() for at in finished), default=0.0)
            if waited >= RESULT_GRACE_S:
                self._fail(
                    stage, "StageResultMissing", "the stage ended without a result in its termination message"
                )
            else:
                self.plan.requeue_after = RESULT_POLL_S
            return False
        not_ok = [o.result for o in outcomes if o.result and not o.result.ok]
        if not_ok:
            self._fail(stage, "StageReportedFailure", not_ok[0].message or "the stage reported ok=false")
            return False
        try:
            self._record_success(stage, outcomes, status)
        except (KeyError, TypeError, ValueError) as exc:
            self._fail(stage, "InvalidStageResult", f"the stage result lacks a usable metric: {exc!r}")
        return self.records[stage]["state"] == "Succeeded"

    def _disrupted_rank(self, record: dict[str, Any]) -> str | None:
        """What disrupted a rank of the stage's Jobs, as observed now (reconcile/disruption.py)."""
        for name in record["jobs"]:
            job = self.observed.jobs.get(name)
            if job and (found := disrupted_rank(job, self.observed.pods_of(name))):
                return found
        return None

    def _restart_trainer_group(self, stage: str, reason: str, message: str, disruption: str | None) -> bool:
        """A multi-node trainer Job failed (one rank, which stopped the others): start the whole group
        again in a new Job, every rank resuming from the last checkpoint. A rank that was evicted or
        preempted (`disruption`) does not spend training.groupRestarts, up to
        training.disruptionRestarts times; a crash does, while it allows. A missed deadline is not
        restarted."""
        record, training = self.records[stage], self.dt.spec.training
        if stage != "train" or training.nodes == 1 or reason == DEADLINE_EXCEEDED:
            return False
        disrupted = record.get("disruptionRestarts", 0)
        if disruption and disrupted < training.disruption_restarts:
            record.pop("disruption", None)  # the next group notes its own
            record |= self._new_attempt(record) | {
                "disruptionRestarts": disrupted + 1,
                "message": f"restarting the trainer group after a disrupted rank: {disruption}",
            }
            self._event(
                "Warning",
                "RankDisrupted",
                f"disruption restart {disrupted + 1} of {training.disruption_restarts} (groupRestarts unspent): "
                f"every rank resumes from the last checkpoint after {disruption}",
            )
            self._requeue(1)
            return True
        done = record.get("groupRestarts", 0)
        if done >= training.group_restarts:
            return False
        record.pop("disruption", None)
        record |= self._new_attempt(record) | {
            "groupRestarts": done + 1,
            "message": f"restarting the trainer group after: {message}",
        }
        self._event(
            "Warning",
            "TrainerGroupRestarted",
            f"restart {done + 1} of {training.group_restarts}: every rank resumes from the last checkpoint "
            f"after {reason}: {message}",
        )
        self._requeue(1)
        return True

    def _look_for_stuck_pods(self, stage: str, jobs: list[str]) -> None:
        """Why a running stage's Jobs make no progress: a pod the scheduler or the kubelet holds
        back, or pods the Job controller cannot create."""
        for name in jobs:
            job = self.observed.jobs.get(name)
            if job is None:
                continue
            pods = self.observed.pods_of(name)
            problem = first_pod_problem(pods)
            if problem is None and lacks_pods(job, pods):
                problem = job_creation_problem(job, self.observed.job_events)
                if problem is None and job_age_s(job, self.observed.now) < POD_CREATION_WATCH_S:
                    self._requeue(POD_CREATION_GRACE_S)
            if problem:
                self.problems[stage] = problem
                return

    def _stuck_before(self, stage: str) -> str | None:
        """The problem the stage's condition reported before this reconcile, if it was stuck."""
        old = get_condition((self.body.get("status") or {}).get("conditions") or [], STAGE_CONDITIONS[stage])
        normal = set(STAGE_REASONS.values()) | set(WAITING_REASONS.values())
        return old["message"] if old and old.get("reason") not in normal else None

    def _requeue(self, seconds: float) -> None:
        self.plan.requeue_after = min(self.plan.requeue_after or seconds, seconds)

    def _refusal(self, component: str) -> Problem | None:
        """A refused write of a child of this component (a stage, a server); children of no stage or
        server (the workspace PVC) hold up the current stage."""
        known = set(STAGE_CONDITIONS) | set(SERVERS)
        held_up = [(r.component, r.problem()) for r in self.observed.refused] + self.blocked
        for child_component, problem in held_up:
            if child_component == component or (component == self.current and child_component not in known):
                return problem
        return None

    def _server_problem(self, server: str) -> Problem | None:
        deployment = self.observed.deployments.get(server_name(self.dt, server))
        return first_pod_problem(self.observed.server_pods(server)) or deployment_problem(deployment)

    def build(self) -> Plan:
        dt = self.dt
        old_status = self.body.get("status") or {}
        status = copy.deepcopy(old_status)
        stages = stage_plan.stages(dt)
        previous = {s["name"]: s for s in status.get("stages") or []}
        self.records = {
            name: previous.get(name)
            or {"name": name, "state": "Pending", "attempt": 0, "jobs": [], "message": ""}
            for name in stages
        }
        self.failure: tuple[str, str] | None = None
        self.problems: dict[str, Problem] = {}  # running stage -> why it makes no progress
        self.current: str | None = None
        self._start_run(status)
        self._retry_if_spec_changed(status)
        status.setdefault("startTime", self.now)
        status["workspaceClaim"] = workspace_claim(dt)
        if not dt.spec.storage.existing_claim:
            self.plan.create.append(workspace_pvc(self.body, self.dt))

        current: str | None = None
        waiting_for: str | None = None  # the server the current stage waits for
        for stage in stages:
            record = self.records[stage]
            if record["state"] == "Succeeded":
                continue
            current = self.current = stage
            if record["state"] == "Failed":
                self.failure = self.failure or _recorded_failure(status, stage, record)
                break
            server = server_for(dt, stage)
            if server and not self._server_ready(server):
                waiting_for = server
                break
            if not self._advance(stage, status):
                break

        all_done = all(r["state"] == "Succeeded" for r in self.records.values())
        if self.failure:
            phase = "Failed"
        elif all_done:
            phase = "Succeeded"
        elif all(r["state"] == "Pending" for r in self.records.values()):
            phase = "Pending"
        else:
            phase = "Running"
        active = phase in ("Pending", "Running")
        needed = server_for(dt, current) if active else None
        self._sync_server("target", needed == "target")
        if dt.spec.hidden_states.mode == "streaming":
            self._sync_server("stream", needed == "stream")

        status["phase"] = phase
        status["stage"] = current or stages[-1]
        status["observedGeneration"] = self.generation
        status["stages"] = list(self.records.values())
        if phase in ("Succeeded", "Failed"):
            status.setdefault("completionTime", self.now)
        if phase == "Succeeded" and old_status.get("phase") != "Succeeded":
            self._event("Normal", "TrainingSucceeded", f"draft exported to {status['export']['uri']}")
        plan_network_policy(self.plan, self.body, meta.DRAFT_TRAINING_LABEL, self.observed.network_policies)
        self.blocked = [
            (
                (c["metadata"].get("labels") or {}).get("app.kubernetes.io/component", ""),
                foreign_problem(c, self.body),
            )
            for c in withhold_foreign(self.plan, self.observed.foreign)
        ]
        self._conditions(status, phase, current, waiting_for, needed)
        if self.observed.refused:
            self._requeue(REFUSAL_RETRY_S)
        self.plan.status = status
        return self.plan

    def _sync_server(self, server: str, needed: bool) -> None:
        existing = self.observed.deployments.get(server_name(self.dt, server))
        if not needed and existing is None:
            return  # never started, nothing to scale down
        if existing is not None and not needed and (existing["spec"].get("replicas") or 0) > 0:
            title, _, reason = SERVERS[server]
            self._event("Normal", reason, f"no remaining stage needs the {title}")
        replicas = 1 if needed else 0
        deployment = (
            target_deployment(self.body, self.dt, replicas)
            if server == "target"
            else stream_server_deployment(self.body, self.dt, replicas)
        )
        self.plan.sync += [deployment, server_service(self.body, self.dt, server)]

    def _conditions(
        self, status: dict[str, Any], phase: str, current: str | None, waiting: str | None, needed: str | None
    ) -> None:
        conditions = list(status.get("conditions") or [])
        gen, now = self.generation, self.now

        def put(type_: str, ok: bool, reason: str, message: str) -> None:
            set_condition(conditions, type_, ok, reason, message, gen, now)

        def put_problem(type_: str, problem: Problem) -> None:
            """False with the problem's reason; a Warning Event when the reason is new."""
            if (get_condition(conditions, type_) or {}).get("reason") != problem.reason:
                self._event("Warning", problem.reason, problem.message)
            put(type_, False, problem.reason, problem.message)

        servers = ["target"] + (["stream"] if self.dt.spec.hidden_states.mode == "streaming" else [])
        for server in servers:
            title, condition_type, _ = SERVERS[server]
            problem = self._refusal(server) or (self._server_problem(server) if waiting == server else None)
            if problem:
                put_problem(condition_type, problem)
            elif needed != server:
                put(condition_type, False, "ScaledDown", f"no remaining stage needs the {title}")
            elif waiting == server:
                put(condition_type, False, "Starting", f"waiting for the {title} to become ready")
            else:
                put(condition_type, True, "Serving", f"the {title} is ready")
        for stage, record in self.records.items():
            state = record["state"]
            if problem := self._refusal(stage) or self.problems.get(stage):
                put_problem(STAGE_CONDITIONS[stage], problem)
                continue
            reason = STAGE_REASONS[state]
            if state == "Pending" and stage == current and waiting:
                reason = WAITING_REASONS[waiting]
            put(STAGE_CONDITIONS[stage], state == "Succeeded", reason, record.get("message") or state.lower())
        if self.failure:
            # Its observedGeneration is the generation that failed: a later spec edit retries.
            put("Failed", True, self.failure[0], self.failure[1])
        else:
            put("Failed", False, "NoFailure", "no stage has failed")
        put(
            "Ready",
            phase == "Succeeded",
            {"Succeeded": "DraftExported", "Failed": "StageFailed"}.get(phase, phase),
            f"draft at {status['export']['uri']}" if phase == "Succeeded" else f"pipeline {phase.lower()}",
        )
        status["conditions"] = conditions


def _recorded_failure(status: dict[str, Any], stage: str, record: dict[str, Any]) -> tuple[str, str]:
    failed = get_condition(status.get("conditions") or [], "Failed")
    if failed and failed.get("status") == "True":
        return failed.get("reason") or "StageFailed", failed.get("message") or ""
    return "StageFailed", f"stage {stage} failed: {record.get('message', '')}"


def _checkpoint_evaluation(m: dict[str, Any]) -> dict[str, Any]:
    evaluation = {
        "step": int(m["step"]),
        "acceptanceLength": m.get("acceptance_length"),
        "acceptancePerPosition": list(m.get("acceptance_per_position") or []),
        "tokensPerSecond": m.get("tokens_per_second"),
        "speedup": m.get("speedup"),
    }
    return {k: v for k, v in evaluation.items() if v is not None}


def _sweep_result(m: dict[str, Any]) -> dict[str, Any]:
    """status.sweep from `eagle3 sweep`'s result metrics."""
    best = [
        {"concurrency": c, "numSpeculativeTokens": k, "speedup": speedup}
        for c, k, speedup in zip(m["best_concurrency"], m["best_k"], m["best_speedup"], strict=True)
    ]
    return {"schedule": m["schedule"], "numSpeculativeTokens": m["num_speculative_tokens"], "best": best}


def _brief(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in metrics.items() if not isinstance(v, list))[:300]


def plan_training(body: dict[str, Any], observed: TrainingObserved) -> Plan:
    """The whole decision for one DraftTraining; the caller applies it."""
    return TrainingPlanner(body, observed).build()
