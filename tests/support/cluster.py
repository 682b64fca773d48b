"""A real Kubernetes control plane on this machine, with fake AMD GPU nodes and optionally one real
node, for tests and `make cluster`.

What runs (binaries built from pinned Go modules by hack/build-testbed.sh):
  etcd, kube-apiserver (own CA, TLS client certificates, RBAC + Node authorization, service-account
  token signing, default admission plugins), kube-controller-manager (the workload controllers in
  CONTROLLERS, each with its own service account), kube-scheduler, and kwok, which stands in for the
  kubelets of the fake nodes (tests/support/testbed_kwok.py: the nodes and the pod lifecycle).
With real_node=True also a real worker node (tests/support/realnode.py: kubelet, containerd,
kube-proxy, CoreDNS, a stand-in GPU device plugin; binaries from hack/build-node.sh) in
namespaces of its own. The API server then binds the host end of the node's link
(a local address, not loopback) so pods reach it through the `kubernetes` Service.
Every other component listens on 127.0.0.1 ports picked at start; each runs in its own process
group and logs to <workdir>/logs/<component>.log; a start failure names the log to read.

API (stable; other test suites build on it):

    with LocalCluster() as cluster:          # or the session-scoped `cluster` fixture (tests/conftest.py)
        cluster.kubeconfig                   # Path of the admin kubeconfig (system:masters)
        cluster.server                       # "https://127.0.0.1:<port>" (the node link's host address
                                             #   with real_node=True)
        cluster.ca_file                      # Path of the CA that signed the API server's certificate
        cluster.bin_dir                      # Path with kubectl, helm, kube-apiserver, ...
        cluster.env()                        # os.environ + KUBECONFIG + bin_dir first on PATH
        cluster.api_client(token=None)       # new kubernetes.client.ApiClient (admin, or bearer token)
        cluster.kubectl("get", "nodes", "-o", "json")   # stdout; raises KubectlError on failure
        cluster.request("GET", "/api/v1/nodes")          # admin REST call -> dict; raises ApiError
        cluster.apply(manifest_dict_or_yaml, namespace=None)
        cluster.create_namespace(manual=False)          # -> name; waits for its default ServiceAccount
        cluster.delete_namespace(name, wait=False)
        cluster.service_account_token(namespace, name)  # TokenRequest API
        cluster.complete_pod(namespace, pod, message="...")             # -> Succeeded, exit code 0
        cluster.fail_pod(namespace, pod, message="...", exit_code=1)    # -> Failed
        cluster.gpu_nodes, cluster.cpu_nodes # node names
        testbed_kwok.STORAGE_CLASS           # "fake-local": claims of this class get a volume
        cluster.real_node                    # realnode.RealNode with real_node=True, else None
        cluster.log_dir                      # component logs
        cluster.check_running()              # ClusterError (with log tail) if a component died
        cluster.pids, cluster.ports          # component process ids, loopback ports
        cluster.kill_component("etcd")       # SIGKILL it (a crash); "kube-apiserver", any component
        cluster.restart_component("etcd")    # start it again in place (same command line: ports, data
                                             #   dir, certificates), wait until etcd / the API server is healthy
        cluster.start_timings                # seconds from start() to each readiness step
    wait_until(predicate, timeout=..., interval=..., what="...")       # polling helper

complete_pod / fail_pod write what a kubelet would: phase, Ready=False and a terminated state whose
`message` is the container's termination message. They only accept pods kwok will not end itself:
pods no Job owns, and Job pods that are *manual* (namespace from create_namespace(manual=True), or
label testbed_kwok.MANUAL_LABEL=true). Other Job pods kwok ends with Succeeded after about 1 s.

The API helpers live in tests/support/kube_api.py (`KubeApi`, which LocalCluster is); this module
starts, watches and stops the processes.

Run `python -m tests.support.cluster --real-node` (what `make cluster` does) to keep one up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle3_runtime.vllm_server import free_port
from tests.support import realnode, testbed_kwok, testbed_pki
from tests.support.kube_api import ApiError, KubeApi, KubectlError, open_local, wait_until

# Tests import the API helpers from here, with the cluster (this module's docstring is their index).
__all__ = [
    "REPO_ROOT",
    "ApiError",
    "ClusterError",
    "KubectlError",
    "LocalCluster",
    "find_bin_dir",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-testbed.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "helm")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0
PORT_ATTEMPTS = 3
FRONT_PROXY_CLIENT = "front-proxy-client"

# The controllers workloads on this test bed rely on; fewer than the default set, because each one
# adds start-up time on a small machine (no cloud, HPA, DRA, CSR, or storage-migration controllers).
CONTROLLERS = (
    "clusterrole-aggregation-controller",
    "cronjob-controller",
    "daemonset-controller",
    "deployment-controller",
    "disruption-controller",
    # Endpoints (besides EndpointSlices): the API server's service proxy and Prometheus's
    # `role: endpoints` discovery read them.
    "endpoints-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "job-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "pod-garbage-collector-controller",
    "replicaset-controller",
    "resourcequota-controller",
    "root-ca-certificate-publisher-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "statefulset-controller",
    "taint-eviction-controller",
    "ttl-after-finished-controller",
)


class ClusterError(RuntimeError):
    """The test bed could not start, or a component of it died."""


def find_bin_dir(
    env_var: str = "EAGLE3_TESTBED_BIN", script: Path = BUILD_SCRIPT, binaries: tuple[str, ...] = BINARIES
) -> Path:
    """The directory with built binaries: $env_var, else built (cached) by the script, which prints it."""
    configured = os.environ.get(env_var)
    if configured:
        bin_dir = Path(configured)
    else:
        result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise ClusterError(f"{script} failed with exit code {result.returncode} (its log is above)")
        bin_dir = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in binaries if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ClusterError(f"binaries {missing} missing in {bin_dir}; run {script}")
    return bin_dir


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the Python process is killed hard (SIGKILL), the kernel
    # sends SIGKILL to the component too, so no stray control plane survives a crashed test run.
    # (The kernel ties this to the starting *thread*: start a LocalCluster from a long-lived one.)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Component:
    name: str
    process: subprocess.Popen
    log: Path
    # What started it, to start it again in place (restart_component).
    args: list[str]
    env: dict[str, str] | None

    def log_tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(text[-lines:])


class LocalCluster(KubeApi):
    """The local control plane; use as a context manager (start on enter, stop on exit)."""

    def __init__(
        self,
        *,
        gpu_nodes: int = 3,
        cpu_nodes: int = 2,
        bin_dir: Path | None = None,
        workdir: Path | None = None,
        real_node: bool = False,
    ) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        # Checked (root, binaries) before anything starts; started in start().
        self.real_node = (
            realnode.RealNode(find_bin_dir(realnode.BIN_ENV, realnode.BUILD_SCRIPT, realnode.BINARIES))
            if real_node
            else None
        )
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="eagle3-testbed-"))
        self.log_dir = self.workdir / "logs"
        self.gpu_nodes = [f"gpu-node-{i}" for i in range(gpu_nodes)]
        self.cpu_nodes = [f"cpu-node-{i}" for i in range(cpu_nodes)]
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ca_file = self.workdir / "pki" / "ca.crt"
        self.server = ""
        self.ports: dict[str, int] = {}
        self._components: list[_Component] = []
        self._stopped: dict[str, _Component] = {}  # killed by kill_component, by name
        self._admin_ssl: ssl.SSLContext | None = None
        self._started_at = 0.0
        # Seconds from start() until each readiness check passed, in order (for benchmarks).
        self.start_timings: dict[str, float] = {}

    # ---- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start everything and wait until it is usable; on failure stop it all and keep the logs."""
        atexit.register(self.stop)
        self._started_at = time.monotonic()
        deadline = self._started_at + timeout
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start(deadline)
                return
            except ClusterError as error:
                self.stop(remove_workdir=False)
                # A port picked free can be taken by another process before the component binds it.
                if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                    raise
                for leftover in ("pki", "etcd", "logs", "node"):
                    shutil.rmtree(self.workdir / leftover, ignore_errors=True)
                atexit.register(self.stop)
            except BaseException:
                self.stop(remove_workdir=False)
                raise

    def stop(self, *, remove_workdir: bool = True) -> None:
        """Stop every component: clients, the API server, the real node, etcd; idempotent.

        Each tier gets SIGTERM and STOP_GRACE_S to exit, then SIGKILL (to its whole process group).
        """
        atexit.unregister(self.stop)
        components, self._components = self._components, []
        # The real node after the API server: the server's connections to the node and its pods
        # then close while the node still answers.
        node = realnode.COMPONENTS if self.real_node is not None else ()
        tiers = [
            [c for c in components if c.name not in ("kube-apiserver", "etcd", *node)],
            [c for c in components if c.name == "kube-apiserver"],
            [c for c in components if c.name in node],
            [c for c in components if c.name == "etcd"],
        ]
        if self.real_node is not None:
            self.real_node.stop_provisioner()  # it calls the API server
        for tier in tiers:
            for component in tier:
                self._signal(component, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for component in tier:
                try:
                    component.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._signal(component, signal.SIGKILL)
                    component.process.wait()
                # The group may hold children of the component; none may outlive it.
                self._signal(component, signal.SIGKILL)
        if self.real_node is not None:
            # The node's processes are gone with its namespace holder; what is left is cgroups.
            self.real_node.cleanup()
        if remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each running component (its process group id too)."""
        return {c.name: c.process.pid for c in self._components}

    @staticmethod
    def _signal(component: _Component, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(component.process.pid, sig)

    def _start(self, deadline: float) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        pki_dir = self.workdir / "pki"
        pki_dir.mkdir()
        ca = testbed_pki.CertificateAuthority(pki_dir)
        api_host = "127.0.0.1"
        if self.real_node is not None:
            self.real_node.prepare(self.workdir / "node", self._spawn)
            api_host = self.real_node.api_host
        serving_hosts = tuple(dict.fromkeys((*testbed_pki.API_SERVER_HOSTS, api_host)))
        serving = ca.issue("apiserver", "kube-apiserver", server_hosts=serving_hosts)
        sa_keys = testbed_pki.write_service_account_keys(pki_dir)
        front_proxy_ca = testbed_pki.CertificateAuthority(pki_dir, "front-proxy-ca", "front-proxy-ca")
        front_proxy = front_proxy_ca.issue("front-proxy-client", FRONT_PROXY_CLIENT)
        clients = {
            "admin": ca.issue("admin", "eagle3-testbed-admin", organization="system:masters"),
            "controller-manager": ca.issue("controller-manager", "system:kube-controller-manager"),
            "scheduler": ca.issue("scheduler", "system:kube-scheduler"),
            # kwok plays the kubelet of many nodes at once, so it gets full rights.
            "kwok": ca.issue("kwok", "kwok", organization="system:masters"),
        }
        self.ports = {
            name: free_port()
            for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        self.server = f"https://{api_host}:{self.ports['apiserver']}"
        kubeconfigs = testbed_pki.write_kubeconfigs(
            self.workdir, server=self.server, ca=ca.pair.cert, clients=clients
        )
        self.kubeconfig = kubeconfigs["admin"]
        self._admin_ssl = ssl.create_default_context(cafile=str(ca.pair.cert))
        self._admin_ssl.load_cert_chain(str(clients["admin"].cert), str(clients["admin"].key))

        self._start_etcd()
        self._wait(deadline, "etcd to report healthy", self._etcd_healthy)
        kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver", organization="system:masters")
        self._start_apiserver(ca.pair, serving, sa_keys, front_proxy_ca.pair, front_proxy, kubelet_client)
        self._wait(deadline, "kube-apiserver /readyz", lambda: self._get_ok(f"{self.server}/readyz"))
        self._start_controller_manager(kubeconfigs["controller-manager"], ca.pair, sa_keys)
        self._start_scheduler(kubeconfigs["scheduler"])
        self._start_kwok(kubeconfigs["kwok"])
        self._create_nodes_and_storage()
        insecure = ssl._create_unverified_context()  # their serving certs are self-signed at start
        for name in ("controller-manager", "scheduler"):
            url = f"https://127.0.0.1:{self.ports[name]}/healthz"
            self._wait(deadline, f"kube-{name} /healthz", lambda url=url: self._get_ok(url, insecure))
        self._wait(deadline, "all fake nodes Ready and schedulable", self._nodes_schedulable)
        self._wait(deadline, "the default ServiceAccount", lambda: self._default_service_account("default"))
        if self.real_node is not None:
            node = self.real_node
            node.start(self, self._spawn, lambda what, ready: self._wait(deadline, what, ready), ca)
            self._wait(deadline, "the real node Ready with its GPUs, CoreDNS Ready", lambda: node.ready(self))

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str] | None = None, *, log_mode: str = "wb"
    ) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        with log.open(log_mode) as out:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._components.append(_Component(name, process, log, args, env))
        return process

    # ---- faults ----------------------------------------------------------------------------------

    def kill_component(self, name: str) -> None:
        """SIGKILL a component's process group, as a crash would (no graceful shutdown); it stays down
        until restart_component(name)."""
        component = self._component(name)
        self._signal(component, signal.SIGKILL)
        component.process.wait()
        self._components.remove(component)
        self._stopped[name] = component

    def restart_component(self, name: str, timeout: float = START_TIMEOUT_S) -> None:
        """Start a component again with the command line it had (same ports, data dir, certificates),
        its log appended to, killing it first if it runs; wait until it is healthy (etcd, the API
        server) or, for the others, until it has not exited. Call it from a long-lived thread (see
        _die_with_parent)."""
        if name not in self._stopped:
            self.kill_component(name)
        old = self._stopped.pop(name)
        with old.log.open("ab") as log:
            log.write(f"\n===== restarted by the test bed at {time.strftime('%H:%M:%S')} =====\n".encode())
        self._spawn(name, old.args, old.env, log_mode="ab")
        ready = {
            "etcd": self._etcd_healthy,
            "kube-apiserver": lambda: self._get_ok(f"{self.server}/readyz"),
        }.get(name, lambda: True)

        def healthy() -> object:
            self.check_running(f"restarting {name}")
            return ready()

        wait_until(healthy, timeout=timeout, interval=0.05, what=f"{name} to be healthy again")

    def _component(self, name: str) -> _Component:
        found = [c for c in self._components if c.name == name]
        if not found:
            raise ClusterError(f"no running component {name!r}; running: {sorted(self.pids)}")
        return found[0]

    def check_running(self, doing: str = "running") -> None:
        """Raise ClusterError naming the first component that has exited, with its log's last lines."""
        for component in self._components:
            code = component.process.poll()
            if code is not None:
                raise ClusterError(
                    f"{component.name} exited with code {code} while {doing}; "
                    f"log {component.log}:\n{component.log_tail()}"
                )

    def _wait(self, deadline: float, what: str, ready: Callable[[], object]) -> None:
        while True:
            self.check_running(f"waiting for {what}")
            if ready():
                self.start_timings[what] = time.monotonic() - self._started_at
                return
            if time.monotonic() > deadline:
                logs = ", ".join(str(c.log) for c in self._components)
                raise ClusterError(f"timed out waiting for {what}; component logs: {logs}")
            time.sleep(0.05)

    def _get_ok(self, url: str, context: ssl.SSLContext | None = None) -> bool:
        try:
            with open_local(url, context or self._admin_ssl, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    # ---- components ------------------------------------------------------------------------------

    def _binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                self._binary("etcd"),
                "--name=testbed",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testbed={peer}",
                "--quota-backend-bytes=1073741824",
                # A test bed loses nothing of value in a crash; fsync would only slow every write.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _etcd_healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.ports['etcd']}/health"
            with open_local(url, None, timeout=2) as response:
                return json.load(response).get("health") == "true"
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return False

    def _start_apiserver(
        self,
        ca: testbed_pki.KeyPair,
        serving: testbed_pki.KeyPair,
        sa_keys: testbed_pki.KeyPair,
        front_proxy_ca: testbed_pki.KeyPair,
        front_proxy: testbed_pki.KeyPair,
        kubelet_client: testbed_pki.KeyPair,
    ) -> None:
        host = urllib.parse.urlsplit(self.server).hostname
        if self.real_node is None:
            # Endpoints may not hold loopback addresses, so the "kubernetes" Service gets none
            # (no pod runs here to use it) instead of a failed reconcile every 10 s.
            endpoints = ["--endpoint-reconciler-type=none"]
        else:
            # The real node's pods reach the API server at its address through the Service.
            endpoints = ["--endpoint-reconciler-type=lease", "--shutdown-delay-duration=1s"]
        self._spawn(
            "kube-apiserver",
            [
                self._binary("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={self.ports['apiserver']}",
                f"--cert-dir={self.workdir / 'apiserver'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={sa_keys.cert}",
                f"--service-account-signing-key-file={sa_keys.key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                *endpoints,
                # Logs, exec and port-forward go to the kubelet with this identity; its serving
                # certificate is checked against the cluster CA.
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={ca.cert}",
                "--kubelet-preferred-address-types=InternalIP",
                # The request-header (front-proxy) CA that aggregated API servers and the
                # controller-manager / scheduler read from extension-apiserver-authentication.
                f"--requestheader-client-ca-file={front_proxy_ca.cert}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={front_proxy.cert}",
                f"--proxy-client-key-file={front_proxy.key}",
                "--allow-privileged=true",
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",  # as on OpenShift
                "--profiling=false",
                "--event-ttl=30m",
            ],
        )

    def _start_controller_manager(
        self, kubeconfig: Path, ca: testbed_pki.KeyPair, sa_keys: testbed_pki.KeyPair
    ) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                self._binary("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                f"--cert-dir={self.workdir / 'controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={sa_keys.key}",
                f"--root-ca-file={ca.cert}",
                f"--cluster-signing-cert-file={ca.cert}",
                f"--cluster-signing-key-file={ca.key}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--profiling=false",
            ],
        )

    def _start_scheduler(self, kubeconfig: Path) -> None:
        self._spawn(
            "kube-scheduler",
            [
                self._binary("kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={self.workdir / 'scheduler'}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )

    def _start_kwok(self, kubeconfig: Path) -> None:
        config = self.workdir / "kwok.yaml"
        config.write_text(testbed_kwok.config_yaml())
        key, value = testbed_kwok.FAKE_NODE_ANNOTATION
        self._spawn(
            "kwok",
            [
                self._binary("kwok"),
                f"--kubeconfig={kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                "--cidr=10.244.0.0/16",
                # The kwok nodes' InternalIP, which the API server dials for logs/exec/port-forward:
                # loopback, where nothing listens on the kubelet port, so no such call leaves the machine.
                "--node-ip=127.0.0.1",
                # Renew a Lease per node like a kubelet does (kwok's default is none), or the
                # node-lifecycle controller marks the nodes unreachable after its grace period.
                "--node-lease-duration-seconds=40",
            ],
            # kwok also reads ~/.kwok/kwok.yaml; a developer's own file must not change the test bed.
            env={**os.environ, "HOME": str(self.workdir)},
        )

    def _create_nodes_and_storage(self) -> None:
        self.request("POST", "/apis/storage.k8s.io/v1/storageclasses", testbed_kwok.storage_class_manifest())
        for name in self.gpu_nodes:
            self.request("POST", "/api/v1/nodes", testbed_kwok.node_manifest(name, gpu=True))
        for name in self.cpu_nodes:
            self.request("POST", "/api/v1/nodes", testbed_kwok.node_manifest(name, gpu=False))

    def _nodes_schedulable(self) -> bool:
        ready = {
            node["metadata"]["name"]
            for node in self.request("GET", "/api/v1/nodes")["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )
            # The node-lifecycle controller lifts the not-ready taint once it sees the node Ready.
            and not node.get("spec", {}).get("taints")
        }
        return ready >= set(self.gpu_nodes + self.cpu_nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the local test bed until Ctrl-C.")
    parser.add_argument("--gpu-nodes", type=int, default=3)
    parser.add_argument("--cpu-nodes", type=int, default=2)
    parser.add_argument(
        "--real-node",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also start the real worker node (what `make cluster` does; needs root; hack/build-node.sh)",
    )
    args = parser.parse_args()

    # SIGTERM (a supervisor) and SIGHUP (the terminal closed) stop the test bed like Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(0))
    # A shell starts background jobs with SIGINT ignored, and Python then keeps it ignored; Ctrl-C
    # (or a test's SIGINT) must stop the test bed wherever it was started from.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    print("starting the test bed ...", flush=True)
    try:
        with LocalCluster(
            gpu_nodes=args.gpu_nodes, cpu_nodes=args.cpu_nodes, real_node=args.real_node
        ) as cluster:
            real_node = f"\n{cluster.real_node.describe()}" if cluster.real_node else ""
            print(
                f"test bed up in {time.monotonic() - started:.1f} s: {len(cluster.gpu_nodes)} fake MI355X nodes "
                f"(8 x amd.com/gpu each), {len(cluster.cpu_nodes)} CPU nodes{real_node}\n"
                f"kubeconfig: {cluster.kubeconfig}\n"
                f"API server: {cluster.server}\n"
                f"component logs: {cluster.log_dir}\n\n"
                f"  export KUBECONFIG={cluster.kubeconfig} PATH={cluster.bin_dir}:$PATH; kubectl get nodes\n\n"
                "Ctrl-C stops it.",
                flush=True,
            )
            while True:
                signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        print("test bed stopped.", flush=True)


if __name__ == "__main__":
    main()
