"""Shared fixtures: one local test bed per test session, a fresh namespace per test.

The test bed (control plane, kwok's fake nodes and one real node: tests/support/cluster.py,
tests/support/realnode.py) starts only when a test first asks for `cluster`. Its component logs
stay in the reported directory when a test failed; otherwise it is removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster

# Every vLLM server the tests start on this machine (not the real node's pods, which keep vLLM's
# default) runs its CPU worker inside the engine process instead of a third process: one import of
# vLLM and torch fewer, about 10 s less per start on 2 cores, some 20 % off the vLLM tests. vLLM
# binds OpenMP threads only in that worker process, which these tiny models do not need; the pods
# of the operator tests, the e2e test and the benchmarks run the default.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The session's test bed: control plane, fake AMD GPU nodes and the real node (binaries built
    on first use, cached)."""
    local = LocalCluster(real_node=True)
    local.start()
    try:
        yield local
    finally:
        failed = request.session.testsfailed > 0
        local.stop(remove_workdir=not failed)
        if failed:
            print(f"\ntest-bed component logs kept in {local.log_dir}")


def _fresh_namespace(cluster: LocalCluster, *, manual: bool = False) -> Iterator[str]:
    cluster.check_running("setting up a test")
    name = cluster.create_namespace(manual=manual)
    yield name
    cluster.delete_namespace(name)


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace; kwok ends the pods of Jobs in it with Succeeded after about a second."""
    yield from _fresh_namespace(cluster)


@pytest.fixture
def manual_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace whose Job pods stay Running until the test calls complete_pod / fail_pod."""
    yield from _fresh_namespace(cluster, manual=True)


@pytest.fixture
def real_node_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace for pods that run on the real node (give them realnode.on_real_node(spec))."""
    yield from _fresh_namespace(cluster)
