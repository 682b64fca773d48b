"""The test bed serves the Prometheus Operator's real monitoring schemas (tests/support/prometheus_operator.py).

So the API server refuses or prunes what a real cluster would: a misspelt field, a wrong type, a
duration Prometheus cannot parse. And every field of the operator's own ServiceMonitor/PodMonitor and
of the chart's monitors and PrometheusRule comes back as sent: a field the Prometheus Operator does
not know would come back missing (pruned), and the monitor would silently scrape differently.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from eagle3_operator.apply import contains
from eagle3_operator.reconcile.serving import ServingObserved, ServingPlanner

from tests.chart.helm import render
from tests.support.cluster import REPO_ROOT, ApiError
from tests.support.prometheus_operator import GROUP, MONITORING_KINDS, prometheus_operator_crds

# A British spelling of `relabelings`: easy to write, and a monitor that silently loses it scrapes
# without the labels the rules group by.
MISSPELT = {"relabellings": [{"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"}]}


def _path(namespace: str, kind: str, name: str = "") -> str:
    return f"/apis/{GROUP}/v1/namespaces/{namespace}/{MONITORING_KINDS[kind]}" + (f"/{name}" if name else "")


def _service_monitor(name: str, **endpoint: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "endpoints": [{"port": "http", **endpoint}]},
    }


def _create_and_read_back(cluster, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    # Only name, labels and spec: an ownerReference to an owner that does not exist here would let
    # the garbage collector delete the object while the test reads it.
    sent = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"name": obj["metadata"]["name"], "labels": obj["metadata"].get("labels", {})},
        "spec": obj["spec"],
    }
    cluster.request("POST", _path(namespace, obj["kind"]), sent)
    return cluster.request("GET", _path(namespace, obj["kind"], obj["metadata"]["name"]))


def test_the_api_server_refuses_or_prunes_what_the_real_service_monitor_schema_does_not_allow(
    cluster, namespace
):
    with prometheus_operator_crds(cluster, kinds=["ServiceMonitor"]):
        path = _path(namespace, "ServiceMonitor")
        # Strict field validation (what kubectl asks for by default) refuses an unknown field ...
        with pytest.raises(ApiError) as refused:
            cluster.request(
                "POST", path + "?fieldValidation=Strict", _service_monitor("misspelt", **MISSPELT)
            )
        assert refused.value.status == 400, refused.value
        assert 'unknown field "spec.endpoints[0].relabellings"' in str(refused.value)
        # ... and without it the API server prunes the field: a schema-less CRD would have kept it.
        cluster.request("POST", path, _service_monitor("pruned", **MISSPELT))
        assert cluster.request("GET", f"{path}/pruned")["spec"]["endpoints"] == [{"port": "http"}]

        invalid = {
            "a number for a duration": (
                {"interval": 30},
                "spec.endpoints[0].interval",
                "must be of type string",
            ),
            "an unparsable duration": (
                {"scrapeTimeout": "10 seconds"},
                "spec.endpoints[0].scrapeTimeout",
                "should match",
            ),
            "a scheme Prometheus lacks": (
                {"scheme": "ftp"},
                "spec.endpoints[0].scheme",
                'Unsupported value: "ftp"',
            ),
        }
        for what, (endpoint, field, message) in invalid.items():
            with pytest.raises(ApiError) as refused:
                cluster.request("POST", path, _service_monitor("invalid", **endpoint))
            assert refused.value.status == 422, f"{what}: {refused.value}"
            assert field in str(refused.value) and message in str(refused.value), f"{what}: {refused.value}"
        without_endpoints = _service_monitor("no-endpoints")
        del without_endpoints["spec"]["endpoints"]
        with pytest.raises(ApiError, match=r"spec\.endpoints: Required value"):
            cluster.request("POST", path, without_endpoints)


def _operator_monitors() -> list[dict[str, Any]]:
    """The ServiceMonitor and PodMonitor the operator makes for a SpecDecodeDeployment with every option."""
    body = yaml.safe_load((REPO_ROOT / "examples" / "specdecodedeployment-hub-draft.yaml").read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "0000", "generation": 1}
    body["spec"]["monitoring"] = {
        "serviceMonitor": True,
        "podMonitor": True,
        "interval": "10s",
        "additionalLabels": {"release": "kube-prometheus-stack"},
    }
    observed = ServingObserved(now=datetime.now(UTC), monitor_kinds={"ServiceMonitor", "PodMonitor"})
    return ServingPlanner(body, observed).monitors()


def _chart_monitors(tmp_path) -> list[dict[str, Any]]:
    """The chart's ServiceMonitor, PodMonitor (all namespaces, then watched ones) and PrometheusRule."""
    enabled = {
        "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "prometheusRule": {"enabled": True},
    }
    everywhere = render(tmp_path, enabled)
    watched = render(
        tmp_path, enabled, {"watchNamespaces": ["team-a"]}, show_only="templates/podmonitor.yaml"
    )
    for monitor in watched:
        monitor["metadata"]["name"] += "-watched"
    return [obj for obj in everywhere + watched if obj["kind"] in MONITORING_KINDS]


def test_the_operators_and_the_charts_monitors_are_stored_as_sent(cluster, namespace, tmp_path):
    monitors = _operator_monitors() + _chart_monitors(tmp_path)
    assert sorted(m["kind"] for m in monitors) == sorted(
        ["ServiceMonitor", "PodMonitor", "ServiceMonitor", "PodMonitor", "PodMonitor", "PrometheusRule"]
    )
    with prometheus_operator_crds(cluster):
        for monitor in monitors:
            stored = _create_and_read_back(cluster, namespace, monitor)
            what = f"{monitor['kind']} {monitor['metadata']['name']}"
            # The schema adds defaults (a relabeling's `action: replace`); every field we sent stays
            # as sent. The operator's apply_children uses the same test, so it does not re-apply them.
            assert contains(stored["spec"], monitor["spec"]), (
                f"{what}: a field came back missing (pruned) or changed:\n"
                f"sent   {monitor['spec']}\nstored {stored['spec']}"
            )
            assert stored["metadata"]["labels"] == monitor["metadata"].get("labels", {}), what
