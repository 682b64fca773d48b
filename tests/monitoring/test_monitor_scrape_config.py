"""The translation of ServiceMonitors/PodMonitors into Prometheus scrape configs
(tests/support/monitor_scrape_config.py), the one stand-in of the live monitoring test: it replaces
prometheus-operator, whose binary cannot be built here.

Checked three ways: the relabelling of a monitor that uses every translated field, rule by rule,
against prometheus-operator's promcfg.go as read (v0.95); the chart's and the operator's own monitors
give configs that a real Prometheus loads; and on the test bed a real
Prometheus, discovering through the API server with the translated configs, selects exactly the pods
the API server itself selects with the monitor's label selector, and labels them as
prometheus-operator does.
"""

from __future__ import annotations

import time
import urllib.parse
from datetime import UTC, datetime

import pytest
import yaml
from eagle3_operator.reconcile.serving import ServingObserved, ServingPlanner

from tests.chart.helm import by_kind, render
from tests.monitoring.live_prometheus import discovering_prometheus
from tests.monitoring.prometheus import Prometheus
from tests.support.cluster import REPO_ROOT, wait_until
from tests.support.monitor_scrape_config import ApiServerAccess, UnsupportedMonitorField, scrape_configs

ACCESS = ApiServerAccess(host="https://10.0.0.1:6443", token_file="/var/run/token", ca_file="/var/run/ca.crt")
# Prometheus hands discovered targets to its scrape manager every 5 s.
DISCOVERY_SETTLE_S = 6
POD_SELECTOR = {
    "matchLabels": {"app.kubernetes.io/name": "vllm"},
    "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["serve", "canary"]},
        {"key": "eagle3.ai/paused", "operator": "NotIn", "values": ["true"]},
        {"key": "eagle3.ai/spec-decode-deployment", "operator": "Exists"},
        {"key": "legacy", "operator": "DoesNotExist"},
    ],
}


def pod_monitor(namespace_selector: dict | None = None, **endpoint: object) -> dict:
    spec = {
        "selector": POD_SELECTOR,
        "jobLabel": "app.kubernetes.io/name",
        "podTargetLabels": ["tier"],
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s", **endpoint}],
    }
    if namespace_selector is not None:
        spec["namespaceSelector"] = namespace_selector
    return {"kind": "PodMonitor", "metadata": {"name": "vllm", "namespace": "monitoring"}, "spec": spec}


