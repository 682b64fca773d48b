"""`kubectl apply` trains and serves for real (tests/e2e/tiny_cpu.py: the run and its test-bed patch).

Every stage of examples/drafttraining-tiny-cpu.yaml runs as the operator's own pods on the test bed's
real node: the target vLLM Deployment, the generate, extract, train and evaluate Jobs (evaluators
serve checkpoints in real vLLM), select and export. The operator reads the results those stages
wrote; the draft is then served by a SpecDecodeDeployment and answers through its Service. The one
stand-in is the real node's GPU device plugin (no GPU here; see tests/testbed/test_real_node.py).
"""

from __future__ import annotations

import json

import pytest
import yaml

from eagle3_api.draft_training import DraftTraining
from eagle3_api.stage_plan import checkpoints_to_evaluate
from eagle3_api.workspace import Workspace
from tests.e2e.tiny_cpu import EXAMPLE, SERVED_MODEL, ServedDraft, TrainingRun, run_in_pod, say
from tests.support import realnode

ACCEPTANCE_BAR = 2.8  # the end-to-end bar; docs/benchmarks.md has the spread across machines


def evaluation_summary(run: TrainingRun) -> str:
    """Per checkpoint: step, acceptance, per position, per domain (from the evaluate pods' own report
    files in the workspace volume), speedup."""
    lines = [f"evaluation of {run.name} on the real node (namespace {run.namespace}):"]
    workspace = Workspace(run.workspace / run.status["workspacePath"])  # the run's own directory of the claim
    for checkpoint in run.status["checkpoints"]:
        step = checkpoint["step"]
        report = json.loads(workspace.evaluation_file(step).read_text())
        domains = ", ".join(
            f"{d} {v['acceptance_length']:.2f}" for d, v in sorted(report["per_domain"].items())
        )
        positions = ", ".join(f"{p:.2f}" for p in checkpoint["acceptancePerPosition"])
        speedup = checkpoint.get("speedup")
        lines.append(
            f"  step {step:4d}: acceptance length {checkpoint['acceptanceLength']:.3f}; per position {positions}; "
            f"per domain {domains}; speedup {'n/a' if speedup is None else f'{speedup:.2f}'}"
        )
    best = run.status["bestCheckpoint"]
    lines.append(f"  best: step {best['step']}, acceptance length {best['acceptanceLength']:.3f}")
    lines.append(f"  exported: {run.status['export']['uri']}; DraftTraining took {run.seconds:.0f} s")
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(6600)  # the session training included (tiny_cpu.TRAINING_TIMEOUT_S)
def test_kubectl_apply_trains_a_draft_with_real_pods(request, tiny_cpu_training: TrainingRun):
    run, status = tiny_cpu_training, tiny_cpu_training.status
    cluster = run.installation.as_runtime.cluster
    say(request.config, evaluation_summary(run))

    # `kubectl get dt` moved while it ran: phase, stage, training step and best acceptance.
    seen = {name: [row[name] for row in run.columns] for name in ("PHASE", "STAGE", "STEP", "BEST-AL")}
    assert {"Running", "Succeeded"} <= set(seen["PHASE"]), run.rows
    assert {"generate", "train", "evaluate"} <= set(seen["STAGE"]), run.rows
    steps = {
        int(s)
        for s, stage in zip(seen["STEP"], seen["STAGE"], strict=True)
        if stage == "train" and s.isdigit()
    }
    assert len(steps) >= 2, f"the training step never moved in kubectl get dt: {run.rows}"
    assert seen["BEST-AL"][0] == "" and float(seen["BEST-AL"][-1]) >= ACCEPTANCE_BAR, run.rows

    # Every stage finished, and its results are the ones the real stages wrote.
    assert {s["name"]: s["state"] for s in status["stages"]} == dict.fromkeys(
        ("generate", "extract", "train", "evaluate", "select", "export"), "Succeeded"
    ), status["stages"]
    spec = DraftTraining.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    metrics = {s["name"]: s["metrics"] for s in status["stages"]}
    assert metrics["generate"]["samples"] == spec.spec.data.num_samples
    assert metrics["train"]["step"] == spec.spec.training.steps
    evaluated = [c["step"] for c in status["checkpoints"]]
    # The first checkpoint and the last, as the one plan (eagle3_api.stage_plan) says.
    assert evaluated == checkpoints_to_evaluate(spec, metrics["train"]), evaluated
    assert evaluated[0] == spec.spec.training.checkpoint_every and evaluated[-1] == spec.spec.training.steps
    for checkpoint in status["checkpoints"]:
        assert len(checkpoint["acceptancePerPosition"]) == spec.spec.evaluation.num_speculative_tokens
        assert 1.0 <= checkpoint["acceptanceLength"] <= 1 + spec.spec.evaluation.num_speculative_tokens
    best = status["bestCheckpoint"]
    assert best["acceptanceLength"] == max(c["acceptanceLength"] for c in status["checkpoints"])
    assert best["acceptanceLength"] >= ACCEPTANCE_BAR, evaluation_summary(run)
    # The example exports into its workspace claim: the draft is on the volume, where status says.
    export = status["export"]
    assert export["claimName"] == status["workspaceClaim"], export
    assert (run.workspace / export["path"] / "config.json").is_file(), export

    # The stage pods ran on the real node.
    pods = cluster.request("GET", f"/api/v1/namespaces/{run.namespace}/pods")["items"]
    stage_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get("eagle3.ai/stage")]
    assert {p["metadata"]["labels"]["eagle3.ai/stage"] for p in stage_pods} >= {
        "generate",
        "train",
        "evaluate",
    }
    assert {p["spec"]["nodeName"] for p in stage_pods} == {realnode.NODE_NAME}


