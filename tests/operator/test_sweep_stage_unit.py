"""evaluation.sweep: the DraftTraining runs `eagle3 sweep` between select and export, on GPUs, and
its schedule lands in status.sweep, from where a SpecDecodeDeployment with auto serves it."""

from __future__ import annotations

from eagle3_operator.reconcile.serving import ServingObserved, plan_serving

from tests.operator import fakes
from tests.operator.test_training_unit import Cluster


def test_sweep_runs_after_select_and_its_schedule_reaches_status_and_serving():
    body = fakes.draft_training(
        target={"model": "org/m", "gpus": 2},
        evaluation={"sweep": {"maxSpeculativeTokens": 5, "concurrency": [1, 4, 16]}},
    )
    cluster = Cluster(body)
    status = cluster.run_to_end().status
    assert status["phase"] == "Succeeded", status
    assert [s["name"] for s in status["stages"]][-3:] == ["select", "sweep", "export"]
    container = cluster.observed.jobs["llama-sweep"]["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:8] == ["eagle3", "sweep", "--workspace", "/workspace/runs/uid-1", "--target", "org/m", "--checkpoint", "best"]  # fmt: skip
    assert command[command.index("--max-speculative-tokens") + 1] == "5"
    assert command[command.index("--concurrency") + 1 : command.index("--rounds")] == ["1", "4", "16"]
    assert container["resources"]["limits"] == {"amd.com/gpu": "2"}, "the sweep serves the target itself"
    assert status["sweep"] == {
        "schedule": [[1, 2, 4], [3, 16, 0]],
        "numSpeculativeTokens": 4,
        "best": [
            {"concurrency": c, "numSpeculativeTokens": k, "speedup": s}
            for c, k, s in zip([1, 2, 4, 16], [4, 4, 0, 0], [1.7, 1.4, 1.0, 1.0], strict=True)
        ],
    }
    # A SpecDecodeDeployment of this DraftTraining with numSpeculativeTokens: auto serves that schedule.
    sdd = fakes.spec_decode(numSpeculativeTokens="auto", draft={"fromDraftTraining": "llama"})
    served = plan_serving(sdd, ServingObserved(now=fakes.NOW, draft_training=cluster.body))
    assert served.status["speculation"]["schedule"] == [[1, 2, 4], [3, 16, 0]]
