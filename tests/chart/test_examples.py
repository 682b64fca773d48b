"""examples/ as a user meets them: accepted by a real API server with the chart's CRDs (server-side
dry run, strict fields), the serving examples served by the operator, and the prerequisites the
examples name either made by the chart or explained in the example."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import CHART_DIR, RELEASE, by_kind, helm, install_chart_crds, render
from tests.operator.harness import OperatorProcess, condition, spec_decode_path
from tests.support.cluster import REPO_ROOT, KubectlError, wait_until

EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
SERVING_EXAMPLES = [path for path in EXAMPLES if path.name.startswith("specdecodedeployment")]


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


def test_serving_examples_get_deployments_whose_pods_are_scheduled(cluster, namespace, tmp_path):
    """`kubectl apply` of each serving example gives a Deployment (one that sets an env variable the
    operator sets too used to be refused by server-side apply), whose pods the real scheduler places
    on the test bed's MI355X nodes (labelled like the AMD node labeller does)."""
    install_chart_crds(cluster)
    operator = OperatorProcess(cluster, [namespace], tmp_path / "operator.log").start()
    try:
        for path in SERVING_EXAMPLES:
            cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        for path in SERVING_EXAMPLES:
            example = yaml.safe_load(path.read_text())
            name = example["metadata"]["name"]
            deployment = wait_until(
                lambda name=name: _json(cluster, "get", "deployment", name, "-n", namespace),
                timeout=60,
                what=f"the Deployment of {path.name}",
            )
            (container,) = deployment["spec"]["template"]["spec"]["containers"]
            names = Counter(entry["name"] for entry in container["env"])
            assert max(names.values()) == 1, f"{path.name}: duplicate env names {names}"
            for entry in example["spec"]["target"].get("env") or []:
                assert entry in container["env"], f"{path.name}: {entry} is not in the container"
            assert deployment["spec"]["template"]["spec"].get("nodeSelector") == (
                example["spec"].get("scheduling") or {}
            ).get("nodeSelector")
            body = wait_until(
                lambda name=name: (
                    condition(
                        b := cluster.request("GET", spec_decode_path(namespace, name)), "Available"
                    ).get("status")
                    == "True"
                    and b
                ),
                timeout=90,
                interval=0.5,
                what=f"{path.name} Available (its pods scheduled and run by kwok)",
            )
            assert body["status"]["readyReplicas"] >= 1
    except BaseException:
        print(f"--- operator log ---\n{operator.log_tail(80)}")
        raise
    finally:
        operator.stop()


def _json(cluster, *args: str) -> dict | None:
    try:
        return json.loads(cluster.kubectl(*args, "-o", "json"))
    except KubectlError:
        return None


def test_the_drafttraining_example_says_how_to_get_its_service_account(cluster, tmp_path):
    """The example's runtime ServiceAccount: a default install makes none (and its notes say how to
    add it), and the command the example gives makes it, bound to the runtime role, in the example's
    namespace."""
    path = REPO_ROOT / "examples" / "drafttraining.yaml"
    account = yaml.safe_load(path.read_text())["spec"]["runtime"]["serviceAccountName"]
    namespace = re.search(r"kubectl -n (\S+) create secret", path.read_text()).group(1)

    def runtime_accounts(objects):
        return [(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in by_kind(objects, "ServiceAccount")
                if sa["metadata"]["name"] == account]  # fmt: skip

    assert runtime_accounts(render(tmp_path)) == [], (
        "a default install creates it nowhere: the example must say"
    )
    notes = helm(
        "install", "--dry-run=client", RELEASE, str(CHART_DIR), "-n", "eagle3-system", env=cluster.env()
    )
    assert "--reuse-values --set 'runtime.namespaces={<namespace>}'" in notes, notes
    (command,) = [
        line.lstrip("# ").strip() for line in path.read_text().splitlines() if "helm upgrade" in line
    ]
    words = shlex.split(command)
    assert words[:3] == ["helm", "upgrade", RELEASE] and "--reuse-values" in words, command
    sets = {
        words[i + 1].split("=", 1)[0]: words[i + 1].split("=", 1)[1]
        for i, w in enumerate(words)
        if w == "--set"
    }
    values = {"runtime": {"namespaces": sets["runtime.namespaces"].strip("{}").split(",")}}
    objects = render(tmp_path, values)
    assert runtime_accounts(objects) == [(namespace, account)]
    (binding,) = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == namespace]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    assert binding["roleRef"]["name"] == f"{RELEASE}-eagle3-operator-runtime"
