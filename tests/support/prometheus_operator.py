"""Stand-ins for the Prometheus Operator's CRDs on the test bed (the real ones cannot be downloaded here).

The operator and the chart only need the API to exist (ServiceMonitor, PodMonitor, PrometheusRule
objects are created and read back), not the Prometheus Operator's controllers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.cluster import LocalCluster

MONITORING_KINDS = {
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    "PrometheusRule": "prometheusrules",
}


def stand_in_crd(kind: str, plural: str) -> dict[str, Any]:
    """A schema-less CRD that serves `kind` in monitoring.coreos.com/v1."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],  # fmt: skip
        },
    }


@contextmanager
def prometheus_operator_crds(
    cluster: LocalCluster, kinds: Iterable[str] = tuple(MONITORING_KINDS)
) -> Iterator[None]:
    """The given monitoring kinds are served while inside; removed on the way out (other tests expect none)."""
    plurals = [MONITORING_KINDS[kind] for kind in kinds]
    for kind, plural in zip(kinds, plurals, strict=True):
        cluster.apply(stand_in_crd(kind, plural))
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.monitoring.coreos.com", "--timeout=60s"
        )
    try:
        yield
    finally:
        for plural in plurals:
            cluster.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", "--wait=true", timeout=120)
