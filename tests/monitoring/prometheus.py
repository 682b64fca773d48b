"""A real Prometheus on loopback for tests, and the dashboards' queries to run on it.

The server is upstream's, built from its Go module with Kubernetes service discovery
(hack/build-prometheus.sh, cached; $EAGLE3_PROMETHEUS_BIN names a built directory): Debian's
prometheus lacks kubernetes_sd_configs. Debian's promtool still checks the rules (tests/monitoring/promtool.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from eagle3_runtime.vllm_server import free_port
from tests.chart.helm import CHART_DIR
from tests.support.cluster import REPO_ROOT, find_bin_dir, wait_until

DASHBOARDS = sorted((CHART_DIR / "files" / "dashboards").glob("*.json"))
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-prometheus.sh"


def server_binary() -> Path:
    """The Prometheus server with Kubernetes discovery: in $EAGLE3_PROMETHEUS_BIN, else built (once,
    cached) by hack/build-prometheus.sh."""
    return find_bin_dir("EAGLE3_PROMETHEUS_BIN", BUILD_SCRIPT, ("prometheus",)) / "prometheus"


class Prometheus:
    """Prometheus running `scrape_configs` (Prometheus' own format; 1 s interval unless they set one)
    and evaluating `rules` (a rule file dict) every second."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rules: dict[str, Any]):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Prometheus:
        log = open(self.workdir / "prometheus.log", "w")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                str(server_binary()),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            self._ready,
            timeout=60,
            interval=0.5,
            what=f"Prometheus ready (log {self.workdir}/prometheus.log)",
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"prometheus exited {self.process.returncode}: see {self.workdir}/prometheus.log"
            )
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return self.api("query", **params)["result"]

    def targets(self) -> list[dict[str, Any]]:
        """The active targets: scrapePool (the job), labels, discoveredLabels, health, lastError."""
        return self.api("targets", state="active")["activeTargets"]

    def targets_up(self, jobs: list[str]) -> bool:
        """Every job has a target and every target is up."""
        active = self.targets()
        return {t["scrapePool"] for t in active} >= set(jobs) and all(t["health"] == "up" for t in active)

    def label_values(self, label: str, match: str) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match})


def dashboard_queries(rate_interval: str) -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL) of every panel target, with the variables set to "All"."""
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        values = {"$__rate_interval": rate_interval}
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                values[f"${variable['name']}"] = variable["allValue"]
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"]
                # Longest names first: $__rate_interval must not be cut by a shorter variable name.
                for name in sorted(values, key=len, reverse=True):
                    expr = expr.replace(name, values[name])
                assert "$" not in expr, f"unresolved variable in {panel['title']!r}: {expr}"
                out.append((dashboard["title"], panel["title"], expr))
    return out


def variable_queries() -> list[tuple[str, str, str]]:
    """(dashboard title, variable, label_values(...) query) of every query variable, "All" for the others."""
    out = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                query = variable["query"]["query"]
                for other in dashboard["templating"]["list"]:
                    if other["type"] == "query":
                        query = query.replace(f"${other['name']}", other["allValue"])
                out.append((dashboard["title"], variable["name"], query))
    return out
