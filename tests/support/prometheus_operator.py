"""The Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule) on the test bed.

These are the real schemas of a pinned prometheus-operator release (v0.95.2, pinned in
hack/testbed/monitoring/go.mod): hack/build-monitoring-crds.sh generates them with controller-gen
from the release's API-types module, with the options of the operator's own `make generate-crds`,
into a cached directory. `make test` exports that directory as $EAGLE3_MONITORING_CRDS; without it,
the script runs here. The API server validates and prunes monitors against these schemas; the
Prometheus Operator's controllers do not run (the operator and the chart only create the objects).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.cluster import REPO_ROOT, ClusterError, LocalCluster, wait_until

GROUP = "monitoring.coreos.com"
MONITORING_KINDS = {
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}
CRD_SCRIPT = REPO_ROOT / "hack" / "build-monitoring-crds.sh"


def crd_dir() -> Path:
    """The directory of generated CRDs: $EAGLE3_MONITORING_CRDS, else generated (cached) by the script."""
    configured = os.environ.get("EAGLE3_MONITORING_CRDS")
    if not configured:
        result = subprocess.run(["bash", str(CRD_SCRIPT)], stdout=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise ClusterError(f"{CRD_SCRIPT} failed with exit code {result.returncode} (its log is above)")
        configured = result.stdout.strip().splitlines()[-1]
    return Path(configured)


def _established(cluster: LocalCluster, name: str) -> bool:
    crd = cluster.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@contextmanager
def prometheus_operator_crds(
    cluster: LocalCluster, kinds: Iterable[str] = tuple(MONITORING_KINDS)
) -> Iterator[None]:
    """The given monitoring kinds are served while inside; removed on the way out (other tests expect none)."""
    directory = crd_dir()
    plurals = [MONITORING_KINDS[kind] for kind in kinds]
    for plural in plurals:
        path = directory / f"{GROUP}_{plural}.yaml"
        if not path.is_file():
            raise ClusterError(f"no {path.name} in {directory}; run {CRD_SCRIPT}")
        cluster.apply(path.read_text())
    names = [f"{plural}.{GROUP}" for plural in plurals]
    # Polled rather than `kubectl wait`, which fails while a new CRD has no status.conditions yet.
    for name in names:
        wait_until(lambda name=name: _established(cluster, name), timeout=60, what=f"CRD {name} Established")
    try:
        yield
    finally:
        cluster.kubectl("delete", "crd", *names, "--wait=true", timeout=120)
