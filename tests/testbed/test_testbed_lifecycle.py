"""Starting and stopping the test bed leaves nothing behind: no process, no listening port, no temp dir.

These tests start their own control planes next to the session's one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cluster as cluster_module
from tests.support.cluster import REPO_ROOT, ClusterError, LocalCluster, find_bin_dir, wait_until


def process_group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def listening(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return False
    return True


def children_of(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def test_crashed_component_is_reported_and_stop_after_a_failure_leaves_nothing_behind():
    with (
        pytest.raises(RuntimeError, match="test body failed"),
        LocalCluster(gpu_nodes=1, cpu_nodes=1) as cluster,
    ):
        pids, ports, workdir = cluster.pids, cluster.ports, cluster.workdir
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
        assert all(process_group_alive(pid) for pid in pids.values())
        assert listening(ports["apiserver"]) and listening(ports["etcd"])
        cluster.check_running()

        os.killpg(pids["kube-scheduler"], signal.SIGKILL)

        def crash_report() -> str | None:
            try:
                cluster.check_running("testing")
            except ClusterError as error:
                return str(error)
            return None

        report = wait_until(crash_report, timeout=10, what="the crash to be noticed")
        assert report.startswith("kube-scheduler exited with code -9 while testing; log ")
        raise RuntimeError("test body failed")

    assert [name for name, pid in pids.items() if process_group_alive(pid)] == []
    assert [name for name, port in ports.items() if listening(port)] == []
    assert not workdir.exists()


def test_port_taken_between_pick_and_bind_is_picked_again(monkeypatch):
    # Another process grabs the port picked for etcd before etcd binds it (forced here, a race in life).
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        pick_free_port = cluster_module.free_port
        monkeypatch.setattr(cluster_module, "free_port", lambda: next(picks, None) or pick_free_port())

        with LocalCluster(gpu_nodes=1, cpu_nodes=0) as cluster:
            assert cluster.ports["etcd"] != taken
            assert cluster.request("GET", "/api/v1/nodes/gpu-node-0")["metadata"]["name"] == "gpu-node-0"


def test_component_that_fails_to_start_is_reported_with_its_log_and_the_rest_is_stopped(tmp_path):
    # A deliberately broken kube-apiserver (the only stand-in here) next to the real other binaries.
    real = find_bin_dir()
    broken = tmp_path / "bin"
    broken.mkdir()
    for binary in real.iterdir():
        (broken / binary.name).symlink_to(binary)
    (broken / "kube-apiserver").unlink()
    (broken / "kube-apiserver").write_text(
        "#!/bin/sh\necho 'error: flag provided but not defined' >&2\nexit 3\n"
    )
    (broken / "kube-apiserver").chmod(0o755)
    cluster = LocalCluster(gpu_nodes=1, cpu_nodes=0, bin_dir=broken, workdir=tmp_path / "bed")
    children_before = set(children_of(os.getpid()))

    with pytest.raises(ClusterError) as failure:
        cluster.start(timeout=60)

    log = tmp_path / "bed" / "logs" / "kube-apiserver.log"
    assert f"kube-apiserver exited with code 3 while waiting for kube-apiserver /readyz; log {log}" in str(
        failure.value
    )
    assert "flag provided but not defined" in str(failure.value)
    assert log.exists(), "logs are kept after a failed start"
    assert set(children_of(os.getpid())) <= children_before, "etcd must be stopped again"
    assert not listening(cluster.ports["etcd"])


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_make_cluster_entry_point_prints_the_kubeconfig_and_stops_cleanly(stop_signal):
    bed = subprocess.Popen(
        [sys.executable, "-m", "tests.support.cluster", "--gpu-nodes", "1", "--cpu-nodes", "1"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    kubeconfig = None
    try:
        output = []
        for line in bed.stdout:
            output.append(line)
            if line.startswith("kubeconfig: "):
                kubeconfig = Path(line.split(": ", 1)[1].strip())
            if "Ctrl-C stops it" in line:
                break
        assert kubeconfig and "kubectl get nodes" in "".join(output), "".join(output)
        components = children_of(bed.pid)
        assert len(components) == 5, "".join(output)

        nodes = subprocess.run(
            [str(find_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(nodes) == ["node/cpu-node-0", "node/gpu-node-0"]

        bed.send_signal(stop_signal)
        assert bed.wait(timeout=30) == 0
    finally:
        if bed.poll() is None:
            bed.kill()
            bed.wait()
    assert "test bed stopped." in bed.stdout.read()
    assert [pid for pid in components if process_group_alive(pid)] == []
    assert not kubeconfig.parent.exists()