COMPLETION = """
import json, sys, urllib.request
for base in sys.argv[1:]:
    body = json.dumps({"model": "%s", "prompt": "def fibonacci(n):", "max_tokens": 32, "temperature": 0})
    request = urllib.request.Request(base + "/v1/completions", body.encode(), {"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(request, timeout=120))
    metrics = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    drafts = [l for l in metrics.splitlines() if l.startswith("vllm:spec_decode_num_drafts_total")]
    print(json.dumps({"base": base, "text": answer["choices"][0]["text"], "usage": answer["usage"], "drafts": drafts}))
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_specdecodedeployment_serves_the_exported_draft(request, tiny_cpu_serving: ServedDraft):
    served = tiny_cpu_serving
    cluster, namespace = served.training.installation.as_runtime.cluster, served.namespace
    export = served.training.status["export"]

    # It serves the exported draft: resolved from the DraftTraining's status, in the pod's vLLM args.
    resolved = served.status["resolvedDraft"]
    assert resolved["uri"] == export["uri"] and resolved["source"] == f"DraftTraining/{served.training.name}"
    pods = cluster.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector={served.status['selector']}"
    )["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert running and all(p["spec"]["nodeName"] == realnode.NODE_NAME for p in running), pods
    args = running[0]["spec"]["containers"][0]["args"] + running[0]["spec"]["containers"][0].get(
        "command", []
    )
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["method"] == "eagle3" and config["model"] == resolved["model"], config

    # A completion through the Service, by ClusterIP and by DNS name, from a pod on the real node.
    bases = [f"http://{served.cluster_ip}:{served.port}", f"http://{served.dns_name}:{served.port}"]
    logs = run_in_pod(cluster, namespace, "completion-client", COMPLETION % SERVED_MODEL, args=bases)
    answers = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    say(
        request.config, "[e2e] completions through the Service:\n" + "\n".join(json.dumps(a) for a in answers)
    )
    assert [a["base"] for a in answers] == bases, logs
    for answer in answers:
        assert answer["usage"]["completion_tokens"] > 0 and answer["text"], answer
        # Speculative decoding with the draft ran: vLLM counted drafts.
        (drafts,) = answer["drafts"]
        assert float(drafts.split()[-1]) > 0, answer
