"""A real Prometheus finds and scrapes a SpecDecodeDeployment's vLLM pod and the operator's pod, both
running for real on the test bed's real node, through the chart's own PodMonitor and ServiceMonitor.

The chart is installed with its operator Deployment on the real node (image built from this
checkout). A SpecDecodeDeployment serves the tiny target with an EAGLE-3 draft (the constant draft of
tests/monitoring/constant_draft.py, so that tokens are accepted without training), both read from
host directories through read-only claims; its pod runs vLLM's CPU build doing real speculative
decoding. A DraftTraining runs to Succeeded meanwhile (its stage pods are kwok's), so the operator's
training metrics move.

Prometheus (Debian's binary, on this host) discovers both pods with kubernetes_sd_configs against
the test bed's API server, as a ServiceAccount with a Prometheus' discovery rights, using the scrape
configs prometheus-operator would generate from the monitors as the API server stored them. That
translation (tests/support/monitor_scrape_config.py) is the one stand-in: prometheus-operator's own
binary cannot be built here (the Go module proxy refuses its root module). Every label
(namespace, pod, specdecodedeployment, ...) comes from the monitors' selectors and relabelling.

It evaluates the chart's recording rules and alerts (the PrometheusRule as stored, window 20s for a
short test) and answers every dashboard query. Checked: vLLM exports the metric names the rules
use; every rule loads and evaluates without error; every recording rule, dashboard panel and template
variable returns data; the recorded mean acceptance length equals 1 + accepted/drafts of the raw
counter samples of the same window, and Prometheus' samples equal the pod's own /metrics.
"""

from __future__ import annotations

import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.chart.installed import installed, run_training
from tests.monitoring.constant_draft import build_constant_draft, most_frequent_output_token
from tests.monitoring.live_prometheus import check_spec_decode_monitoring, serving_pod
from tests.support import realnode
from tests.support.cluster import LocalCluster, wait_until
from tests.support.prometheus_operator import prometheus_operator_crds

WINDOW_S = 20
# Grafana's $__rate_interval for a dashboard zoomed out to a few hours; it spans the whole test, so the
# operator's reconciles (busy only while the DraftTraining runs) are in every window.
DASHBOARD_RATE_INTERVAL = "5m"
SPEC_TOKENS = 3
MAX_TOKENS = 48
SDD = "tiny"
SERVING_READY_TIMEOUT_S = 600
# vLLM is scraped every second, so that a 20 s window holds enough samples; the operator every 5 s,
# as its 1 s scrapes can time out while vLLM and the test bed keep both cores busy (in CI on
# 2026-12-01 every operator gauge went stale);
# otherwise the chart's defaults.
CHART_VALUES = {
    "prometheusRule": {"rateWindow": f"{WINDOW_S}s"},
    "metrics": {
        "serviceMonitor": {"interval": "5s", "scrapeTimeout": "5s"},
        "podMonitor": {"interval": "1s", "scrapeTimeout": "1s"},
    },
}


def real_node_serving_manifest(target_claim: str, draft_claim: str) -> dict:
    """The SpecDecodeDeployment on the real node, as vLLM's CPU build runs it."""
    return {
        "apiVersion": "eagle3.ai/v1alpha1",
        "kind": "SpecDecodeDeployment",
        "metadata": {"name": SDD},
        "spec": {
            "target": {
                "model": f"pvc://{target_claim}/model",
                "gpus": 1,
                "maxModelLen": 1024,
                "extraArgs": ["--dtype", "bfloat16", "--enforce-eager"],
                "env": realnode.VLLM_CPU_ENV,
            },
            "draft": {"model": f"pvc://{draft_claim}/model"},
            "servedModelName": SDD,
            "numSpeculativeTokens": SPEC_TOKENS,
            "replicas": 1,
            "scheduling": {
                "nodeSelector": realnode.REAL_NODE_SELECTOR,
                "tolerations": realnode.REAL_NODE_TOLERATIONS,
            },
            # The chart's PodMonitor scrapes these pods; the per-object ServiceMonitor would scrape them twice.
            "monitoring": {"serviceMonitor": False},
        },
    }


def monitors_of(cluster: LocalCluster, namespace: str) -> list[dict]:
    return [
        monitor
        for plural in ("servicemonitors", "podmonitors")
        for monitor in cluster.request(
            "GET", f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/{plural}"
        )["items"]
    ]


@pytest.mark.slow
def test_rules_and_dashboards_answer_from_a_live_vllm_pod_and_operator_pod(cluster, tmp_path):
    target = ensure_tiny_target()
    prompts = [text[:400] for text in stdlib_corpus(0.3)[:8]]
    token = most_frequent_output_token(target, prompts, MAX_TOKENS)
    # Each claim's root is a host directory; the pods read the model under it (pvc://CLAIM/model).
    target_claim, draft_claim = "target-model", "draft-model"
    claims = tmp_path / "claims"
    build_constant_draft(target, claims / draft_claim / "model", token)

    with (
        prometheus_operator_crds(cluster),
        installed(
            cluster,
            tmp_path,
            mode="namespaced",
            release="e3mon",
            values=CHART_VALUES,
            operator_in_cluster=True,
        ) as inst,
    ):
        cluster.real_node.host_folder_claims(cluster, inst.work, claims, tiny_target=f"{target_claim}/model")
        cluster.apply(real_node_serving_manifest(target_claim, draft_claim), namespace=inst.work)
        wait_until(
            lambda: _ready(cluster, inst.work),
            timeout=SERVING_READY_TIMEOUT_S,
            interval=2,
            what=f"SpecDecodeDeployment {SDD}'s vLLM pod Ready on the real node",
        )
        rule = cluster.request(
            "GET", f"/apis/monitoring.coreos.com/v1/namespaces/{inst.system}/prometheusrules"
        )["items"]
        answers = check_spec_decode_monitoring(
            cluster,
            tmp_path / "prometheus",
            inst.work,
            SDD,
            monitors_of(cluster, inst.system),
            rule[0]["spec"],
            prompts=prompts,
            window_s=WINDOW_S,
            dashboard_rate_interval=DASHBOARD_RATE_INTERVAL,
            max_tokens=MAX_TOKENS,
            max_acceptance_length=1 + SPEC_TOKENS,
            # The operator works while Prometheus watches: training, reconcile, resource metrics.
            while_watched=lambda: run_training(inst, "train"),
        )
        print(f"{answers.completions} completions; draft token id {token}")


def _ready(cluster: LocalCluster, namespace: str) -> bool:
    try:
        pod = serving_pod(cluster, namespace, SDD)
    except AssertionError:
        return False
    conditions = pod["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
