"""examples/ are accepted by a real API server with the chart's CRDs (server-side dry run, strict fields)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chart.helm import install_chart_crds
from tests.support.cluster import REPO_ROOT, KubectlError

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))


def dry_run(cluster, namespace: str, manifest: str) -> str:
    return cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", "-", input=manifest
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[path.name for path in EXAMPLES])
def test_example_is_accepted(path: Path, cluster, namespace):
    install_chart_crds(cluster)
    out = dry_run(cluster, namespace, path.read_text())
    obj = yaml.safe_load(path.read_text())
    assert f"{obj['kind'].lower()}.eagle3.ai/{obj['metadata']['name']} created (server dry run)" in out


def test_strict_validation_catches_a_misspelt_field(cluster, namespace):
    """The dry run above is meaningful: a typo in an example would fail it, naming the field."""
    install_chart_crds(cluster)
    obj = yaml.safe_load((REPO_ROOT / "examples" / "specdecodedeployment.yaml").read_text())
    obj["spec"]["numSpeculativeTokenz"] = obj["spec"].pop("numSpeculativeTokens")
    with pytest.raises(KubectlError) as failure:
        dry_run(cluster, namespace, yaml.safe_dump(obj))
    assert 'unknown field "spec.numSpeculativeTokenz"' in str(failure.value)
