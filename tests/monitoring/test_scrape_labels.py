"""The monitors that scrape vLLM give its series the labels the rules and dashboards group by.

Every recording rule and panel aggregates `by (namespace, specdecodedeployment)`. The Prometheus
Operator adds `namespace` itself; `specdecodedeployment` has to come from relabelling the
`eagle3.ai/spec-decode-deployment` label that the operator puts on the serving pods and Service.
Checked for the chart's PodMonitor (tests/chart/test_chart.py) and here for the ServiceMonitor and
PodMonitor the operator makes per SpecDecodeDeployment (its pure planner, no cluster needed).
"""

from __future__ import annotations

from datetime import UTC, datetime

import yaml
from eagle3_operator.reconcile.serving import ServingObserved, ServingPlanner

from tests.support.cluster import REPO_ROOT

SOURCE_PREFIX = {
    "ServiceMonitor": "__meta_kubernetes_service_label_",
    "PodMonitor": "__meta_kubernetes_pod_label_",
}


def test_operator_monitors_label_series_with_their_spec_decode_deployment():
    body = yaml.safe_load((REPO_ROOT / "examples" / "specdecodedeployment-hub-draft.yaml").read_text())
    body["metadata"] |= {"namespace": "team-a", "uid": "0000", "generation": 1}
    body["spec"]["monitoring"] = {"serviceMonitor": True, "podMonitor": True}
    observed = ServingObserved(now=datetime.now(UTC), monitor_kinds={"ServiceMonitor", "PodMonitor"})
    monitors = ServingPlanner(body, observed).monitors()
    assert sorted(m["kind"] for m in monitors) == ["PodMonitor", "ServiceMonitor"]
    for monitor in monitors:
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints")
        for endpoint in endpoints:
            relabel = {r.get("targetLabel"): r.get("sourceLabels") for r in endpoint.get("relabelings") or []}
            expected = [SOURCE_PREFIX[monitor["kind"]] + "eagle3_ai_spec_decode_deployment"]
            assert relabel.get("specdecodedeployment") == expected, (
                f"the operator's {monitor['kind']} must relabel {expected[0]} to specdecodedeployment "
                f"(the chart's rules and dashboards group by it); it has {endpoint.get('relabelings')}"
            )
