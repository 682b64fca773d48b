"""A real Prometheus scrapes a real vLLM CPU server doing EAGLE-3 speculative decoding, and the real
operator's metrics endpoint (the chart installed in the test bed, a DraftTraining run to Succeeded).

It evaluates the chart's recording rules and alerts (rendered by helm, window 20s for a short test)
and answers every dashboard query. Checked: vLLM exports the metric names the rules use; every rule
loads and evaluates without error; every recording rule, dashboard panel and template variable
returns data; the recorded mean acceptance length equals 1 + accepted/drafts computed from the raw
counter samples of the same window.
"""

from __future__ import annotations

import math
import re
import threading
import time

import httpx
import pytest

from eagle3_runtime.tiny_target import ensure_tiny_target, stdlib_corpus
from tests.chart.helm import rendered_rule_groups
from tests.chart.installed import installed, run_training, serving_manifest
from tests.monitoring.constant_draft import build_constant_draft, most_frequent_output_token
from tests.monitoring.prometheus import Prometheus, dashboard_queries, variable_queries
from tests.support.cluster import wait_until
from tests.support.prometheus_operator import prometheus_operator_crds
from tests.support.vllm_server import running_vllm

WINDOW = "20s"
WINDOW_S = 20
# Grafana's $__rate_interval for a dashboard zoomed out to a few hours; it spans the whole test, so the
# operator's reconciles (busy only while the DraftTraining runs) are in every window.
DASHBOARD_RATE_INTERVAL = "5m"
WARMUP_S = 12
SPEC_TOKENS = 3
MAX_TOKENS = 48
SDD = "tiny"
VLLM_METRICS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:generation_tokens_total",
)
LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$")


class Load(threading.Thread):
    """Greedy completions, one after another, until stopped (vLLM counts spec decoding per step)."""

    def __init__(self, url: str, model: str, prompts: list[str]):
        super().__init__(daemon=True)
        self.url, self.model, self.prompts = url, model, prompts
        self.stop = threading.Event()
        self.completed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=120) as client:
                while not self.stop.is_set():
                    prompt = self.prompts[self.completed % len(self.prompts)]
                    body = {"model": self.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                    self.completed += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


def has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def raw_increase(prom: Prometheus, metric: str, selector: str, at: float) -> float:
    """last - first of the raw samples Prometheus holds for the window ending at `at`."""
    (series,) = prom.query(f"{metric}{{{selector}}}[{WINDOW}]", at=at)
    values = [float(value) for _, value in series["values"]]
    assert len(values) >= WINDOW_S // 2, f"only {len(values)} samples of {metric} in the window"
    return values[-1] - values[0]


@pytest.mark.slow
def test_rules_and_dashboards_answer_from_a_live_vllm_and_operator(cluster, tmp_path):
    target = ensure_tiny_target()
    prompts = [text[:400] for text in stdlib_corpus(0.3)[:8]]
    token = most_frequent_output_token(target, prompts, MAX_TOKENS)
    draft = build_constant_draft(target, tmp_path / "draft", token)
    rules = rendered_rule_groups(tmp_path, {"prometheusRule": {"rateWindow": WINDOW}})
    records = [rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule]

    with (
        prometheus_operator_crds(cluster),
        installed(cluster, tmp_path, mode="namespaced", release="e3mon") as inst,
    ):
        speculative = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": SPEC_TOKENS}
        with running_vllm(target, tmp_path, name="vllm-eagle3", speculative_config=speculative) as server:
            jobs = {
                # What the PodMonitor's relabelling attaches to a serving pod's series.
                "vllm": {
                    "target": f"127.0.0.1:{server.port}",
                    "labels": {"namespace": inst.work, "specdecodedeployment": SDD, "pod": f"{SDD}-0"},
                },
                "eagle3-operator": {
                    "target": f"127.0.0.1:{inst.operator.metrics_port}",
                    "honor_labels": True,
                },
            }
            (tmp_path / "prometheus").mkdir()
            with Prometheus(tmp_path / "prometheus", jobs, rules) as prom:
                wait_until(prom.targets_up, timeout=30, what="both scrape targets up")
                load = Load(server.url, server.served_model_name, prompts)
                load.start()
                started = time.monotonic()
                try:
                    # The operator works while Prometheus watches: training, reconcile, resource metrics.
                    run_training(inst, "train")
                    cluster.apply(serving_manifest("serve", "train"), namespace=inst.work)
                    time.sleep(max(0.0, WARMUP_S + WINDOW_S + 3 - (time.monotonic() - started)))
                    assert load.error is None, f"request to vLLM failed: {load.error!r}"
                    check_live_answers(prom, records, inst.work)
                finally:
                    load.stop.set()
                    load.join(timeout=180)
                assert load.error is None, f"request to vLLM failed: {load.error!r}"
                print(f"{load.completed} completions; draft token id {token}")


def check_live_answers(prom: Prometheus, records: list[str], namespace: str) -> None:
    selector = f'namespace="{namespace}", specdecodedeployment="{SDD}"'
    for metric in VLLM_METRICS:
        assert has_data(prom.query(f"{metric}{{{selector}}}")), f"vLLM exports no {metric}"
    assert prom.query(f"sum(vllm:spec_decode_num_accepted_tokens_total{{{selector}}}) > 0"), (
        "no draft token accepted"
    )

    groups = prom.api("rules")["groups"]
    unhealthy = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert len(groups) == 2 and not unhealthy, unhealthy

    empty = [record for record in records if not has_data(prom.query(record))]
    assert not empty, f"recording rules without data: {empty}"
    empty = [
        (dash, panel, expr)
        for dash, panel, expr in dashboard_queries(DASHBOARD_RATE_INTERVAL)
        if not has_data(prom.query(expr))
    ]
    assert not empty, "dashboard queries without data:\n" + "\n".join(map(str, empty))
    for dash, name, query in variable_queries():
        parsed = LABEL_VALUES.match(query)
        assert parsed, f"{dash}: variable {name}: unexpected query {query}"
        assert prom.label_values(parsed["label"], parsed["match"]), f"{dash}: variable {name} has no values"

    # The recorded acceptance length against the raw counters of the same window.
    record = f"specdecodedeployment:vllm_spec_decode_mean_acceptance_length:rate{WINDOW}"
    (series,) = prom.query(f"{record}{{{selector}}}[5s]")
    evaluated_at, recorded = series["values"][-1]
    accepted = raw_increase(prom, "vllm:spec_decode_num_accepted_tokens_total", selector, float(evaluated_at))
    drafts = raw_increase(prom, "vllm:spec_decode_num_drafts_total", selector, float(evaluated_at))
    assert drafts > 0
    from_counters = 1 + accepted / drafts
    print(
        f"mean acceptance length: recorded {recorded}, from counters 1 + {accepted:g}/{drafts:g} = {from_counters}"
    )
    assert math.isclose(float(recorded), from_counters, rel_tol=1e-9), (recorded, from_counters)
    assert 1 < from_counters <= 1 + SPEC_TOKENS
