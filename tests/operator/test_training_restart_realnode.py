"""A multi-node training that survives a lost rank, for real: the operator's own Indexed trainer Job
(training.nodes=2, gpusPerNode=1 on the real node's stand-in GPU plugin) runs `eagle3 train` under the
operator's torchrun launcher, two CPU ranks over gloo, on hidden states of the tiny target. After its
first checkpoint the test deletes rank 1's pod (grace 0): the Job fails at once (backoffLimit 0), the
Job controller stops rank 0, the operator starts the whole group again as `llama-train-r1`, and that
group resumes from the last checkpoint and finishes. Its losses after the checkpoint are those of a
plain, uninterrupted torchrun resumed from the same checkpoint, and no step is in the record twice.

The stages before train are played as the kwok tests play them (tests/operator/fakes.py results, pods
on kwok's nodes; the target server too): the test writes the target and the hidden states extract
would write from it (in this process, a second), so no vLLM runs. Kueue is not installed: the test admits
the suspended Jobs itself, and places the trainer Jobs on the real node by injecting its node selector
and toleration at admission, as a Kueue ResourceFlavor does. The workspace is a hostPath volume every
node sees (the test bed's stand-in for the ReadWriteMany claim multi-node training needs).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from eagle3_api.draft_training import DraftTraining
from eagle3_api.stage_plan import checkpoints_to_evaluate
from eagle3_api.workspace import Workspace
from eagle3_runtime.hidden_states import HiddenStateSample, write_samples
from eagle3_runtime.target import OnlineHiddenStates
from eagle3_runtime.train.checkpoint import complete_checkpoints
from eagle3_runtime.train.trainer import METRICS_FILE
from tests.operator import fakes
from tests.operator.harness import (
    admit_like_kueue,
    bind_volume,
    complete_stage,
    draft_training_path,
    events_of,
    items,
    jobs_of,
    prepare_training_volumes,
    stage_record,
    training_body,
    wait_stage_succeeded,
)
from tests.runtime.model.test_model import tiny_target_config
from tests.support import realnode
from tests.support.cluster import LocalCluster, wait_until

LAYER_IDS = [1, 2, 3]  # of the target's 4 layers
VOCAB = 512  # the draft's vocabulary is at least 256 (the CRD's minimum)
STEPS, CHECKPOINT_EVERY = 80, 10  # under 100 steps the CPU trainer runs eager (no compile)
SEQ_LEN = 256
SAMPLES = 24
REAL_NODE_FLAVOR = {
    "nodeSelector": realnode.REAL_NODE_SELECTOR,
    "tolerations": realnode.REAL_NODE_TOLERATIONS,
}
TRAIN_TIMEOUT_S = 300  # a trainer group's start (torch, the target) and its steps, on a shared 2-core machine


def _host_dir(namespace: str, claim: str) -> Path:
    """Where harness.bind_volume's hostPath volume of `claim` lives."""
    return Path(f"/tmp/eagle3-tests/{namespace}/{claim}")


def _write_target_and_states(target: Path, workspace: Workspace) -> None:
    """A small Llama target (random weights: the test compares two runs, it does not measure a draft)
    and what `eagle3 extract --mode offline` writes from it: its states over token samples, the
    second half of each sample loss-masked."""
    torch.manual_seed(0)
    config = tiny_target_config(hidden_size=64, head_dim=16, vocab_size=VOCAB, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(target)
    states = OnlineHiddenStates(str(target), LAYER_IDS)
    generator = torch.Generator().manual_seed(0)

    def samples():
        for _ in range(SAMPLES):
            ids = torch.randint(VOCAB, (SEQ_LEN,), generator=generator)
            yield HiddenStateSample(ids, torch.arange(SEQ_LEN) >= SEQ_LEN // 2, states(ids))

    write_samples(
        workspace.hidden_states_dir,
        samples(),
        layer_ids=LAYER_IDS,
        num_hidden_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
    )


def _losses(workspace: Workspace) -> list[tuple[int, float]]:
    """(step, loss) of every line of the trainer's metrics, in file order."""
    lines = (workspace.reports_dir / METRICS_FILE).read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def _pods(cluster: LocalCluster, ns: str, job: str) -> list[dict[str, Any]]:
    return items(cluster, f"/api/v1/namespaces/{ns}/pods", f"batch.kubernetes.io/job-name={job}")


def _reference_job(train: dict[str, Any], workspace: str) -> dict[str, Any]:
    """The operator's trainer pod, as a plain single-pod torchrun of the same two ranks over the same
    `eagle3 train` command, in its own workspace directory."""
    spec = json.loads(json.dumps(train["spec"]["template"]["spec"]))
    for key in ("subdomain", "hostname", "nodeSelector", "tolerations"):
        spec.pop(key, None)
    (container,) = spec["containers"]
    command = container["command"]
    train_argv = command[command.index("--no-python") + 1 :]
    train_argv[train_argv.index("--workspace") + 1] = workspace
    container["command"] = ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=2", "--no-python"]
    container["command"] += train_argv
    container.pop("resources", None)  # a CPU run; the stand-in GPUs stay free for the group
    spec["terminationGracePeriodSeconds"] = 1
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "reference-train"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "reference-train"}},
                "spec": realnode.on_real_node(spec),
            },
        },
    }