def test_pod_monitor_relabelling_follows_prometheus_operator():
    monitor = pod_monitor(
        {"matchNames": ["team-a", "team-b"]},
        honorLabels=True,
        relabelings=[
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "Replace"}
        ],
        metricRelabelings=[{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "Drop"}],
    )
    (config,) = scrape_configs(monitor, ACCESS)
    assert config["job_name"] == "podMonitor/monitoring/vllm/0"
    assert config["honor_labels"] is True
    assert config["kubernetes_sd_configs"] == [
        {
            "role": "pod",
            "namespaces": {"names": ["team-a", "team-b"]},
            "api_server": "https://10.0.0.1:6443",
            "authorization": {"type": "Bearer", "credentials_file": "/var/run/token"},
            "tls_config": {"ca_file": "/var/run/ca.crt"},
        }
    ]
    assert (config["scrape_interval"], config["metrics_path"]) == ("15s", "/metrics")
    label, present = "__meta_kubernetes_pod_label_", "__meta_kubernetes_pod_labelpresent_"
    assert config["relabel_configs"] == [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {
            "action": "keep",
            "source_labels": [f"{label}app_kubernetes_io_name", f"{present}app_kubernetes_io_name"],
            "regex": "(vllm);true",
        },
        {
            "action": "keep",
            "source_labels": [f"{label}tier", f"{present}tier"],
            "regex": "(serve|canary);true",
        },
        {
            "action": "drop",
            "source_labels": [f"{label}eagle3_ai_paused", f"{present}eagle3_ai_paused"],
            "regex": "(true);true",
        },
        {"action": "keep", "source_labels": [f"{present}eagle3_ai_spec_decode_deployment"], "regex": "true"},
        {"action": "drop", "source_labels": [f"{present}legacy"], "regex": "true"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": [f"{label}tier"], "target_label": "tier", "regex": "(.+)", "replacement": "${1}"},
        {"target_label": "job", "replacement": "monitoring/vllm"},
        {
            "source_labels": [f"{label}app_kubernetes_io_name"],
            "target_label": "job",
            "regex": "(.+)",
            "replacement": "${1}",
        },
        {"target_label": "endpoint", "replacement": "http"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node", "action": "replace"},
    ]
    assert config["metric_relabel_configs"] == [
        {"source_labels": ["__name__"], "regex": "go_.*", "action": "drop"}
    ]


def test_service_monitor_relabelling_follows_prometheus_operator():
    monitor = {
        "kind": "ServiceMonitor",
        "metadata": {"name": "op", "namespace": "system"},
        "spec": {
            "selector": {"matchLabels": {"app": "op"}},
            "targetLabels": ["team"],
            "endpoints": [{"port": "metrics", "filterRunning": False}],
        },
    }
    (config,) = scrape_configs(monitor)
    assert config["kubernetes_sd_configs"] == [{"role": "endpoints", "namespaces": {"names": ["system"]}}]
    target = [
        "__meta_kubernetes_endpoint_address_target_kind",
        "__meta_kubernetes_endpoint_address_target_name",
    ]
    assert config["relabel_configs"] == [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_app",
                "__meta_kubernetes_service_labelpresent_app",
            ],
            "regex": "(op);true",
        },
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": "metrics"},
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Pod;(.*)",
            "replacement": "${1}",
            "target_label": "pod",
        },
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {
            "source_labels": ["__meta_kubernetes_service_label_team"],
            "target_label": "team",
            "regex": "(.+)",
            "replacement": "${1}",
        },
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
        {"target_label": "endpoint", "replacement": "metrics"},
    ]

    monitor["spec"]["serviceDiscoveryRole"] = "EndpointSlice"
    (config,) = scrape_configs(monitor)
    assert config["kubernetes_sd_configs"][0]["role"] == "endpointslice"
    port_rule = config["relabel_configs"][2]
    assert port_rule["source_labels"] == ["__meta_kubernetes_endpointslice_port_name"]
    assert (
        config["relabel_configs"][3]["source_labels"][0]
        == "__meta_kubernetes_endpointslice_address_target_kind"
    )


def test_namespace_selector_any_watches_every_namespace_and_none_the_monitors_own():
    (any_namespace,) = scrape_configs(pod_monitor({"any": True}))
    assert "namespaces" not in any_namespace["kubernetes_sd_configs"][0]
    (own,) = scrape_configs(pod_monitor())
    assert own["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["monitoring"]}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tlsConfig": {"insecureSkipVerify": True}}, "tlsConfig"),
        ({"authorization": {"type": "Bearer"}}, "authorization"),
    ],
)
def test_fields_it_does_not_translate_are_refused_by_name(change, field):
    with pytest.raises(UnsupportedMonitorField, match=field):
        scrape_configs(pod_monitor(**change))
    role_selector = pod_monitor()
    role_selector["spec"]["selectorMechanism"] = "RoleSelector"
    with pytest.raises(UnsupportedMonitorField, match="selectorMechanism"):
        scrape_configs(role_selector)


def test_chart_and_operator_monitors_give_configs_prometheus_loads(tmp_path):
    values = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    monitors = [
        *by_kind(render(tmp_path, values), "ServiceMonitor"),
        *by_kind(render(tmp_path, values, {"watchNamespaces": ["team-a"]}), "PodMonitor"),
        *by_kind(render(tmp_path, values), "PodMonitor"),  # every namespace
    ]
    body = yaml.safe_load((REPO_ROOT / "examples" / "specdecodedeployment-hub-draft.yaml").read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "0000", "generation": 1}
    body["spec"]["monitoring"] = {"serviceMonitor": True, "podMonitor": True}
    observed = ServingObserved(now=datetime.now(UTC), monitor_kinds={"ServiceMonitor", "PodMonitor"})
    monitors += ServingPlanner(body, observed).monitors()
    assert sorted(m["kind"] for m in monitors) == ["PodMonitor"] * 3 + ["ServiceMonitor"] * 2

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("t")
    ca.write_text("")
    # An address nothing answers: discovery fails (and says so in the log), the config still loads.
    access = ApiServerAccess(host="https://127.0.0.1:9", token_file=str(token), ca_file=str(ca))
    configs = [config for monitor in monitors for config in scrape_configs(monitor, access)]
    for index, config in enumerate(configs):
        config["job_name"] += f"-{index}"  # the chart's PodMonitor is rendered twice, under one name
    (tmp_path / "prometheus").mkdir()
    with Prometheus(tmp_path / "prometheus", configs, {"groups": []}) as prom:
        loaded = yaml.safe_load(prom.api("status/config")["yaml"])
    assert [c["job_name"] for c in loaded["scrape_configs"]] == [c["job_name"] for c in configs]
    for config, ours in zip(loaded["scrape_configs"], configs, strict=True):
        assert len(config["relabel_configs"]) == len(ours["relabel_configs"]), config["job_name"]


