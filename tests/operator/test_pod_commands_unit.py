"""Every command the operator puts into a stage pod parses with the runtime's own `eagle3` CLI."""

from __future__ import annotations

import pytest

from eagle3_runtime.cli import build_parser
from tests.operator import fakes
from tests.operator.test_training_unit import Cluster


def _stage_commands(**spec) -> list[tuple[list[str], bool]]:
    """(command, whether it is a Job that reports a StageResult) of every runtime pod."""
    cluster = Cluster(fakes.draft_training(**spec))
    plan = cluster.run_to_end()
    assert plan.status["phase"] == "Succeeded"
    commands = []
    for job in cluster.observed.jobs.values():
        command = job["spec"]["template"]["spec"]["containers"][0]["command"]
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
