"""`helm install` into the test bed; the real operator, with the token of the chart's ServiceAccount,
takes a DraftTraining through every stage and a SpecDecodeDeployment to Available.

Any right the chart forgot fails the test: the pipeline stalls, or the operator logs a refusal. The
stage pods' progress reports are sent with the runtime ServiceAccount's token (the runtime Role).
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from eagle3_api.common import DEFAULT_VLLM_IMAGE
from eagle3_api.draft_training import DEFAULT_RUNTIME_IMAGE
from tests.chart.images import command_problem
from tests.chart.installed import TRAINING_STEPS, installed, run_training, serving_manifest
from tests.operator import fakes
from tests.operator.harness import condition, get, spec_decode_path
from tests.support.cluster import wait_until
from tests.support.prometheus_operator import prometheus_operator_crds

# A refusal carries reason Forbidden (and code 403 in the Status body); a bare "403" would also
# match a log line's milliseconds ("19:54:25,403").
REFUSED = re.compile(r"[Ff]orbidden|\"code\":\s*403\b")


@pytest.mark.parametrize("mode", ["namespaced", "cluster-wide"])
def test_operator_runs_a_training_and_a_deployment_with_the_charts_rbac(mode, cluster, tmp_path):
    with (
        prometheus_operator_crds(cluster),
        installed(cluster, tmp_path, mode=mode, release=f"e3{mode[:2]}") as inst,
    ):
        work, system = inst.work, inst.system
        # NOTES.txt tells the user what to apply next.
        namespace_hint = work if mode == "namespaced" else "<namespace>"
        assert f"kubectl apply -n {namespace_hint} -f examples/drafttraining.yaml" in inst.notes, inst.notes
        assert f"kubectl -n {system} rollout status deployment/{inst.release}-eagle3-operator" in inst.notes
        assert f"Stage pods run as ServiceAccount eagle3-runtime, created in: {work}." in inst.notes
        for kind in ("servicemonitor", "podmonitor", "prometheusrule", "deployment", "service"):
            assert cluster.kubectl("get", kind, "-n", system, "-o", "name").strip(), (
                f"helm installed no {kind}"
            )
        # The kubeconfigs carry no more than the chart's rights.
        assert inst.as_operator.can("create", "jobs", work) and not inst.as_operator.can(
            "list", "secrets", work
        )
        assert inst.as_runtime.can("patch", "pods", work) and not inst.as_runtime.can("create", "pods", work)

        cluster.apply(serving_manifest("serve", "train"), namespace=work)
        status = run_training(inst, "train")
        assert [s["name"] for s in status["stages"]] == fakes.OFFLINE_STAGES
        assert all(s["state"] == "Succeeded" for s in status["stages"])
        assert [c["step"] for c in status["checkpoints"]] == [20, 40]
        best = fakes.acceptance_at(TRAINING_STEPS, TRAINING_STEPS)
        chosen = status["bestCheckpoint"]
        assert (chosen["step"], chosen["acceptanceLength"]) == (TRAINING_STEPS, best)
        lengths = [c["contextLength"] for c in chosen["acceptanceByContextLength"]]
        assert lengths == fakes.CONTEXT_LENGTHS + fakes.UNFILLED_CONTEXT_LENGTHS

        def available() -> dict[str, Any] | None:
            body = get(cluster, spec_decode_path(work, "serve")) or {}
            # The target serves before the draft rolls in: wait for both, and for the roll-in's
            # rolling update to finish (the old and the new pod are both ready during it).
            ready = all(condition(body, c).get("status") == "True" for c in ("Available", "DraftResolved"))
            rolled_out = condition(body, "Progressing").get("reason") == "RolloutComplete"
            return body if ready and rolled_out else None

        serving = wait_until(
            available,
            timeout=120,
            interval=0.5,
            what="SpecDecodeDeployment Available with the draft rolled out",
        )
        assert condition(serving, "DraftResolved").get("status") == "True"
        assert serving["status"]["readyReplicas"] == 1
        # Every pod command the operator wrote runs in the image it names.
        jobs = json.loads(cluster.kubectl("get", "jobs", "-n", work, "-o", "json"))["items"]
        deployments = json.loads(cluster.kubectl("get", "deployments", "-n", work, "-o", "json"))["items"]
        assert len(jobs) == 7  # generate, extract, train, 2 x evaluate, select, export
        for obj in jobs + deployments:
            for container in obj["spec"]["template"]["spec"]["containers"]:
                problem = command_problem(container["command"])
                assert problem is None, f"{obj['metadata']['name']}: {container['command']}: {problem}"
                vllm = container["command"][0] == "vllm"
                assert container["image"] == (DEFAULT_VLLM_IMAGE if vllm else DEFAULT_RUNTIME_IMAGE)
        # The operator made the SpecDecodeDeployment's ServiceMonitor with the chart's rights.
        assert cluster.kubectl("get", "servicemonitor", "serve", "-n", work, "-o", "name").strip()

        url = f"http://127.0.0.1:{inst.operator.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            metrics = response.read().decode()
        assert (
            f'eagle3_draft_training_best_acceptance_length{{name="train",namespace="{work}"}} {best}'
            in metrics
        )
        # One series per measured context length (the dashboard's bars); none for the unfilled one.
        by_context_series = [
            line
            for line in metrics.splitlines()
            if line.startswith("eagle3_draft_training_best_acceptance_length_by_context_length{")
            and f'namespace="{work}"' in line
        ]
        assert sorted(re.findall(r'context_length="(\d+)"', "\n".join(by_context_series))) == ["1024", "2048"]
        refused = [line for line in inst.operator.log_path.read_text().splitlines() if REFUSED.search(line)]
        assert not refused, "the operator was refused:\n" + "\n".join(refused[:20])