def test_prometheus_selects_what_the_api_server_selects(cluster, namespace, tmp_path):
    """kwok's pods (addresses that answer nothing: targets are discovered, not scraped) in this
    namespace and another; the monitor's selector evaluated by the API server is the oracle."""
    other = cluster.create_namespace()
    try:
        variants = {
            "match": {
                "app.kubernetes.io/name": "vllm",
                "tier": "serve",
                "eagle3.ai/spec-decode-deployment": "a",
            },
            "canary": {
                "app.kubernetes.io/name": "vllm",
                "tier": "canary",
                "eagle3.ai/spec-decode-deployment": "b",
            },
            "paused": {
                "app.kubernetes.io/name": "vllm",
                "tier": "serve",
                "eagle3.ai/spec-decode-deployment": "c",
                "eagle3.ai/paused": "true",
            },
            "legacy": {
                "app.kubernetes.io/name": "vllm",
                "tier": "serve",
                "eagle3.ai/spec-decode-deployment": "d",
                "legacy": "yes",
            },
            "no-sdd": {"app.kubernetes.io/name": "vllm", "tier": "serve"},
            "other-app": {
                "app.kubernetes.io/name": "web",
                "tier": "serve",
                "eagle3.ai/spec-decode-deployment": "e",
            },
        }
        for ns in (namespace, other):
            for name, labels in variants.items():
                container = {
                    "name": "server",
                    "image": "vllm",
                    "ports": [{"name": "http", "containerPort": 8000}],
                }
                manifest = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "labels": labels},
                    "spec": {"containers": [container, {"name": "sidecar", "image": "sidecar"}]},
                }
                cluster.apply(manifest, namespace=ns)
        monitor = pod_monitor({"matchNames": [namespace]})
        monitor["metadata"]["namespace"] = namespace
        selector = ",".join(
            [f"{k}={v}" for k, v in POD_SELECTOR["matchLabels"].items()]
            + [
                "tier in (serve,canary)",
                "eagle3.ai/paused notin (true)",
                "eagle3.ai/spec-decode-deployment",
                "!legacy",
            ]
        )
        query = urllib.parse.urlencode({"labelSelector": selector})
        pods = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods?{query}")["items"]
        expected = {p["metadata"]["name"] for p in pods}
        assert expected == {"match", "canary"}

        def ip_of_all() -> dict[str, str] | None:
            items = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            ips = {p["metadata"]["name"]: p["status"].get("podIP") for p in items}
            return ips if all(ips.values()) and len(ips) == len(variants) else None

        ips = wait_until(ip_of_all, timeout=60, interval=1, what="kwok to give the pods addresses")
        with discovering_prometheus(
            cluster, tmp_path / "prometheus", [monitor], {"groups": []}, namespace
        ) as prom:
            wait_until(lambda: len(prom.targets()) >= len(expected), timeout=30, interval=1, what="targets")
            time.sleep(DISCOVERY_SETTLE_S)  # any target wrongly kept would have arrived by now
            targets = prom.targets()
        assert {t["labels"]["pod"]: t["labels"] for t in targets} == {
            name: {
                "container": "server",
                "endpoint": "http",
                "instance": f"{ips[name]}:8000",
                "job": "vllm",  # the jobLabel's value
                "namespace": namespace,
                "pod": name,
                "tier": variants[name]["tier"],  # podTargetLabels
            }
            for name in expected
        }
    finally:
        cluster.delete_namespace(other)
