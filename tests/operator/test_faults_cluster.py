"""A DraftTraining pipeline survives its control plane crashing: the API server, then etcd, are
SIGKILLed while a stage pod runs and started again in place. Afterwards no child was created twice,
no stage ran twice, no result the status held was lost, and the pipeline succeeded
(tests/operator/fault_ledger.py counts them; benchmarks/operator/chaos.py does the same at random
points, with more fault kinds).

The test bed here is its own (control plane and kwok only, no real node): killing the session's
API server would disturb the real node and the tests that follow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operator.fault_ledger import ChildLedger
from tests.operator.harness import (
    STAGE_JOBS,
    OperatorProcess,
    complete_stage,
    draft_training_path,
    install_crds,
    prepare_training_volumes,
    training_body,
    wait_for_phase,
    wait_for_stage_pods,
    wait_stage_succeeded,
)
from tests.support.cluster import LocalCluster

DOWN_S = 2.0  # how long each component stays dead: longer than the operator's watch retries' first backoff


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(gpu_nodes=1, cpu_nodes=1) as cluster:
        install_crds(cluster)
        yield cluster


def _crash(cluster: LocalCluster, component: str) -> None:
    cluster.kill_component(component)
    time.sleep(DOWN_S)
    cluster.restart_component(component)


def test_pipeline_survives_api_server_and_etcd_crashes(own_cluster: LocalCluster, tmp_path: Path) -> None:
    cluster = own_cluster
    ns = cluster.create_namespace(manual=True)
    prepare_training_volumes(cluster, ns)
    operator = OperatorProcess(cluster, [ns], tmp_path / "operator.log").start()
    ledger = ChildLedger(cluster, [ns])
    crashes = {"extract": "kube-apiserver", "evaluate": "etcd"}  # while these stages' pods run
    try:
        with ledger.polling():
            cluster.request("POST", draft_training_path(ns), training_body(ns))
            for stage, suffixes in STAGE_JOBS:
                jobs = [f"llama-{s}" for s in suffixes]
                if stage in crashes:
                    wait_for_stage_pods(cluster, ns, jobs)
                    _crash(cluster, crashes[stage])
                complete_stage(cluster, ns, stage, jobs)
                wait_stage_succeeded(cluster, ns, "llama", stage)
            wait_for_phase(cluster, ns, "llama", "Succeeded")
    except BaseException:
        print(f"--- operator log ---\n{operator.log_tail(150)}")
        raise
    finally:
        operator.stop()
    assert ledger.failed_looks > 0, "no look fell into an outage: the crashes were not seen"
    counts = ledger.training_counts(ns, "llama")
    assert counts == {
        "phase": "Succeeded",
        "duplicated_children": 0,
        "stages_run_twice": 0,
        "lost_results": 0,
        "jobs": sum(len(suffixes) for _, suffixes in STAGE_JOBS),
    }, counts
    assert operator.starts == 1
