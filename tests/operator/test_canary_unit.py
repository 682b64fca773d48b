"""The canary rollout without a cluster: its statistical rule, and the tracks the planner makes."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest
from eagle3_operator.reconcile.canary import (
    TrackSample,
    acceptance_length,
    analyse,
    ratio_with_bounds,
    wilson_lower_bound,
)
from eagle3_operator.reconcile.live_acceptance import History, PodCounters, PodRead, parse_metrics
from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from eagle3_api.spec_decode_deployment import CanarySpec
from tests.operator import fakes

GOOD, BAD, NEXT = "pvc://drafts/good", "pvc://drafts/bad", "pvc://drafts/next"


def _counters(
    drafts: int, per_position: tuple[float, ...], itl: float = 0.02, requests: int = 50, errors: int = 0
):
    return PodCounters(
        drafts=drafts,
        accepted=sum(per_position),
        generated=drafts * 2,
        accepted_per_position=per_position,
        itl_sum=itl * drafts,
        itl_count=drafts,
        requests=requests,
        errors=errors,
    )


def _sample(counters: PodCounters, seconds: float = 300) -> TrackSample:
    return TrackSample("r", 1, seconds, counters)


def test_acceptance_length_and_its_standard_error_match_the_per_draft_distribution():
    rng = random.Random(0)
    # Nested acceptance: position i is accepted only after every earlier one.
    counts = [next((i for i in range(3) if rng.random() > 0.7), 3) for _ in range(20_000)]
    per_position = tuple(float(sum(c > i for c in counts)) for i in range(3))
    mean, se = acceptance_length(PodCounters(len(counts), sum(counts), 0, per_position))
    expected_mean = 1 + sum(counts) / len(counts)
    variance = sum((c + 1 - expected_mean) ** 2 for c in counts) / len(counts)
    assert mean == pytest.approx(expected_mean)
    assert se == pytest.approx((variance / len(counts)) ** 0.5, rel=1e-6)


def test_bounds_narrow_with_more_drafts_and_wilson_bounds_the_error_rate():
    few = ratio_with_bounds(_counters(50, (25, 10)), _counters(50, (30, 15)))
    many = ratio_with_bounds(_counters(5000, (2500, 1000)), _counters(5000, (3000, 1500)))
    assert few[0] == pytest.approx(many[0])
    assert few[1] < many[1] < many[0] < many[2] < few[2]
    assert wilson_lower_bound(0, 100) == 0.0
    assert 0.05 < wilson_lower_bound(10, 100) < 0.1
    assert wilson_lower_bound(0, 0) == 0.0


def test_analyse_waits_for_drafts_rolls_back_early_and_promotes_after_a_full_window():
    spec = CanarySpec(analysis_seconds=300, min_drafts=200)
    stable = _sample(_counters(1000, (600, 300)))
    few = analyse(_sample(_counters(100, (60, 30))), stable, spec)
    assert (few.decision, few.reason) == ("Wait", "NotEnoughData")
    assert few.message == "100 canary and 1000 stable drafts; deciding after 200 each"
    assert analyse(None, stable, spec).decision == "Wait"

    # A draft the target never agrees with, 60 s in: confidently below the gate, decided at once.
    bad = analyse(_sample(_counters(400, (0, 0)), seconds=60), stable, spec)
    assert (bad.decision, bad.reason) == ("Fail", "AcceptanceBelowGate")
    assert bad.message.startswith("acceptance length canary 1.000 / stable 1.900 = 0.526 (95% bounds ")
    assert "over 60 s, 400/1000 drafts" in bad.message

    # As good as stable: not decided before the window is full, promoted after.
    same = _counters(1000, (590, 310))
    assert analyse(_sample(same, seconds=100), stable, spec).reason == "Analyzing"
    assert analyse(_sample(same), stable, spec).decision == "Pass"

    # Slightly worse on the point estimate but within noise: judged on the estimate at the window's end.
    slightly = _counters(300, (140, 60))  # 1.667 / 1.9 = 0.877 < 0.9
    assert analyse(_sample(slightly, seconds=100), stable, spec).decision == "Wait"
    assert analyse(_sample(slightly), stable, spec).reason == "AcceptanceBelowGate"

    slow = analyse(_sample(_counters(1000, (600, 300), itl=0.03)), stable, spec)
    assert (slow.decision, slow.reason) == ("Fail", "LatencyAboveGate")
    assert "inter-token latency 30.0/20.0 ms = 1.500 (gate <= 1.25)" in slow.message
    failing = analyse(_sample(_counters(1000, (600, 300), requests=100, errors=20), seconds=30), stable, spec)
    assert (failing.decision, failing.reason) == ("Fail", "ErrorRateAboveGate")


def test_parse_metrics_reads_latency_and_api_responses():
    text = """# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1.5
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 60.0
# TYPE http_requests_total counter
http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 40.0
http_requests_total{handler="/v1/completions",method="POST",status="5xx"} 2.0
http_requests_total{handler="/v1/models",method="GET",status="2xx"} 3.0
http_requests_total{handler="/tokenize",method="POST",status="5xx"} 9.0
"""
    counters = parse_metrics(text)
    assert (counters.itl_sum, counters.itl_count, counters.requests, counters.errors) == (
        1.5,
        60.0,
        45.0,
        2.0,
    )


# ---- the tracks, through the serving planner ------------------------------------------------------


def _body(draft: str = GOOD, **canary) -> dict:
    return fakes.spec_decode(
        replicas=3,
        draft={"model": draft},
        rollout={
            "strategy": "Canary",
            "canary": {"replicas": 1, "analysisSeconds": 300, "minDrafts": 200} | canary,
        },
    )


def _tracks(plan) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in plan.sync if o["kind"] == "Deployment"}


def _draft_of(deployment: dict) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return json.loads(args[args.index("--speculative-config") + 1])["model"]


def _revision(deployment: dict) -> str:
    return deployment["spec"]["template"]["metadata"]["annotations"]["eagle3.ai/revision"]


def _condition(status: dict, type_: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


class Cluster:
    """What the planner would observe after its writes: Deployments settled, counters read."""

    def __init__(self, body: dict):
        self.body, self.deployments, self.history, self.seconds = body, {}, History(), 0
        self.pods: list[dict] = []

    def reconcile(self):
        observed = ServingObserved(
            now=fakes.NOW + timedelta(seconds=self.seconds),
            deployment=self.deployments.get("chat"),
            canary_deployment=self.deployments.get("chat-canary"),
            counters=self.history,
            pods=self.pods,
        )
        plan = plan_serving(self.body, observed)
        for name, deployment in _tracks(plan).items():
            self.deployments[name] = fakes.ready_deployment(deployment)
        for gone in plan.delete:
            self.deployments.pop(gone["name"], None)
        self.body["status"] = plan.status
        return plan

    def serve(self, seconds: int, per_track: dict[str, PodCounters]) -> None:
        """Each track's pod reads zero now and `per_track` `seconds` later."""
        for name, counters in per_track.items():
            revision = _revision(self.deployments[name])
            for at, value in ((self.seconds, PodCounters()), (self.seconds + seconds, counters)):
                self.history.add(
                    f"{name}-{revision}", PodRead(fakes.NOW + timedelta(seconds=at), revision, None, value)
                )
        self.seconds += seconds


