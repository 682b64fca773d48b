"""Prometheus scrape configs from ServiceMonitor / PodMonitor objects, as prometheus-operator makes them.

The test bed cannot run prometheus-operator (the Go module proxy refuses its root module, so its
binary cannot be built here), so this module stands in for the one part of it the monitoring tests
need: the translation of a monitor into a `scrape_configs` entry that a real Prometheus then runs
against the test bed's API server. It follows prometheus-operator's `pkg/prometheus/promcfg.go`
(generateServiceMonitorConfig / generatePodMonitorConfig, v0.95) for a Prometheus resource with its
defaults: one shard, no scrape classes, no enforced namespace label, no overrides, the `Endpoints`
discovery role unless the monitor asks for `EndpointSlice`. The resulting relabelling, in order:
  1. `job` kept as `__tmp_prometheus_job_name`; (pods) targets of Failed/Succeeded pods dropped;
  2. one keep/drop rule per selector term (matchLabels, and In/NotIn/Exists/DoesNotExist), on the
     Service's labels (ServiceMonitor) or the Pod's labels (PodMonitor);
  3. keep only the endpoint's port (by name, or by number for a PodMonitor's portNumber);
  4. the standard target labels: `namespace`, `pod`, `container`, and for a ServiceMonitor `node`
     or `pod` from the endpoint's target, `service`; then targetLabels/podTargetLabels, `job`
     (the Service's name, or `<namespace>/<name>` of the PodMonitor, or the jobLabel's value) and
     `endpoint` (the port name);
  5. the monitor's own `relabelings`; its `metricRelabelings` become `metric_relabel_configs`.
Left out: the sharding rules (with one shard they keep every target; their `$(SHARD)` is filled in
by prometheus-operator's config reloader, not by Prometheus). Fields this module does not translate
(TLS, authentication, proxies, limits, scrape classes, role selectors, ...) raise
UnsupportedMonitorField rather than being ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KINDS = ("ServiceMonitor", "PodMonitor")

# What each endpoint may set (besides relabelings) and the scrape-config key it becomes.
_ENDPOINT_SCRAPE_KEYS = {
    "interval": "scrape_interval",
    "scrapeTimeout": "scrape_timeout",
    "path": "metrics_path",
    "params": "params",
}
_ENDPOINT_FIELDS = {
    "port",
    "portNumber",
    "honorLabels",
    "honorTimestamps",
    "filterRunning",
    "scheme",
    "relabelings",
    "metricRelabelings",
    *_ENDPOINT_SCRAPE_KEYS,
}
_SPEC_FIELDS = {
    "selector",
    "namespaceSelector",
    "jobLabel",
    "targetLabels",
    "podTargetLabels",
    "serviceDiscoveryRole",
    "selectorMechanism",
    "endpoints",
    "podMetricsEndpoints",
}
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class UnsupportedMonitorField(ValueError):
    """The monitor sets a field that this translation does not cover."""


@dataclass(frozen=True)
class ApiServerAccess:
    """How a Prometheus outside the cluster reaches the API server: the Prometheus resource's
    spec.apiserverConfig (host, authorization.credentialsFile, tlsConfig.caFile)."""

    host: str
    token_file: str
    ca_file: str

    def sd_fields(self) -> dict[str, Any]:
        return {
            "api_server": self.host,
            "authorization": {"type": "Bearer", "credentials_file": self.token_file},
            "tls_config": {"ca_file": self.ca_file},
        }


def label_name(name: str) -> str:
    """A Kubernetes label key as Prometheus meta-label suffix (eagle3.ai/x-y -> eagle3_ai_x_y)."""
    return _INVALID_LABEL_CHARS.sub("_", name)


def scrape_configs(
    monitor: dict[str, Any], api_server: ApiServerAccess | None = None
) -> list[dict[str, Any]]:
    """One scrape config per endpoint of `monitor` (a ServiceMonitor or PodMonitor object, as
    applied); api_server None: in-cluster discovery (Prometheus running as a pod)."""
    kind = monitor.get("kind")
    if kind not in KINDS:
        raise ValueError(f"not a ServiceMonitor or PodMonitor: kind {kind!r}")
    spec = monitor["spec"]
    name = f"{kind}/{monitor['metadata']['name']}"
    _refuse_unknown(name, "spec", spec, _SPEC_FIELDS)
    if spec.get("selectorMechanism", "RelabelConfig") != "RelabelConfig":
        raise UnsupportedMonitorField(f"{name}: spec.selectorMechanism {spec['selectorMechanism']}")
    endpoints = spec.get("endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints") or []
    return [_scrape_config(monitor, endpoint, index, api_server) for index, endpoint in enumerate(endpoints)]


def _refuse_unknown(name: str, where: str, fields: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UnsupportedMonitorField(
            f"{name}: {where} sets {unknown}, which this translation does not cover"
        )


def _scrape_config(
    monitor: dict[str, Any], endpoint: dict[str, Any], index: int, api_server: ApiServerAccess | None
) -> dict[str, Any]:
    kind, spec = monitor["kind"], monitor["spec"]
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    _refuse_unknown(f"{kind}/{name}", f"endpoint {index}", endpoint, _ENDPOINT_FIELDS)
    service = kind == "ServiceMonitor"
    if service:
        role = "endpointslice" if spec.get("serviceDiscoveryRole") == "EndpointSlice" else "endpoints"
    else:
        role = "pod"

    config: dict[str, Any] = {
        "job_name": f"{'serviceMonitor' if service else 'podMonitor'}/{namespace}/{name}/{index}",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
    }
    if "honorTimestamps" in endpoint:
        config["honor_timestamps"] = bool(endpoint["honorTimestamps"])
    config["kubernetes_sd_configs"] = [
        _sd_config(role, spec.get("namespaceSelector") or {}, namespace, api_server)
    ]
    config |= {key: endpoint[field] for field, key in _ENDPOINT_SCRAPE_KEYS.items() if field in endpoint}
    if "scheme" in endpoint:
        config["scheme"] = endpoint["scheme"].lower()

    selector_rules = _selector_rules(spec.get("selector") or {}, "service" if service else "pod")
    if service:  # its running filter comes after the standard labels
        filters, targets = [], _service_targets(spec, endpoint, role)
    else:
        filters = [_running_filter()] if endpoint.get("filterRunning", True) else []
        targets = _pod_targets(spec, endpoint, f"{namespace}/{name}")
    config["relabel_configs"] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        *filters,
        *selector_rules,
        *_port_rule(endpoint, role),
        *targets,
        *_relabel_configs(endpoint.get("relabelings") or []),
    ]
    if endpoint.get("metricRelabelings"):
        config["metric_relabel_configs"] = _relabel_configs(endpoint["metricRelabelings"])
    return config


def _sd_config(
    role: str, namespace_selector: dict[str, Any], namespace: str, api_server: ApiServerAccess | None
) -> dict[str, Any]:
    sd: dict[str, Any] = {"role": role}
    if not namespace_selector.get("any"):
        sd["namespaces"] = {"names": list(namespace_selector.get("matchNames") or [namespace])}
    return sd | (api_server.sd_fields() if api_server else {})


def _running_filter() -> dict[str, Any]:
    return {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def _selector_rules(selector: dict[str, Any], object_kind: str) -> list[dict[str, Any]]:
    """Keep/drop rules equivalent to a label selector on the Service (or Pod) behind each target."""

    def sources(key: str, *, value: bool) -> list[str]:
        present = f"__meta_kubernetes_{object_kind}_labelpresent_{label_name(key)}"
        return [f"__meta_kubernetes_{object_kind}_label_{label_name(key)}", present] if value else [present]

    rules = [
        {"action": "keep", "source_labels": sources(key, value=True), "regex": f"({value});true"}
        for key, value in sorted((selector.get("matchLabels") or {}).items())
    ]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        if operator in ("In", "NotIn"):
            regex = f"({'|'.join(expression.get('values') or [])});true"
            action = "keep" if operator == "In" else "drop"
            rules.append({"action": action, "source_labels": sources(key, value=True), "regex": regex})
        elif operator in ("Exists", "DoesNotExist"):
            action = "keep" if operator == "Exists" else "drop"
            rules.append({"action": action, "source_labels": sources(key, value=False), "regex": "true"})
        else:
            raise ValueError(f"label selector operator {operator!r} (In, NotIn, Exists, DoesNotExist)")
    return rules


def _port_rule(endpoint: dict[str, Any], role: str) -> list[dict[str, Any]]:
    if endpoint.get("port"):
        source = {
            "pod": "__meta_kubernetes_pod_container_port_name",
            "endpoints": "__meta_kubernetes_endpoint_port_name",
            "endpointslice": "__meta_kubernetes_endpointslice_port_name",
        }[role]
        return [{"action": "keep", "source_labels": [source], "regex": endpoint["port"]}]
    if endpoint.get("portNumber"):
        source = "__meta_kubernetes_pod_container_port_number"
        return [{"action": "keep", "source_labels": [source], "regex": str(endpoint["portNumber"])}]
    return []


def _copy_labels(prefix: str, keys: list[str], target: str = "") -> list[dict[str, Any]]:
    """targetLabels / podTargetLabels: the object's label value, under the sanitised key (or
    `target`), where the object has it."""
    return [
        {
            "source_labels": [f"{prefix}{label_name(key)}"],
            "target_label": target or label_name(key),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for key in keys
    ]


def _service_targets(spec: dict[str, Any], endpoint: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """A ServiceMonitor's standard target labels, running filter, copied labels, job and endpoint."""
    prefix = "__meta_kubernetes_endpointslice" if role == "endpointslice" else "__meta_kubernetes_endpoint"
    address_target = [f"{prefix}_address_target_kind", f"{prefix}_address_target_name"]
    rules: list[dict[str, Any]] = [
        *(
            {
                "source_labels": address_target,
                "separator": ";",
                "regex": f"{kind};(.*)",
                "replacement": "${1}",
                "target_label": label,
            }
            for kind, label in (("Node", "node"), ("Pod", "pod"))
        ),
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    if endpoint.get("filterRunning", True):
        rules.append(_running_filter())
    rules += _copy_labels("__meta_kubernetes_service_label_", spec.get("targetLabels") or [])
    rules += _copy_labels("__meta_kubernetes_pod_label_", spec.get("podTargetLabels") or [])
    rules.append(
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}
    )
    rules += _job_label("__meta_kubernetes_service_label_", spec)
    if endpoint.get("port"):
        rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    return rules


def _pod_targets(spec: dict[str, Any], endpoint: dict[str, Any], job: str) -> list[dict[str, Any]]:
    """A PodMonitor's standard target labels, copied labels, job and endpoint."""
    rules: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        *_copy_labels("__meta_kubernetes_pod_label_", spec.get("podTargetLabels") or []),
        {"target_label": "job", "replacement": job},
        *_job_label("__meta_kubernetes_pod_label_", spec),
    ]
    if endpoint.get("port"):
        rules.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    return rules


def _job_label(prefix: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """spec.jobLabel: `job` is that label's value where the object has it."""
    if not spec.get("jobLabel"):
        return []
    return _copy_labels(prefix, [spec["jobLabel"]], target="job")


def _relabel_configs(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A monitor's RelabelConfigs in Prometheus' spelling (actions lower-cased)."""
    out = []
    for relabeling in relabelings:
        rule = {_RELABEL_KEYS[key]: value for key, value in relabeling.items() if key in _RELABEL_KEYS}
        if "action" in rule:
            rule["action"] = rule["action"].lower()
        out.append(rule)
    return out
