"""The API server refuses a canary it cannot run, with a message that says why, and defaults the rest."""

from __future__ import annotations

import pytest

from tests.operator import fakes
from tests.operator.harness import spec_decode_path
from tests.support.cluster import ApiError, LocalCluster


def _canary(name: str, sdd_replicas: int | None, **canary) -> dict:
    body = fakes.spec_decode(rollout={"strategy": "Canary", "canary": canary})
    body["metadata"] = {"name": name}
    if sdd_replicas is not None:
        body["spec"]["replicas"] = sdd_replicas
    return body


@pytest.mark.parametrize(
    "body,expected",
    [
        pytest.param(
            _canary("one", None),
            "rollout.strategy Canary needs replicas above rollout.canary.replicas",
            id="default-replicas",
        ),
        pytest.param(
            _canary("all", 2, replicas=2), "rollout.strategy Canary needs replicas above", id="no-stable"
        ),
        pytest.param(
            _canary("short", 3, analysisSeconds=5), "spec.rollout.canary.analysisSeconds", id="window"
        ),
        pytest.param(
            _canary("gate", 3, gates={"maxLatencyRatio": 0.5}),
            "spec.rollout.canary.gates.maxLatencyRatio",
            id="latency-gate",
        ),
        pytest.param(_canary("promo", 3, promotion="Later"), "spec.rollout.canary.promotion", id="promotion"),
        pytest.param(
            _canary("strategy", 3) | {"spec": fakes.spec_decode(rollout={"strategy": "BlueGreen"})["spec"]},
            "spec.rollout.strategy",
            id="strategy",
        ),
    ],
)
def test_api_server_refuses_a_canary_it_cannot_run(
    crds: LocalCluster, namespace: str, body: dict, expected: str
):
    with pytest.raises(ApiError) as refused:
        crds.request("POST", spec_decode_path(namespace), body)
    assert refused.value.status == 422, refused.value
    assert expected in str(refused.value), f"refusal does not say {expected!r}: {refused.value}"


def test_a_canary_gets_its_defaults(crds: LocalCluster, namespace: str):
    created = crds.request("POST", spec_decode_path(namespace), _canary("ok", 3))
    assert created["spec"]["rollout"]["canary"] == {
        "replicas": 1,
        "analysisSeconds": 300,
        "minDrafts": 200,
        "gates": {"minAcceptanceRatio": 0.9, "maxLatencyRatio": 1.25, "maxErrorRate": 0.01},
        "promotion": "Auto",
    }
    plain = fakes.spec_decode()
    plain["metadata"] = {"name": "plain"}
    assert (
        crds.request("POST", spec_decode_path(namespace), plain)["spec"]["rollout"]["strategy"]
        == "RollingUpdate"
    )
