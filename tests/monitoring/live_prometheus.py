"""A real Prometheus on this host that finds a SpecDecodeDeployment's pods as an in-cluster one would.

It discovers its targets with `kubernetes_sd_configs` against the test bed's API server, as a
ServiceAccount with the rights a Prometheus needs (read pods, services, endpoints, endpoint
slices), and scrapes the pod IPs (the host routes the real node's pod range). Its scrape configs
are what prometheus-operator would generate from the given ServiceMonitors/PodMonitors
(tests/support/monitor_scrape_config.py: the one stand-in, since prometheus-operator cannot be built
here), so every target label comes from the monitors' own selectors and relabelling.

`check_spec_decode_monitoring` runs the chart's rules and dashboards against any serving
SpecDecodeDeployment whose single pod runs for real, and asserts their answers.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.monitoring.prometheus import Prometheus, dashboard_queries, variable_queries
from tests.support.cluster import ApiError, LocalCluster, wait_until
from tests.support.monitor_scrape_config import ApiServerAccess, scrape_configs

PROMETHEUS_ACCOUNT = "prometheus"
# kube-prometheus' Prometheus ClusterRole, less what discovery of these roles does not read.
PROMETHEUS_RULES = [
    {"apiGroups": [""], "resources": ["services", "endpoints", "pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
]
SPEC_DECODE_LABEL = "eagle3.ai/spec-decode-deployment"
VLLM_METRICS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:generation_tokens_total",
)
# The target labels prometheus-operator's configs give every pod they scrape.
STANDARD_LABELS = ("namespace", "pod", "container", "endpoint", "job")
LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$")
WARMUP_S = 12
DASHBOARD_GRACE_S = 60


@contextmanager
def prometheus_api_access(cluster: LocalCluster, namespace: str, workdir: Path) -> Iterator[ApiServerAccess]:
    """A `prometheus` ServiceAccount in `namespace`, bound to a ClusterRole with Prometheus' discovery
    rights (removed on the way out); its token in a file, for kubernetes_sd_configs."""
    role = f"eagle3-test-prometheus-{namespace}"
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROMETHEUS_ACCOUNT}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": PROMETHEUS_RULES,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_ACCOUNT, "namespace": namespace}],
            },
        ],
        namespace=namespace,
    )
    try:
        token = workdir / "prometheus.token"
        token.write_text(cluster.service_account_token(namespace, PROMETHEUS_ACCOUNT, expiration_s=3600))
        token.chmod(0o600)
        yield ApiServerAccess(host=cluster.server, token_file=str(token), ca_file=str(cluster.ca_file))
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)


@contextmanager
def discovering_prometheus(
    cluster: LocalCluster,
    workdir: Path,
    monitors: list[dict[str, Any]],
    rules: dict[str, Any],
    namespace: str,
) -> Iterator[Prometheus]:
    """Prometheus with the scrape configs of `monitors` (ServiceMonitor/PodMonitor objects) and `rules`,
    discovering through the API server as the `prometheus` ServiceAccount of `namespace`."""
    workdir.mkdir(parents=True, exist_ok=True)
    with prometheus_api_access(cluster, namespace, workdir) as access:
        configs = [config for monitor in monitors for config in scrape_configs(monitor, access)]
        with Prometheus(workdir, configs, rules) as prom:
            yield prom


class Load(threading.Thread):
    """Greedy completions, one after another, until stopped (vLLM counts spec decoding per step)."""

    def __init__(self, url: str, model: str, prompts: list[str], max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.model, self.prompts, self.max_tokens = url, model, prompts, max_tokens
        self.stop = threading.Event()
        self.completed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.Client(timeout=120) as client:
                while not self.stop.is_set():
                    prompt = self.prompts[self.completed % len(self.prompts)]
                    body = {
                        "model": self.model,
                        "prompt": prompt,
                        "max_tokens": self.max_tokens,
                        "temperature": 0,
                    }
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                    self.completed += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


@dataclass
class LiveAnswers:
    recorded_acceptance_length: float
    from_counters: float
    completions: int


def serving_pod(cluster: LocalCluster, namespace: str, sdd: str) -> dict[str, Any]:
    """The SpecDecodeDeployment's one Running pod."""
    selector = f"{SPEC_DECODE_LABEL}={sdd}"
    pods = cluster.request("GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={selector}")["items"]
    running = [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(running) == 1, (
        f"the live check compares one pod's counters with its SpecDecodeDeployment's; {sdd} has "
        f"{[p['metadata']['name'] for p in running]}"
    )
    return running[0]


def check_spec_decode_monitoring(
    cluster: LocalCluster,
    workdir: Path,
    namespace: str,
    sdd: str,
    monitors: list[dict[str, Any]],
    rules: dict[str, Any],
    *,
    prompts: list[str],
    window_s: int,
    dashboard_rate_interval: str,
    max_tokens: int = 48,
    max_acceptance_length: float = math.inf,
    while_watched: Callable[[], None] = lambda: None,
) -> LiveAnswers:
    """Load the SpecDecodeDeployment `sdd`'s pod while a discovering Prometheus (monitors, rules with
    rate window `window_s`) watches, run `while_watched` meanwhile, then assert: every target carries
    the standard labels and names its real pod; vLLM's series carry namespace/specdecodedeployment;
    every rule is healthy; every recording rule, dashboard panel and variable has data; the recorded
    mean acceptance length equals 1 + accepted/drafts of the raw samples of the same window; and
    Prometheus' last samples equal the pod's own /metrics once the load has stopped."""
    pod = serving_pod(cluster, namespace, sdd)
    body = cluster.request(
        "GET", f"/apis/eagle3.ai/v1alpha1/namespaces/{namespace}/specdecodedeployments/{sdd}"
    )
    model = body["spec"].get("servedModelName") or body["spec"]["target"]["model"]
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "http")
    url = f"http://{pod['status']['podIP']}:{port}"
    selector = f'namespace="{namespace}", specdecodedeployment="{sdd}"'

    with discovering_prometheus(cluster, workdir, monitors, rules, namespace) as prom:
        jobs = [config["job_name"] for monitor in monitors for config in scrape_configs(monitor)]
        wait_until(
            lambda: prom.targets_up(jobs), timeout=60, interval=1, what=f"a target up in each of {jobs}"
        )
        check_target_labels(cluster, prom)
        load = Load(url, model, prompts, max_tokens)
        load.start()
        started = time.monotonic()
        try:
            while_watched()
            time.sleep(max(0.0, WARMUP_S + window_s + 3 - (time.monotonic() - started)))
            assert load.error is None, f"request to vLLM failed: {load.error!r}"
            check_rules_and_dashboards(prom, rules, selector, dashboard_rate_interval)
            recorded, from_counters = check_acceptance_length(prom, selector, window_s)
        finally:
            load.stop.set()
            load.join(timeout=180)
        assert load.error is None, f"request to vLLM failed: {load.error!r}"
        assert 1 < from_counters <= max_acceptance_length
        check_last_samples_equal_pod_metrics(prom, url, selector)
    return LiveAnswers(recorded, from_counters, load.completed)