def test_a_bad_draft_is_rolled_back_and_not_retried_until_spec_draft_changes():
    cluster = Cluster(_body())
    first = cluster.reconcile()
    assert list(_tracks(first)) == ["chat"], "the first draft is rolled out as is"
    assert "canary" not in first.status
    cluster.reconcile()  # available

    cluster.body["spec"]["draft"]["model"] = BAD
    started = cluster.reconcile()
    tracks = _tracks(started)
    assert {n: (d["spec"]["replicas"], _draft_of(d)) for n, d in tracks.items()} == {
        "chat": (2, "/models/draft/good"),
        "chat-canary": (1, "/models/draft/bad"),
    }, "the canary takes one of the three pods"
    canary_pod = tracks["chat-canary"]["spec"]["template"]["metadata"]["labels"]
    assert canary_pod["eagle3.ai/track"] == "canary"
    assert tracks["chat-canary"]["spec"]["selector"]["matchLabels"]["eagle3.ai/track"] == "canary"
    assert started.status["resolvedDraft"]["uri"] == GOOD
    assert started.status["canary"]["phase"] == "Analyzing"
    assert started.status["canary"]["revision"] == _revision(tracks["chat-canary"])
    assert _condition(started.status, "CanaryProgressing") == ("True", "Analyzing")
    assert [e.reason for e in started.events] == ["DraftResolved", "CanaryStarted"]

    cluster.serve(60, {"chat": _counters(1000, (600, 300)), "chat-canary": _counters(400, (4, 0))})
    rolled_back = cluster.reconcile()
    tracks = _tracks(rolled_back)
    assert {n: (d["spec"]["replicas"], _draft_of(d)) for n, d in tracks.items()} == {
        "chat": (3, "/models/draft/good"),
        "chat-canary": (0, "/models/draft/bad"),
    }
    (rejected,) = rolled_back.status["rejectedDrafts"]
    assert (rejected["uri"], rejected["phase"], rejected["reason"]) == (BAD, "Canary", "AcceptanceBelowGate")
    assert rejected["message"].startswith("acceptance length canary 1.010 / stable 1.900 = 0.532")
    assert _condition(rolled_back.status, "RolledBack") == ("True", "AcceptanceBelowGate")
    assert _condition(rolled_back.status, "CanaryProgressing") == ("False", "RolledBack")
    assert [(e.type, e.reason) for e in rolled_back.events] == [("Warning", "CanaryRolledBack")]
    canary = rolled_back.status["canary"]
    assert (canary["canary"]["drafts"], canary["stable"]["meanAcceptanceLength"]) == (400, 1.9)

    again = cluster.reconcile()
    assert again.events == [] and len(again.status["rejectedDrafts"]) == 1, "not retried"
    assert _tracks(again)["chat-canary"]["spec"]["replicas"] == 0

    cluster.body["spec"]["draft"]["acceptanceLength"] = 2.0  # spec.draft changes: tried again
    retried = cluster.reconcile()
    assert retried.status["canary"]["phase"] == "Analyzing"
    assert _tracks(retried)["chat-canary"]["spec"]["replicas"] == 1


