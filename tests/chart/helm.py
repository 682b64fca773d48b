"""Runs the real helm binary on the chart in helm/eagle3-operator (shared by tests/chart and tests/monitoring)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import REPO_ROOT, find_bin_dir

CHART_DIR = REPO_ROOT / "helm" / "eagle3-operator"
RELEASE = "eagle3"


class HelmError(RuntimeError):
    def __init__(self, args: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"helm {' '.join(args)} exited {returncode}:\n{stderr}")
        self.stderr = stderr


def helm(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run helm; stdout, or HelmError with helm's stderr."""
    binary = str(find_bin_dir() / "helm")
    result = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if result.returncode != 0:
        raise HelmError(list(args), result.returncode, result.stderr)
    return result.stdout


def values_args(tmp_dir: Path, *values: dict[str, Any]) -> list[str]:
    """`--values FILE` per values dict (written to tmp_dir); helm deep-merges them, later ones win."""
    args = []
    for overrides in values:
        path = tmp_dir / f"values-{len(list(tmp_dir.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(overrides))
        args += ["--values", str(path)]
    return args


def render(
    tmp_dir: Path, *values: dict[str, Any], namespace: str = "eagle3-system", show_only: str = ""
) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values: the rendered objects (CRDs excluded)."""
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", namespace, *values_args(tmp_dir, *values)]
    if show_only:
        args += ["--show-only", show_only]
    return [doc for doc in yaml.safe_load_all(helm(*args)) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def rendered_rule_groups(tmp_dir: Path, *values: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule's spec (a Prometheus rule file: {groups: [...]}) as the chart renders it."""
    enabled = {"prometheusRule": {"enabled": True}}
    (rule,) = render(tmp_dir, enabled, *values, show_only="templates/prometheusrule.yaml")
    return rule["spec"]


def install_chart_crds(cluster) -> None:
    """Apply the chart's CRDs (what `helm install` installs) and wait until the API server serves them."""
    crd_dir = CHART_DIR / "crds"
    files = sorted(crd_dir.glob("*.yaml"))
    assert files, f"{crd_dir} has no CRDs: run `make crds` (eagle3_api.crdgen writes them)"
    for path in files:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in files:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
