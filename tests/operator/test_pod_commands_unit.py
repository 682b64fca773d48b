"""The commands the operator puts into stage pods: every one parses with the runtime's own
`eagle3` CLI, equals the local pipeline's after the volume mapping, and the trainer's starts
torchrun."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eagle3_api import stage_plan
from eagle3_api.draft_training import DraftTraining
from eagle3_runtime.cli import build_parser
from eagle3_runtime.pipeline.config import load_config
from eagle3_runtime.pipeline.runner import PipelineRunner
from tests.operator import fakes
from tests.operator.test_training_unit import Cluster
from tests.support.cluster import REPO_ROOT


def _stage_commands(**spec) -> list[tuple[list[str], bool]]:
    """(command, whether it is a Job that reports a StageResult) of every runtime pod."""
    cluster = Cluster(fakes.draft_training(**spec))
    plan = cluster.run_to_end()
    assert plan.status["phase"] == "Succeeded"
    commands = []
    for job in cluster.observed.jobs.values():
        command = fakes.command(job)
        if command[0] == "torchrun":
            command = command[command.index("--no-python") + 1 :]
        commands.append((command, True))
    for deployment in cluster.observed.deployments.values():  # the streaming extraction server
        command = deployment["spec"]["template"]["spec"]["containers"][0].get("command") or []
        if command[:1] == ["eagle3"]:
            commands.append((command, False))
    return commands


@pytest.mark.parametrize(
    "spec",
    [
        {"hiddenStates": {"mode": "offline"}},
        {"hiddenStates": {"mode": "online", "layerIds": [1, 2, 3]}, "export": {"quantize": "fp8"}},
        {
            "hiddenStates": {"mode": "streaming"},
            "training": {"steps": 100, "checkpointEvery": 50, "nodes": 2, "gpusPerNode": 4},
            "storage": {"accessModes": ["ReadWriteMany"]},
            "export": {"claimName": "drafts", "format": "speculators", "quantize": "mxfp4"},
        },
        {
            "hiddenStates": {"mode": "offline"},
            "training": {"epochs": 2},
            "draft": {"layers": 2, "initialization": {"from": "checkpoint", "path": "pvc://drafts/head"}},
        },
    ],
    ids=["offline", "online-fp8", "streaming-multinode-mxfp4", "epochs-two-layers-warm-start"],
)
def test_pod_commands_parse_with_the_runtime_cli(spec):
    for command, reports_result in _stage_commands(**spec):
        assert command[0] == "eagle3", command
        argv = command[1:]
        try:
            args = build_parser(argv).parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"`{' '.join(command)}` does not parse with eagle3's CLI") from exc
        assert args.stage == argv[0]
        assert args.result_file == ("/dev/termination-log" if reports_result else None)


# ---- the same commands on a cluster and on one machine ------------------------------------------

EXAMPLES = REPO_ROOT / "examples"
LOCAL_SERVERS = {"target": "http://127.0.0.1:41001", "stream": "http://127.0.0.1:41002"}


def _train_result(training: DraftTraining) -> dict:
    """What the trainer reports: a checkpoint every checkpointEvery steps, and one at the end."""
    steps = training.spec.training.total_steps
    every = training.spec.training.checkpoint_every
    checkpoints = sorted({*range(every, steps + 1, every), steps})
    return {"step": steps, "total_steps": steps, "loss": 1.0, "checkpoints": [str(s) for s in checkpoints]}


def _operator_commands(body: dict, train_metrics: dict) -> list[tuple[list[str], dict[str, str]]]:
    """(command after `eagle3`, mount path -> claim) of every stage Job, in the order the operator
    creates them."""
    cluster = Cluster(body)
    plan = cluster.reconcile()
    for _ in range(20):
        if plan.status["phase"] in ("Succeeded", "Failed"):
            break
        for job in cluster.running_jobs():
            train = job["metadata"]["labels"]["eagle3.ai/stage"] == "train"
            cluster.finish(job, message=fakes.result("train", **train_metrics) if train else None)
        plan = cluster.reconcile()
    assert plan.status["phase"] == "Succeeded", plan.status
    commands = []
    for name in cluster.created:
        pod = cluster.observed.jobs[name]["spec"]["template"]["spec"]
        command = pod["containers"][0]["command"]
        if command[0] == "torchrun":
            command = command[command.index("--no-python") + 1 :]
        assert command[0] == "eagle3" and command[-2:] == ["--result-file", "/dev/termination-log"], command
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["volumes"]
            if "persistentVolumeClaim" in v
        }
        mounted = {
            m["mountPath"]: claims[m["name"]]
            for m in pod["containers"][0]["volumeMounts"]
            if m["name"] in claims
        }
        commands.append((command[1:-2], mounted))
    return commands


def _as_local(
    argv: list[str], mounted: dict[str, str], folders: dict[str, str], urls: dict[str, str]
) -> list[str]:
    """A pod's command with its mounted claims replaced by their local folders (the volume
    mapping of `eagle3 pipeline --volume CLAIM=DIR`) and the Services by local servers."""
    out = []
    for arg in argv:
        for mount_path in sorted(mounted, key=len, reverse=True):
            if arg == mount_path or arg.startswith(mount_path + "/"):
                arg = folders[mounted[mount_path]] + arg[len(mount_path) :]
                break
        out.append(urls.get(arg, arg))
    return out


def _local_volumes(tmp_path, training: DraftTraining) -> dict[str, Path]:
    """A folder per claim the spec reads, holding the files it names."""
    spec = training.spec
    root = tmp_path.resolve() / "volumes"
    files = [(s.claim_name, s.path) for s in [*spec.data.sources, *(spec.evaluation.prompts or [])]]
    for ref in (spec.target.model, spec.draft.initialization.path or ""):
        if ref.startswith("pvc://"):
            claim, _, path = ref.removeprefix("pvc://").partition("/")
            (root / claim / path).mkdir(parents=True, exist_ok=True)
    for claim, path in files:
        (root / claim / path).parent.mkdir(parents=True, exist_ok=True)
        (root / claim / path).write_text('{"prompt": "x"}\n')
    claims = {c for c, _ in files} | {p.name for p in root.iterdir()} | {spec.export.claim_name or ""}
    return {claim: root / claim for claim in claims if claim}


@pytest.mark.parametrize("mode", ["offline", "online", "streaming"])
@pytest.mark.parametrize("example", ["drafttraining-tiny-cpu.yaml", "drafttraining.yaml"])
def test_operator_jobs_and_local_pipeline_run_the_same_commands(example, mode, tmp_path):
    body = yaml.safe_load((EXAMPLES / example).read_text())
    body["metadata"] |= {"namespace": "ml", "uid": "uid-1", "generation": 1}
    body["spec"]["hiddenStates"] = {"mode": mode}
    if mode == "streaming":  # and the export through the quantize stage
        body["spec"]["export"] = {**body["spec"].get("export", {}), "quantize": "fp8"}
    manifest = tmp_path / example
    manifest.write_text(yaml.safe_dump(body))
    training = DraftTraining.model_validate(body)
    volumes = _local_volumes(tmp_path, training)
    # A pod works in the object's own directory of the workspace claim (stage_plan.workspace_path).
    claim_root = tmp_path.resolve() / "ws"
    runner = PipelineRunner(load_config(manifest, volumes), claim_root / stage_plan.workspace_path(training))
    train_metrics = _train_result(training)

    local = []
    for stage in stage_plan.stages(training):
        server = LOCAL_SERVERS.get(stage_plan.server_for(training, stage) or "")
        if stage == "evaluate":
            steps = stage_plan.checkpoints_to_evaluate(training, train_metrics)
            local += [runner.argv(stage, step=step) for step in steps]
        else:
            local.append(runner.argv(stage, server=server))

    name = body["metadata"]["name"]
    folders = {claim: str(folder.resolve()) for claim, folder in volumes.items()}
    folders[stage_plan.workspace_claim(training)] = str(claim_root)
    urls = {f"http://{name}-{server}:8000": url for server, url in LOCAL_SERVERS.items()}
    on_cluster = [
        _as_local(argv, mounted, folders, urls) for argv, mounted in _operator_commands(body, train_metrics)
    ]
    assert on_cluster == local
    assert [argv[0] for argv in local].count("evaluate") == len(
        stage_plan.checkpoints_to_evaluate(training, train_metrics)
    )


# ---- torchrun, as the kubelet and torchrun itself read the trainer's command -------------------


def _pod_of(job: dict, index: int) -> dict:
    """One pod the Job controller would create: Indexed Jobs annotate their completion index."""
    annotations = {}
    if job["spec"].get("completionMode") == "Indexed":
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    metadata = {"name": f"{job['metadata']['name']}-{index}-x", "namespace": "ml", "annotations": annotations}
    return {"metadata": metadata, "spec": job["spec"]["template"]["spec"]}


def _field(pod: dict, path: str) -> str:
    """A Downward API fieldRef as the kubelet resolves it (a missing annotation is empty)."""
    if path.startswith("metadata.annotations['"):
        return pod["metadata"]["annotations"].get(
            path.removeprefix("metadata.annotations['").removesuffix("']"), ""
        )
    return {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"]}[
        path
    ]


def _kubelet_command(pod: dict) -> list[str]:
    """The container's command after the kubelet's `$(VAR)` expansion: a defined variable is
    replaced, an undefined reference stays as written, `$$` is a literal `$`."""
    container = pod["spec"]["containers"][0]
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var.get("valueFrom", {}):
            env[var["name"]] = _field(pod, var["valueFrom"]["fieldRef"]["fieldPath"])

    def expand(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return [re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", expand, arg) for arg in container["command"]]


@pytest.mark.parametrize(("nodes", "gpus"), [(1, 8), (2, 4)])
def test_the_trainer_command_starts_torchrun_on_one_node_and_on_several(nodes, gpus, monkeypatch):
    """`nodes: 1, gpusPerNode: 8` (examples/drafttraining.yaml) gave torchrun `--node-rank=`, which
    it refuses: one pod rendezvouses with itself (--standalone)."""
    from torch.distributed.run import config_from_args, get_args_parser

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torchrun sets it in its own process when missing
    spec = {
        "training": {"steps": 100, "checkpointEvery": 50, "nodes": nodes, "gpusPerNode": gpus},
        "hiddenStates": {"mode": "online"},
        "storage": {"accessModes": ["ReadWriteMany"]},
    }
    cluster = Cluster(fakes.draft_training(**spec))
    cluster.reconcile()
    cluster.reconcile()
    cluster.finish(cluster.observed.jobs["llama-generate"])
    cluster.reconcile()
    job = cluster.observed.jobs["llama-train"]
    for index in range(nodes):
        command = _kubelet_command(_pod_of(job, index))
        assert command[0] == "torchrun", command
        try:
            args = get_args_parser().parse_args(command[1:])
        except SystemExit as exc:
            raise AssertionError(f"torchrun refuses `{' '.join(command)}`") from exc
        config, entrypoint, script_args = config_from_args(args)
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (nodes, nodes, gpus)
        assert (entrypoint, script_args[0]) == ("eagle3", "train") and args.no_python
        if nodes == 1:
            assert args.standalone
        else:
            assert (args.standalone, config.rdzv_configs["rank"]) == (False, index)
            assert config.rdzv_endpoint == "llama-train-0.llama-trainer:29500"