def test_a_good_draft_is_promoted_after_a_full_window_and_the_canary_goes():
    cluster = Cluster(_body())
    cluster.reconcile(), cluster.reconcile()
    cluster.body["spec"]["draft"]["model"] = NEXT
    cluster.reconcile()
    cluster.serve(100, {"chat": _counters(1000, (600, 300)), "chat-canary": _counters(500, (310, 160))})
    waiting = cluster.reconcile()
    assert waiting.status["canary"]["reason"] == "Analyzing" and waiting.events == []
    assert waiting.requeue_after == 30

    cluster.serve(200, {"chat": _counters(1000, (600, 300)), "chat-canary": _counters(500, (310, 160))})
    promoting = cluster.reconcile()
    assert promoting.status["canary"]["phase"] == "Promoting"
    tracks = _tracks(promoting)
    assert {n: (d["spec"]["replicas"], _draft_of(d)) for n, d in tracks.items()} == {
        "chat": (2, "/models/draft/next"),
        "chat-canary": (1, "/models/draft/next"),
    }, "the stable track moves to the draft while the canary keeps serving it"
    assert promoting.status["resolvedDraft"]["uri"] == NEXT
    assert [e.reason for e in promoting.events] == ["CanaryPromoting"]

    promoted = cluster.reconcile()  # the stable Deployment has rolled (Cluster settles it)
    assert list(_tracks(promoted)) == ["chat"] and _tracks(promoted)["chat"]["spec"]["replicas"] == 3
    assert promoted.delete == [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-canary"}]
    assert promoted.status["canary"]["phase"] == "Promoted"
    assert _condition(promoted.status, "Promoted") == ("True", "GatesPassed")
    assert _condition(promoted.status, "CanaryProgressing") == ("False", "Promoted")
    assert [e.reason for e in promoted.events] == ["CanaryPromoted"]
    assert cluster.reconcile().events == [], "nothing more to do"


def test_manual_promotion_waits_for_the_annotation_naming_the_canary():
    cluster = Cluster(_body(promotion="Manual"))
    cluster.reconcile(), cluster.reconcile()
    cluster.body["spec"]["draft"]["model"] = NEXT
    cluster.reconcile()
    cluster.serve(300, {"chat": _counters(1000, (600, 300)), "chat-canary": _counters(500, (310, 160))})
    waiting = cluster.reconcile()
    revision = waiting.status["canary"]["revision"]
    assert (waiting.status["canary"]["phase"], waiting.status["canary"]["reason"]) == (
        "Analyzing",
        "AwaitingPromotion",
    )
    assert f"eagle3.ai/promote-canary={revision}" in waiting.status["canary"]["message"]
    assert [e.reason for e in waiting.events] == ["CanaryAwaitingPromotion"]
    assert cluster.reconcile().events == [], "announced once"
    cluster.body["metadata"]["annotations"] = {"eagle3.ai/promote-canary": revision}
    assert cluster.reconcile().status["canary"]["phase"] == "Promoting"


def test_reverting_spec_draft_cancels_the_canary_and_rolling_update_has_no_canary():
    cluster = Cluster(_body())
    cluster.reconcile(), cluster.reconcile()
    cluster.body["spec"]["draft"]["model"] = NEXT
    cluster.reconcile()
    cluster.body["spec"]["draft"]["model"] = GOOD
    canceled = cluster.reconcile()
    assert "canary" not in canceled.status and list(_tracks(canceled)) == ["chat"]
    assert canceled.delete[0]["name"] == "chat-canary"
    assert _condition(canceled.status, "CanaryProgressing") == ("False", "Canceled")

    plain = Cluster(fakes.spec_decode(replicas=3, draft={"model": GOOD}))
    plain.reconcile()
    plain.body["spec"]["draft"]["model"] = NEXT
    rolled = plain.reconcile()
    assert {n: _draft_of(d) for n, d in _tracks(rolled).items()} == {"chat": "/models/draft/next"}


def _pod(deployment: dict, waiting: str | None, message: str = "") -> dict:
    """A pod of the Deployment's template; `waiting`: its vLLM container's waiting reason (None: running)."""
    template = deployment["spec"]["template"]["metadata"]
    state = {"waiting": {"reason": waiting, "message": message}} if waiting else {"running": {}}
    container = {"name": "vllm", "ready": False, "restartCount": 3 if waiting else 0, "state": state}
    if waiting == "CrashLoopBackOff":
        container["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
    return {
        "metadata": {"name": deployment["metadata"]["name"] + "-x1", "labels": template["labels"]},
        "status": {"phase": "Running", "containerStatuses": [container]},
    }


@pytest.mark.parametrize("failure", ["CrashLoopBackOff", "ProgressDeadlineExceeded"])
def test_a_canary_that_cannot_start_is_rolled_back_without_waiting_for_data(failure: str):
    cluster = Cluster(_body())
    cluster.reconcile()
    cluster.reconcile()
    cluster.body["spec"]["draft"]["model"] = BAD
    cluster.reconcile()
    canary = cluster.deployments["chat-canary"]

    cluster.pods = [_pod(canary, None), _pod(cluster.deployments["chat"], None)]
    starting = cluster.reconcile()
    assert starting.status["canary"]["phase"] == "Analyzing", "a pod still starting is waited for"
    assert starting.status["canary"]["reason"] == "NotEnoughData"

    if failure == "CrashLoopBackOff":
        cluster.pods = [
            _pod(canary, failure, "ValueError: draft hidden size 64 does not match the target's 128")
        ]
        expected = "ValueError: draft hidden size 64"
    else:
        cluster.deployments["chat-canary"]["status"]["conditions"] = [
            {
                "type": "Progressing",
                "status": "False",
                "reason": failure,
                "message": 'ReplicaSet "chat-canary-1" has timed out progressing.',
            }
        ]
        expected = "has timed out progressing"
    rolled_back = cluster.reconcile()
    assert {n: d["spec"]["replicas"] for n, d in _tracks(rolled_back).items()} == {
        "chat": 3,
        "chat-canary": 0,
    }
    (rejected,) = rolled_back.status["rejectedDrafts"]
    assert (rejected["uri"], rejected["reason"]) == (BAD, "CanaryFailedToStart")
    assert expected in rejected["message"]
    assert _condition(rolled_back.status, "RolledBack") == ("True", "CanaryFailedToStart")
    assert ("Warning", "CanaryRolledBack") in [(e.type, e.reason) for e in rolled_back.events]