def check_target_labels(cluster: LocalCluster, prom: Prometheus) -> None:
    """Every target has the standard labels, and its pod label names the pod at the target's address."""
    for target in prom.targets():
        labels = target["labels"]
        missing = [name for name in STANDARD_LABELS if not labels.get(name)]
        assert not missing, f"target {target['scrapeUrl']} lacks {missing}: {labels}"
        try:
            pod = cluster.request("GET", f"/api/v1/namespaces/{labels['namespace']}/pods/{labels['pod']}")
        except ApiError as error:
            raise AssertionError(f"target {target['scrapeUrl']} names no pod: {labels}") from error
        assert labels["instance"].rsplit(":", 1)[0] == pod["status"]["podIP"], (
            labels,
            pod["status"]["podIP"],
        )
        assert labels["container"] in [c["name"] for c in pod["spec"]["containers"]], labels
        print(f"target {target['scrapePool']}: {labels}")


def has_data(result: list[dict]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def _panels_without_data(prom: Prometheus, rate_interval: str) -> list[tuple[str, str, str]]:
    return [query for query in dashboard_queries(rate_interval) if not has_data(prom.query(query[2]))]


def check_rules_and_dashboards(
    prom: Prometheus, rules: dict[str, Any], selector: str, rate_interval: str
) -> None:
    records = [rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule]
    for metric in VLLM_METRICS:
        assert has_data(prom.query(f"{metric}{{{selector}}}")), f"no {metric}{{{selector}}}"
    assert prom.query(f"sum(vllm:spec_decode_num_accepted_tokens_total{{{selector}}}) > 0"), (
        "no draft token accepted"
    )

    groups = prom.api("rules")["groups"]
    unhealthy = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    loaded = sorted(g["name"] for g in groups)
    assert loaded == sorted(g["name"] for g in rules["groups"]) and not unhealthy, (loaded, unhealthy)

    empty = [record for record in records if not has_data(prom.query(record))]
    assert not empty, f"recording rules without data: {empty}"
    # A gauge panel shows nothing while its target's latest scrape failed (Prometheus marks the series
    # stale); on a loaded 2-core machine one scrape can fail, so a panel gets DASHBOARD_GRACE_S to fill.
    try:
        wait_until(
            lambda: not _panels_without_data(prom, rate_interval),
            timeout=DASHBOARD_GRACE_S,
            interval=2,
            what="every dashboard panel to have data",
        )
    except TimeoutError as error:
        empty = _panels_without_data(prom, rate_interval)
        health = [
            (t["scrapePool"], t["health"], t.get("lastError"), t.get("lastScrapeDuration"))
            for t in prom.targets()
        ]
        raise AssertionError(
            f"{error}; dashboard queries without data:\n"
            + "\n".join(map(str, empty))
            + f"\ntargets: {health}"
        ) from error
    for target in prom.targets():
        print(f"scrape {target['scrapePool']}: {target['health']}, {target['lastScrapeDuration']:.3f} s")
    for dash, name, query in variable_queries():
        parsed = LABEL_VALUES.match(query)
        assert parsed, f"{dash}: variable {name}: unexpected query {query}"
        assert prom.label_values(parsed["label"], parsed["match"]), f"{dash}: variable {name} has no values"


def raw_samples(prom: Prometheus, metric: str, selector: str, window_s: int, at: float) -> dict[float, float]:
    """The raw samples (timestamp -> value) Prometheus holds for the window ending at `at`."""
    (series,) = prom.query(f"{metric}{{{selector}}}[{window_s}s]", at=at)
    samples = {float(t): float(value) for t, value in series["values"]}
    assert len(samples) >= window_s // 2, f"only {len(samples)} samples of {metric} in the window"
    return samples


def check_acceptance_length(prom: Prometheus, selector: str, window_s: int) -> tuple[float, float]:
    """The recorded mean acceptance length against the raw counters of the same window.

    A scrape that began before the rule's evaluation time may be appended after the rule ran: its
    sample is in the window when queried now but was not when the rule was evaluated. So the rule
    must equal, exactly, the ratio over the window's samples, or over all of them but the last.
    """
    record = f"specdecodedeployment:vllm_spec_decode_mean_acceptance_length:rate{window_s}s"
    (series,) = prom.query(f"{record}{{{selector}}}[5s]")
    evaluated_at, recorded = series["values"][-1]
    at = float(evaluated_at)
    accepted = raw_samples(prom, "vllm:spec_decode_num_accepted_tokens_total", selector, window_s, at)
    drafts = raw_samples(prom, "vllm:spec_decode_num_drafts_total", selector, window_s, at)
    assert accepted.keys() == drafts.keys(), "one target's scrapes give both counters the same timestamps"
    stamps = sorted(drafts)
    candidates = []
    for last in (stamps[-1], stamps[-2]):
        delta_drafts = drafts[last] - drafts[stamps[0]]
        assert delta_drafts > 0
        candidates.append(1 + (accepted[last] - accepted[stamps[0]]) / delta_drafts)
    print(
        f"mean acceptance length: recorded {recorded}, from counters {candidates[0]} (without the last sample {candidates[1]})"
    )
    matching = [c for c in candidates if math.isclose(float(recorded), c, rel_tol=1e-9)]
    assert matching, (recorded, candidates)
    return float(recorded), matching[0]


def pod_counter(metrics_text: str, metric: str) -> float:
    """The sum of a counter's samples in a /metrics page (one engine: one sample)."""
    pattern = re.compile(rf"^{re.escape(metric)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    values = [float(match[2]) for match in pattern.finditer(metrics_text)]
    assert values, f"{metric} not in the pod's /metrics"
    return sum(values)


def check_last_samples_equal_pod_metrics(prom: Prometheus, url: str, selector: str) -> None:
    """With the load stopped, the counters hold still: Prometheus' latest samples are the pod's values."""
    counters = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total")

    def equal() -> dict[str, float] | None:
        page = httpx.get(f"{url}/metrics", timeout=30).text
        on_pod = {metric: pod_counter(page, metric) for metric in counters}
        scraped = {m: float(prom.query(f"sum({m}{{{selector}}})")[0]["value"][1]) for m in counters}
        return on_pod if scraped == on_pod else None

    on_pod = wait_until(
        equal, timeout=30, interval=1, what="Prometheus' latest samples to equal the pod's /metrics"
    )
    print(f"pod's /metrics and Prometheus agree: {on_pod}")
