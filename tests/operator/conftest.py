"""Fixtures of the operator tests on the test bed: CRDs installed once, an operator per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.operator.harness import OperatorProcess, install_crds
from tests.support.cluster import LocalCluster


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster) -> LocalCluster:
    install_crds(cluster)
    return cluster


@pytest.fixture
def start_operator(
    crds: LocalCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., OperatorProcess]]:
    """Start the operator for the given namespaces (and extra arguments); stopped (and its log shown on failure) afterwards."""
    started: list[OperatorProcess] = []

    def start(*namespaces: str, args: tuple[str, ...] = ()) -> OperatorProcess:
        log = tmp_path / f"operator-{len(started)}.log"
        process = OperatorProcess(crds, list(namespaces), log, args).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for process in started:
            print(f"\n--- operator log {process.log_path} ---\n{process.log_tail(120)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report
