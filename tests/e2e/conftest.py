"""Session fixtures of the end-to-end tests (tests/e2e/tiny_cpu.py says what they do): one chart
install, one DraftTraining of examples/drafttraining-tiny-cpu.yaml, one SpecDecodeDeployment serving
its draft, shared by every test that needs them (one draft per test session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chart.installed import Installation, installed
from tests.e2e.tiny_cpu import ServedDraft, TrainingRun, serve, train
from tests.support.cluster import LocalCluster


@pytest.fixture(scope="session")
def e2e_installation(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    """The chart installed (release e2e, namespaced to its work namespace), operator running. Without
    monitors: the monitoring CRDs are served only inside a test that asks for them (other tests
    expect none), and this installation lives for the whole session."""
    cluster.check_running("installing the chart for the end-to-end tests")
    with installed(
        cluster,
        tmp_path_factory.mktemp("e2e-install"),
        mode="namespaced",
        release="e2e",
        monitoring=False,
        data_claim=False,
    ) as installation:
        yield installation


@pytest.fixture(scope="session")
def tiny_cpu_training(
    request: pytest.FixtureRequest, e2e_installation: Installation, tmp_path_factory: pytest.TempPathFactory
) -> TrainingRun:
    """examples/drafttraining-tiny-cpu.yaml trained by the operator's real pods, to Succeeded."""
    return train(request.config, e2e_installation, tmp_path_factory.mktemp("e2e-data"))


@pytest.fixture(scope="session")
def tiny_cpu_serving(request: pytest.FixtureRequest, tiny_cpu_training: TrainingRun) -> ServedDraft:
    """A SpecDecodeDeployment serving the session's draft on the real node, Available."""
    return serve(request.config, tiny_cpu_training)