def _job_finished(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any] | None:
    job = cluster.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
    done = {c["type"] for c in (job.get("status") or {}).get("conditions") or [] if c["status"] == "True"}
    if "Failed" in done:
        logs = {
            p["metadata"]["name"]: cluster.kubectl("logs", "-n", ns, p["metadata"]["name"])
            for p in _pods(cluster, ns, name)
        }
        raise AssertionError(f"Job {name} failed: {json.dumps(logs, indent=1)}")
    return job if "Complete" in done else None


@pytest.mark.slow
def test_a_killed_rank_pod_restarts_the_group_which_resumes_exactly(crds, manual_namespace, start_operator):
    cluster, ns = crds, manual_namespace
    try:
        _run(cluster, ns, start_operator)
    finally:
        shutil.rmtree(_host_dir(ns, ""), ignore_errors=True)  # harness.bind_volume's folders


def _run(cluster: LocalCluster, ns: str, start_operator) -> None:
    started = time.monotonic()
    prepare_training_volumes(cluster, ns)
    bind_volume(cluster, ns, "models", create_claim=True)
    models, claim_root = _host_dir(ns, "models"), _host_dir(ns, "llama-workspace")
    claim_root.mkdir(parents=True)
    claim_root.chmod(0o777)  # a hostPath volume gets no fsGroup: the stage pods' uid 1000 writes here

    start_operator(ns)
    body = training_body(
        ns,
        target={"model": "pvc://models/target"},
        hiddenStates={"mode": "offline", "layerIds": LAYER_IDS},
        draft={"vocabSize": 256},
        training={
            "steps": STEPS,
            "checkpointEvery": CHECKPOINT_EVERY,
            "nodes": 2,
            "gpusPerNode": 1,
            "groupRestarts": 1,
            "batchTokens": 2 * SEQ_LEN,  # one row per rank and step
            "seqLen": SEQ_LEN,
            "learningRate": 3e-3,
            # The trainer overlay (where RCCL settings go): one thread per rank, here and in the reference.
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        },
        storage={"accessModes": ["ReadWriteMany"]},
        scheduling={"queueName": "gpu-queue"},
    )
    cluster.request("POST", draft_training_path(ns), body)
    uid = cluster.request("GET", draft_training_path(ns, "llama"))["metadata"]["uid"]
    workspace = Workspace(claim_root / "runs" / uid)

    for stage in ("generate", "extract"):
        admit_like_kueue(cluster, ns, f"llama-{stage}")
        if stage == "extract":
            _write_target_and_states(models / "target", workspace)
            realnode.readable_by_pods(models)
            realnode.readable_by_pods(claim_root)
            for folder in (claim_root, claim_root / "runs", workspace.root):
                folder.chmod(0o777)
        complete_stage(cluster, ns, stage, [f"llama-{stage}"])
        wait_stage_succeeded(cluster, ns, "llama", stage)
    print(f"stages before train played in {time.monotonic() - started:.0f} s")

    # The first group, on the real node; rank 1's pod is deleted once the first checkpoint is written.
    admit_like_kueue(cluster, ns, "llama-train", flavor=REAL_NODE_FLAVOR)
    wait_until(
        lambda: complete_checkpoints(workspace),
        timeout=TRAIN_TIMEOUT_S,
        interval=0.05,
        what="the first group's first checkpoint",
    )
    by_index = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
        for p in _pods(cluster, ns, "llama-train")
    }
    assert {p["spec"]["nodeName"] for p in by_index.values()} == {realnode.NODE_NAME}
    rank1 = by_index["1"]["metadata"]["name"]
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{rank1}", {"gracePeriodSeconds": 0})
    killed_at = time.monotonic()
    print(
        f"rank 1 ({rank1}) deleted {killed_at - started:.0f} s in, checkpoints {complete_checkpoints(workspace)}"
    )

    wait_until(
        lambda: "llama-train-r1" in jobs_of(cluster, ns, "llama"), timeout=60, what="the group's new Job"
    )
    wait_until(lambda: not _pods(cluster, ns, "llama-train"), timeout=60, what="the failed group's pods gone")
    resumed_from = complete_checkpoints(workspace)[-1]
    assert resumed_from < STEPS, f"the first group finished (step {resumed_from}) before its rank was killed"
    first_group = _losses(workspace)
    print(f"first group stopped after step {first_group[-1][0]}; the new group resumes from {resumed_from}")

    # The reference: the same command, a plain torchrun of two ranks in one pod, from a copy of the
    # checkpoint the new group resumes from.
    reference = Workspace(claim_root / "reference")
    shutil.copytree(workspace.hidden_states_dir, reference.hidden_states_dir)
    shutil.copytree(workspace.checkpoint_dir(resumed_from), reference.checkpoint_dir(resumed_from))
    for path in [reference.root, *reference.root.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)
    train = jobs_of(cluster, ns, "llama")["llama-train-r1"]
    cluster.request(
        "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", _reference_job(train, "/workspace/reference")
    )

    admit_like_kueue(cluster, ns, "llama-train-r1", flavor=REAL_NODE_FLAVOR)
    done = wait_stage_succeeded(cluster, ns, "llama", "train", timeout=TRAIN_TIMEOUT_S)
    print(f"group restarted and finished {time.monotonic() - killed_at:.0f} s after the kill")
    wait_until(
        lambda: _job_finished(cluster, ns, "reference-train"),
        timeout=TRAIN_TIMEOUT_S,
        interval=1,
        what="the reference run",
    )
    print(f"test took {time.monotonic() - started:.0f} s")

    # The record: every step once, in order; after the checkpoint, the reference's losses.
    record = _losses(workspace)
    assert [step for step, _ in record] == list(range(1, STEPS + 1)), record
    resumed = dict(record[resumed_from:])
    expected = dict(_losses(reference))
    assert sorted(expected) == list(range(resumed_from + 1, STEPS + 1)), expected
    # Same binaries, data order, world size and thread count, and no randomness after the weights'
    # initialisation (which the checkpoint replaces): the same float operations, so equal to the bit.
    assert resumed == expected
    assert dict(record[:resumed_from]) == dict(first_group[:resumed_from])  # kept as the first group wrote it
    assert record[-1][1] < record[0][1], "the draft did not learn"

    # The status: one group restart, the new Job's result, all checkpoints, the next stage started.
    train_record = stage_record(done, "train")
    assert (train_record["groupRestarts"], train_record["attempt"], train_record["jobs"]) == (
        1,
        1,
        ["llama-train-r1"],
    )
    metrics = train_record["metrics"]
    assert (metrics["step"], metrics["total_steps"]) == (STEPS, STEPS)
    assert metrics["checkpoints"] == [str(s) for s in range(CHECKPOINT_EVERY, STEPS + 1, CHECKPOINT_EVERY)]
    assert metrics["loss"] == pytest.approx(record[-1][1])
    (event,) = [e for e in events_of(cluster, ns, "llama") if e["reason"] == "TrainerGroupRestarted"]
    assert event["type"] == "Warning" and "restart 1 of 1" in event["message"], event["message"]
    evaluations = wait_until(
        lambda: {n for n in jobs_of(cluster, ns, "llama") if n.startswith("llama-eval-")} or None,
        timeout=30,
        what="the evaluate stage's Jobs",
    )
    planned = checkpoints_to_evaluate(DraftTraining.model_validate(done), metrics)
    assert evaluations == {f"llama-eval-{step}" for step in planned}
    group = _pods(cluster, ns, "llama-train-r1")
    assert len(group) == 2 and all(p["status"]["phase"] == "Succeeded" for p in group)
    (container,) = train["spec"]["template"]["spec"]["containers"]
    assert fakes.command(train)[:2] == ["torchrun", "--nnodes=2"]
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in container["env"]  # training.env reached the ranks
