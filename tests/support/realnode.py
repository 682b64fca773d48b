"""A real worker node for the local test bed (tests/support/cluster.py, `LocalCluster(real_node=True)`).

Next to kwok's fake nodes, one node runs pods for real: kubelet and kube-proxy (the control plane's
Kubernetes release), containerd with Debian's runc, the CNI bridge plugin, CoreDNS as a pod, and the
stand-in AMD GPU device plugin (hack/testbed/node/amdgpu-device-plugin), all built by
hack/build-node.sh. The node lives in namespaces of its own (network, mount, PID, UTS, IPC), made
by `unshare` around a pause process (the namespace holder):
  * network: only loopback, a bridge for the pods and one veth to the host. The host end holds the
    address the API server serves on (RealNode.api_host), the node end is the node's InternalIP; there is
    no default route and no masquerading, so nothing in the node reaches beyond this machine. The
    host routes the node's pod range to the node (so the API server and tests reach pod IPs).
    kube-proxy's nftables rules and the bridge live in the node's network namespace only;
  * mount: private tmpfs over /run, /var/lib and /var/log (the kubelet and containerd use fixed
    paths there: /var/lib/kubelet/device-plugins, /run/containerd), /var/lib/kubelet bound to the
    node's work directory;
  * PID: the holder is process 1. When it exits, or the test process dies (PDEATHSIG), the kernel
    kills every process of the node (containerd shims and containers included), and the mounts and
    network devices go with the namespaces. What remains is removed on stop: the node's cgroups.
Several test beds can run at once: each claims a slot (an abstract unix socket, released when the
process dies) that numbers its host link, pod range and cgroup.

Pods land on the node only with REAL_NODE_SELECTOR and REAL_NODE_TOLERATIONS (`on_real_node()`):
it is tainted, so the kwok-driven tests never see it. Images: PAUSE_IMAGE, COREDNS_IMAGE and the
test runtime image under RUNTIME_IMAGE_NAMES (the operator's default stage and vLLM images), built
locally (tests/support/oci_image.py, `runtime_image_entries`) and imported at every start. Volumes:
claims of STORAGE_CLASS get a fresh root-owned directory as a `local` PersistentVolume on the node
(LocalVolumeProvisioner), so fsGroup applies as on a fresh disk; `host_path_claim()` binds a claim
to an existing host directory (read-only data such as a model).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eagle3_api.common import DEFAULT_VLLM_IMAGE
from eagle3_api.draft_training import DEFAULT_RUNTIME_IMAGE
from eagle3_runtime.tiny_target import cache_root, ensure_tiny_target
from tests.support import oci_image, testbed_kwok, testbed_pki
from tests.support.kube_api import ApiError

if TYPE_CHECKING:
    from tests.support.cluster import LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-node.sh"
BIN_ENV = "EAGLE3_NODE_BIN"  # the script's output directory, when already built
BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "coredns",
    "pause",
    "amdgpu-device-plugin",
    "cni/bridge",
    "cni/host-local",
    "cni/loopback",
    "cni/portmap",
)
HOST_TOOLS = ("runc", "nft", "unshare", "nsenter", "ip", "mount", "ss")
# The node's processes as LocalCluster components (it stops them after the API server).
COMPONENTS = ("node-namespaces", "containerd", "kubelet", "kube-proxy", "amdgpu-device-plugin")

NODE_NAME = "real-node"
REAL_NODE_LABEL = "testbed.eagle3.dev/real-node"
REAL_NODE_SELECTOR = {REAL_NODE_LABEL: "true"}
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
# The env of vLLM pods that share the real node with other vLLM pods (serving tests). The KV cache in
# the machine's shared memory is kept small. And no OpenMP binding: vLLM's CPU build binds its worker
# to one core of the node's two ("auto" reserves the other), so every such pod piles onto core 0,
# where a starting server's worker got 0.6 s of CPU in 12 min beside a busy one (a canary that
# never came up); unbound, the kernel spreads them over both cores. With nothing to bind, the worker
# runs inside the engine process (as for the tests' local servers, tests/conftest.py): one import of
# vLLM and torch fewer per start. (The end-to-end DraftTraining's pods run one at a time and keep
# vLLM's defaults.)
VLLM_CPU_ENV = [
    {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"},
    {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
    {"name": "VLLM_ENABLE_V1_MULTIPROCESSING", "value": "0"},
]
REAL_NODE_TOLERATIONS = [
    {"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
]
# The AMD node labeller's labels, as on kwok's GPU nodes (the labeller itself does not run here).
NODE_LABELS = {
    **{k: v for k, v in testbed_kwok.GPU_NODE_LABELS.items() if k.startswith(("amd.com/", "feature."))},
    **REAL_NODE_SELECTOR,
}
GPUS = 4
# The stand-in device plugin gives each container the ids of its allocated devices in this variable.
GPU_IDS_ENV = "EAGLE3_TESTBED_GPU_IDS"

STORAGE_CLASS = "real-node-local"
VOLUME_PROVISIONER = "testbed.eagle3.dev/real-node-local"

CLUSTER_DOMAIN = "cluster.local"
CLUSTER_DNS_IP = "10.96.0.10"  # in the API server's --service-cluster-ip-range 10.96.0.0/16
IMAGE_PREFIX = "localhost/eagle3-testbed"
PAUSE_IMAGE = f"{IMAGE_PREFIX}/pause:1"
COREDNS_IMAGE = f"{IMAGE_PREFIX}/coredns:v1.15.0"
RUNTIME_IMAGE_NAMES = (DEFAULT_RUNTIME_IMAGE, DEFAULT_VLLM_IMAGE)
RUNTIME_UID = 1000  # the user of images/runtime/Dockerfile (gid 0, HOME /home/eagle3)
RUNTIME_HOME = "/home/eagle3"
# The chart's default operator image: values.yaml's image.repository, tagged with its appVersion.
CHART = REPO_ROOT / "helm" / "eagle3-operator"
OPERATOR_IMAGE = "{}:{}".format(
    yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"],
    yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"],
)
OPERATOR_UID = 65532  # the user of images/operator/Dockerfile

# Slots: each running real node takes one; it numbers the host link, pod range and cgroup.
SLOTS = 64
HOST_LINK_PREFIX = "e3rn"
CGROUP_PREFIX = "eagle3-realnode-"
# The kubelet evicts at these (its disk defaults, 10-15 % free, a shared development machine can
# reach for reasons that have nothing to do with the test bed).
EVICTION_HARD = {
    "memory.available": "100Mi",
    "nodefs.available": "1%",
    "nodefs.inodesFree": "1%",
    "imagefs.available": "1%",
    "imagefs.inodesFree": "1%",
}


class RealNodeError(RuntimeError):
    """The real node cannot be set up here (the message says what is missing)."""


def on_real_node(pod_spec: dict) -> dict:
    """pod_spec with the node selector and toleration that place it on the real node."""
    return {
        **pod_spec,
        "nodeSelector": {**pod_spec.get("nodeSelector", {}), **REAL_NODE_SELECTOR},
        "tolerations": [*pod_spec.get("tolerations", []), *REAL_NODE_TOLERATIONS],
    }


def _check_host() -> None:
    if os.geteuid() != 0:
        raise RealNodeError("the real node needs root (network and mount namespaces, cgroups)")
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        raise RealNodeError(f"{missing} not found on PATH: run hack/system-deps.sh")


@dataclass(frozen=True)
class Slot:
    """Addresses and names of one real node; `claim` holds it until the process exits."""

    index: int
    claim: socket.socket  # also held by the node's janitor, so the slot stays taken until it is clean

    @property
    def host_link(self) -> str:
        return f"{HOST_LINK_PREFIX}{self.index}"

    @property
    def host_ip(self) -> str:  # the API server binds here; pods reach it through the kubernetes Service
        return f"10.250.{self.index}.1"

    @property
    def node_ip(self) -> str:
        return f"10.250.{self.index}.2"

    @property
    def link_cidr(self) -> str:
        return f"10.250.{self.index}.0/30"

    @property
    def pod_cidr(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.245.{self.index}.1"

    @property
    def cgroup(self) -> str:
        return f"{CGROUP_PREFIX}{self.index}"

    @classmethod
    def claim_free(cls) -> Slot:
        for index in range(SLOTS):
            claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                # An abstract socket name is unique per network namespace and freed when its
                # owner exits, however it exits: a lock that leaves nothing behind.
                claim.bind(f"\0eagle3-realnode-slot-{index}")
            except OSError:
                claim.close()
                continue
            if Path(f"/sys/class/net/{HOST_LINK_PREFIX}{index}").exists():
                claim.close()  # someone made this link without the claim: leave it alone
                continue
            return cls(index, claim)
        raise RealNodeError(f"all {SLOTS} real-node slots are in use")


# What a node leaves on the host once its processes are gone, and how the janitor removes it:
#  * its cgroup ($1) in every hierarchy, deepest first, once the killed processes in it have exited
#    (a cgroup with tasks cannot be removed); prints "cgroups removed" or what is still busy;
#  * sockets of this machine still open to the node's link ($2) or its pods ($3), e.g. a killed API
#    server's retried FINs: their peers are gone, so they are ended (ss -K);
#  * the unreachable routes for those two ranges, which outlive the veth so that such a socket gets
#    "unreachable" here instead of following the default route out of the machine until then.
_CLEAN_UP = """
trap '' PIPE  # a dead test process no longer reads the report; carry on regardless
for attempt in $(seq 300); do
  left=
  for top in /sys/fs/cgroup/*/"$1" /sys/fs/cgroup/"$1"; do
    [ -d "$top" ] || continue
    find "$top" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$top" ] && left="$left $top"
  done
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -n "$left" ]; then echo "cgroups still busy after 30 s:$left"; else echo "cgroups removed"; fi
quiet=0
for attempt in $(seq 20); do  # up to 2 s, for processes killed with the node to close theirs
  if [ -n "$(ss -K -Htn state connected "( dst $2 or dst $3 )")" ]; then quiet=0; else quiet=$((quiet + 1)); fi
  [ "$quiet" -ge 3 ] && break
  sleep 0.1
done
ip route del unreachable "$2" metric 65535 2>/dev/null
ip route del unreachable "$3" metric 65535 2>/dev/null
exit 0
"""


def readable_by_pods(root: Path) -> None:
    """Let the pods' user (RUNTIME_UID) read everything under root, a host folder a claim serves
    (the cached tiny target's weights are the cache owner's only)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def _make_cgroup(name: str) -> None:
    """The node's cgroup root in every hierarchy (the kubelet requires it to exist)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            (hierarchy / name).mkdir()
            if hierarchy.name == "cpuset":  # a new cpuset has no CPUs or memory nodes until given some
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (hierarchy / name / knob).write_text((hierarchy / knob).read_text())


def _run(*args: str) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise RealNodeError(f"{shlex.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


# ---- images ---------------------------------------------------------------------------------------


def _python_image_entries(passwd: str, group: str) -> list[oci_image.Entry]:
    """What the test bed's Python images hold: /etc basics, this checkout's eagle3_api,
    eagle3_runtime and eagle3_operator under /opt/eagle3, and no Python of their own: the host's
    /usr and the test Python (python_prefixes(): the venv and its base) are bind-mounted read-only
    into every container (containerd's base runtime spec), at the paths the venv's scripts name."""
    return [
        oci_image.directory("etc"),
        oci_image.file("etc/passwd", passwd.encode()),
        oci_image.file("etc/group", group.encode()),
        oci_image.file("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n"),
        oci_image.directory("tmp", 0o1777),
        oci_image.directory("usr"),  # the host's /usr is mounted here
        *(oci_image.symlink(name, f"usr/{name}") for name in ("bin", "lib", "lib64", "sbin")),
        oci_image.directory("opt"),
        oci_image.directory("opt/eagle3"),
        oci_image.file("opt/eagle3/pyproject.toml", REPO_ROOT / "pyproject.toml"),
        *oci_image.tree("opt/eagle3/eagle3_api", REPO_ROOT / "eagle3_api"),
        *oci_image.tree("opt/eagle3/eagle3_runtime", REPO_ROOT / "eagle3_runtime"),
        oci_image.directory("opt/eagle3/operator"),
        *oci_image.tree("opt/eagle3/operator/eagle3_operator", REPO_ROOT / "operator" / "eagle3_operator"),
    ]


def _python_image_env(venv: str, path_prefix: str = "") -> dict[str, str]:
    return {
        "PATH": f"{path_prefix}{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        # This checkout's code, ahead of the venv's editable install (which points elsewhere).
        "PYTHONPATH": "/opt/eagle3:/opt/eagle3/operator",
        "PYTHONUNBUFFERED": "1",
    }


def runtime_image(venv: str) -> tuple[list[oci_image.Entry], oci_image.ImageConfig]:
    """The test runtime image: images/runtime/Dockerfile's user, env, workdir and entrypoint, and a
    `vllm` that runs vLLM's OpenAI server (only `vllm serve`)."""
    uid = RUNTIME_UID
    passwd = f"root:x:0:0:root:/root:/bin/sh\neagle3:x:{uid}:0::{RUNTIME_HOME}:/bin/sh\n"
    vllm_wrapper = (
        "#!/bin/sh\n"
        "# `vllm serve MODEL ARGS` as python -m vllm.entrypoints.openai.api_server: the vllm console\n"
        "# script of the CPU build (distribution vllm-cpu) cannot find its own distribution.\n"
        'if [ "$1" != serve ]; then echo "test image: only vllm serve is supported" >&2; exit 2; fi\n'
        "shift\n"
        'case "$1" in -*|"") ;; *) model=$1; shift; set -- --model "$model" "$@" ;; esac\n'
        'exec python -m vllm.entrypoints.openai.api_server "$@"\n'
    )
    entries = [
        *_python_image_entries(passwd, "root:x:0:\n"),
        oci_image.directory("home"),
        oci_image.directory(RUNTIME_HOME, 0o700, uid=uid),
        oci_image.directory("workspace", uid=uid),
        oci_image.directory("opt/eagle3/bin"),
        oci_image.file("opt/eagle3/bin/vllm", vllm_wrapper.encode(), 0o755),
    ]
    config = oci_image.ImageConfig(
        entrypoint=["eagle3"],
        cmd=["--help"],
        env={
            **_python_image_env(venv, path_prefix="/opt/eagle3/bin:"),
            "HOME": RUNTIME_HOME,
            "HF_HOME": f"{RUNTIME_HOME}/.cache/huggingface",
            "VLLM_ROCM_USE_AITER": "1",
            "HF_HUB_OFFLINE": "1",  # nothing can be downloaded here; fail fast instead of retrying
        },
        user=str(uid),
        workdir="/workspace",
    )
    return entries, config


def operator_image(venv: str) -> tuple[list[oci_image.Entry], oci_image.ImageConfig]:
    """The test operator image: images/operator/Dockerfile's user, env and entrypoint."""
    uid = OPERATOR_UID
    passwd = f"root:x:0:0:root:/root:/bin/sh\nnonroot:x:{uid}:{uid}::/home/nonroot:/sbin/nologin\n"
    group = f"root:x:0:\nnonroot:x:{uid}:\n"
    config = oci_image.ImageConfig(
        entrypoint=["eagle3-operator"],
        env={**_python_image_env(venv), "PYTHONDONTWRITEBYTECODE": "1"},
        user=f"{uid}:{uid}",
    )
    return _python_image_entries(passwd, group), config


def python_prefixes() -> list[str]:
    """The running Python's venv and base installation (as named and as resolved, since scripts and
    links name either), unless inside /usr, which is mounted anyway."""
    prefixes = {p for prefix in (sys.prefix, sys.base_prefix) for p in (prefix, os.path.realpath(prefix))}
    return sorted(p for p in prefixes if p != "/usr" and not p.startswith("/usr/"))


# ---- Kubernetes objects ---------------------------------------------------------------------------


def coredns_manifests() -> list[dict]:
    """CoreDNS as kubeadm deploys it, answering the cluster zone only (its build has no forward)."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": "kube-system"}
    corefile = (
        ".:53 {\n"
        "    errors\n"
        "    health {\n        lameduck 2s\n    }\n"
        "    ready\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        "        pods insecure\n        ttl 30\n    }\n"
        "    cache 30\n"
        "    loadbalance\n"
        "}\n"
    )
    probe = {"periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 3}
    pod_spec = on_real_node(
        {
            "serviceAccountName": "coredns",
            "priorityClassName": "system-cluster-critical",
            "dnsPolicy": "Default",
            "containers": [
                {
                    "name": "coredns",
                    "image": COREDNS_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["-conf", "/etc/coredns/Corefile"],
                    "ports": [
                        {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                    ],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "32Mi"},
                        "limits": {"memory": "170Mi"},
                    },
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}} | probe,
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
        }
    )
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": corefile}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta | {"labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": CLUSTER_DNS_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]


def storage_class_manifest() -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": VOLUME_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    }


class LocalVolumeProvisioner:
    """Provisions claims of STORAGE_CLASS on the real node, as an external provisioner would.

    The stand-in part is this loop (a few API calls a second); the rest is Kubernetes' own: the
    scheduler picks the node (WaitForFirstConsumer), the PV controller asks for a volume and binds
    it, the kubelet mounts the `local` volume and applies fsGroup. Each volume is a fresh directory
    owned by root, mode 0755, like the root of a new filesystem. A Released volume (its claim
    deleted) is deleted with its directory (reclaim policy Delete).
    """

    def __init__(self, cluster: LocalCluster, volumes_dir: Path, log: Path, interval: float = 0.5) -> None:
        self._cluster = cluster
        self._dir = volumes_dir
        self._log = log
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="real-node-provisioner", daemon=True)

    def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.sync()
            except Exception as error:  # logged with the test bed's other logs, and retried
                with self._log.open("a") as log:
                    log.write(f"{time.strftime('%H:%M:%S')} {error!r}\n")

    def sync(self) -> None:
        request = self._cluster.request
        volumes = request("GET", "/api/v1/persistentvolumes")["items"]
        mine = [v for v in volumes if v["spec"].get("storageClassName") == STORAGE_CLASS]
        bound_claims = {v["spec"]["claimRef"]["uid"] for v in mine if v["spec"].get("claimRef")}
        for claim in request("GET", "/api/v1/persistentvolumeclaims")["items"]:
            annotations = claim["metadata"].get("annotations", {})
            if (
                claim["spec"].get("storageClassName") == STORAGE_CLASS
                and claim["status"].get("phase") == "Pending"
                and annotations.get("volume.kubernetes.io/storage-provisioner") == VOLUME_PROVISIONER
                and annotations.get("volume.kubernetes.io/selected-node") == NODE_NAME
                and claim["metadata"]["uid"] not in bound_claims
            ):
                self._provision(claim)
        for volume in mine:
            if volume["status"].get("phase") == "Released":
                shutil.rmtree(volume["spec"]["local"]["path"], ignore_errors=True)
                request("DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}")

    def _provision(self, claim: dict) -> None:
        name = f"pvc-{claim['metadata']['uid']}"
        path = self._dir / name
        path.mkdir(mode=0o755, exist_ok=True)
        os.chmod(path, 0o755)  # whatever the umask
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {"pv.kubernetes.io/provisioned-by": VOLUME_PROVISIONER},
            },
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                "accessModes": claim["spec"]["accessModes"],
                "volumeMode": claim["spec"].get("volumeMode", "Filesystem"),
                "persistentVolumeReclaimPolicy": "Delete",
                "local": {"path": str(path)},
                "nodeAffinity": _node_affinity(),
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": claim["metadata"]["namespace"],
                    "name": claim["metadata"]["name"],
                    "uid": claim["metadata"]["uid"],
                },
            },
        }
        self._cluster.request("POST", "/api/v1/persistentvolumes", volume)


def _node_affinity() -> dict:
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


# ---- the node -------------------------------------------------------------------------------------


class RealNode:
    """One real node of a LocalCluster; the cluster calls prepare(), start(), ready() and cleanup()."""

    def __init__(self, bin_dir: Path) -> None:
        _check_host()
        self.bin_dir = bin_dir
        self.dir = Path()  # the node's work directory, set by prepare()
        self.name = NODE_NAME
        self.slot: Slot | None = None
        self._janitor: subprocess.Popen | None = None
        self.holder_pid = 0
        self.provisioner: LocalVolumeProvisioner | None = None

    # ---- addresses (valid after prepare) ------------------------------------------------------------

    @property
    def api_host(self) -> str:
        """The host address the API server binds to, which pods reach through the kubernetes Service."""
        return self._slot.host_ip

    @property
    def node_ip(self) -> str:
        return self._slot.node_ip

    @property
    def pod_cidr(self) -> str:
        return self._slot.pod_cidr

    @property
    def _slot(self) -> Slot:
        if self.slot is None:
            raise RealNodeError("the real node is not prepared")
        return self.slot

    # ---- lifecycle ----------------------------------------------------------------------------------

    def prepare(self, workdir: Path, spawn: Callable[..., subprocess.Popen]) -> None:
        """Before the control plane starts: the namespaces, mounts and network link of the node."""
        self.dir = workdir
        for sub in ("kubelet", "containerd", "pod-logs", "cni/net.d", "cni/ipam", "volumes"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.slot = Slot.claim_free()
        leftovers = (self._slot.cgroup, self._slot.link_cidr, self._slot.pod_cidr)
        cleanup = _run("sh", "-c", _CLEAN_UP, "cleanup", *leftovers)  # left if a janitor was killed too
        if cleanup.strip() != "cgroups removed":
            raise RealNodeError(f"slot {self._slot.index}: {cleanup.strip()}")
        # The janitor outlives this process: when the pipe closes (stop, or this process died) it
        # cleans up, then exits and so frees the slot.
        self._janitor = subprocess.Popen(
            ["sh", "-c", "read -r _; " + _CLEAN_UP, "janitor", *leftovers],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.dir / "janitor.log").open("wb"),
            pass_fds=(self._slot.claim.fileno(),),
            start_new_session=True,
            text=True,
        )
        _make_cgroup(self._slot.cgroup)
        setup = " && ".join(
            [
                f"echo {self.name} > /proc/sys/kernel/hostname",  # what hostNetwork pods see
                "mount -t tmpfs -o mode=0755 node-run /run",
                "mount -t tmpfs -o mode=0755 node-var-lib /var/lib",
                "mount -t tmpfs -o mode=0755 node-var-log /var/log",
                "mkdir /var/lib/kubelet",
                f"mount --bind {shlex.quote(str(self.dir / 'kubelet'))} /var/lib/kubelet",
                f"exec {shlex.quote(str(self.bin_dir / 'pause'))}",
            ]
        )
        # --kill-child: the holder dies with unshare, which dies with this process (PDEATHSIG).
        unshare = "unshare --mount --net --pid --uts --ipc --fork --mount-proc --kill-child --propagation private --"
        holder = spawn("node-namespaces", [*unshare.split(), "sh", "-c", setup])
        self.holder_pid = self._wait_for_holder(holder)
        self._make_link()

    def _wait_for_holder(self, unshare: subprocess.Popen, timeout: float = 10.0) -> int:
        """The pid of the holder (unshare's child) once it runs pause, i.e. after its mounts."""
        deadline = time.monotonic() + timeout
        pause = os.path.realpath(self.bin_dir / "pause")
        while time.monotonic() < deadline:
            if unshare.poll() is not None:
                raise RealNodeError(
                    f"unshare exited with code {unshare.returncode} (log node-namespaces.log)"
                )
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
                if children and os.readlink(f"/proc/{children[0]}/exe") == pause:
                    return int(children[0])
            time.sleep(0.01)
        raise RealNodeError("the node's namespace holder did not start (log node-namespaces.log)")

    def _make_link(self) -> None:
        slot = self._slot
        in_node = ["nsenter", f"--target={self.holder_pid}", "--net", "--"]
        _run(*f"ip link add {slot.host_link} type veth peer name eth0 netns {self.holder_pid}".split())
        # IPv6 off on the host end: nothing to solicit or announce on a link that carries IPv4 only.
        Path(f"/proc/sys/net/ipv6/conf/{slot.host_link}/disable_ipv6").write_text("1")
        _run("ip", "addr", "add", f"{slot.host_ip}/30", "dev", slot.host_link)
        _run("ip", "link", "set", slot.host_link, "up")
        node_setup = " && ".join(
            [
                "ip link set lo up",
                f"ip addr add {slot.node_ip}/30 dev eth0",
                "ip link set eth0 up",
                # Forwarding between the pod bridge and the link, inside the node only; bridged pod
                # traffic goes through netfilter so Service replies between pods are un-NATed.
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
                "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables",
                "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6",
            ]
        )
        _run(*in_node, "sh", "-c", node_setup)
        _run("ip", "route", "add", slot.pod_cidr, "via", slot.node_ip, "dev", slot.host_link)
        for cidr in (slot.link_cidr, slot.pod_cidr):  # see _CLEAN_UP
            _run("ip", "route", "add", "unreachable", cidr, "metric", "65535")

    def start(
        self,
        cluster: LocalCluster,
        spawn: Callable[..., subprocess.Popen],
        wait: Callable[[str, Callable[[], object]], None],
        ca: testbed_pki.CertificateAuthority,
    ) -> None:
        """After the API server is up: the node's daemons, images, CoreDNS and storage.

        spawn(name, args, env) starts a component; wait(what, predicate) waits for a step.
        """
        slot = self._slot
        node_env = {
            "PATH": f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.dir),
            "LANG": "C.UTF-8",
        }  # no HTTP(S)_PROXY: the node talks to this machine only

        def in_node(*args: str) -> list[str]:
            return ["nsenter", f"--target={self.holder_pid}", "--mount", "--net", "--pid", "--", *args]

        kubelet_client = ca.issue("kubelet-client", f"system:node:{self.name}", organization="system:nodes")
        kubelet_serving = ca.issue(
            "kubelet-serving", f"system:node:{self.name}", server_hosts=(self.name, slot.node_ip)
        )
        proxy_client = ca.issue("kube-proxy", "system:kube-proxy")
        kubeconfig = testbed_pki.write_kubeconfigs(
            self.dir,
            server=cluster.server,
            ca=ca.pair.cert,
            clients={"kubelet": kubelet_client, "kube-proxy": proxy_client},
        )

        self._write_containerd_config()
        spawn(
            "containerd",
            in_node(self._bin("containerd"), f"--config={self.dir / 'containerd.toml'}"),
            env=node_env,
        )
        images = self._build_images()  # meanwhile; cached after the first start
        # The kubelet gives up at once when the runtime's socket is not there yet.
        wait(
            "containerd's socket", Path(f"/proc/{self.holder_pid}/root/run/containerd/containerd.sock").exists
        )
        for archive in images:
            _run(*in_node(self._bin("ctr"), "--namespace=k8s.io", "images", "import", str(archive)))
        self._write_kubelet_config(ca.pair.cert, kubelet_serving)
        spawn(
            "kubelet",
            in_node(
                self._bin("kubelet"),
                f"--config={self.dir / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig['kubelet']}",
                f"--hostname-override={self.name}",
                f"--node-ip={slot.node_ip}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in NODE_LABELS.items()),
            ),
            env=node_env,
        )
        self._write_kube_proxy_config(kubeconfig["kube-proxy"])
        spawn(
            "kube-proxy",
            in_node(self._bin("kube-proxy"), f"--config={self.dir / 'kube-proxy.yaml'}"),
            env=node_env,
        )

        cluster.request("POST", "/apis/storage.k8s.io/v1/storageclasses", storage_class_manifest())
        cluster.apply(coredns_manifests())
        self.provisioner = LocalVolumeProvisioner(
            cluster, self.dir / "volumes", cluster.log_dir / "real-node-provisioner.log"
        )
        self.provisioner.start()
        # The kubelet creates its registration socket at start; the plugin registers through it.
        wait(
            "the kubelet's device-plugin socket",
            (self.dir / "kubelet" / "device-plugins" / "kubelet.sock").exists,
        )
        spawn(
            "amdgpu-device-plugin",
            in_node(self._bin("amdgpu-device-plugin"), f"--devices={GPUS}", f"--env={GPU_IDS_ENV}"),
            env=node_env,
        )

    def ready(self, cluster: LocalCluster) -> bool:
        """Node Ready with its GPUs, and CoreDNS Ready (which needs pod networking and the Services).
        Not yet, too, while the kubelet has not registered the node (a 404)."""
        try:
            node = cluster.request("GET", f"/api/v1/nodes/{self.name}")
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        status = node.get("status", {})
        node_ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        gpus = status.get("allocatable", {}).get(testbed_kwok.GPU_RESOURCE) == str(GPUS)
        if not (node_ready and gpus):
            return False
        deployment = cluster.request("GET", "/apis/apps/v1/namespaces/kube-system/deployments/coredns")
        return deployment.get("status", {}).get("readyReplicas", 0) >= 1

    def stop_provisioner(self) -> None:
        if self.provisioner is not None:
            self.provisioner.stop()
            self.provisioner = None

    def cleanup(self) -> None:
        """After every process of the node has been signalled: its janitor removes what is left
        (cgroups, sockets to the node, its routes) and frees the slot."""
        self.stop_provisioner()
        if self.slot is None:
            return
        janitor, self._janitor = self._janitor, None
        self.slot.claim.close()
        self.slot = None
        if janitor is not None:
            report, _ = janitor.communicate(timeout=40)  # closing its stdin sets it to work
            if report.splitlines()[:1] != ["cgroups removed"]:
                raise RealNodeError(f"cleaning up the real node: {report.strip() or 'the janitor failed'}")

    # ---- configuration ------------------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _build_images(self) -> list[Path]:
        cache = cache_root() / "images"
        pause = oci_image.build(
            cache,
            [PAUSE_IMAGE],
            [oci_image.file("pause", self.bin_dir / "pause", 0o755)],
            oci_image.ImageConfig(entrypoint=["/pause"]),
        )
        coredns = oci_image.build(
            cache,
            [COREDNS_IMAGE],
            [oci_image.file("coredns", self.bin_dir / "coredns", 0o755)],
            oci_image.ImageConfig(entrypoint=["/coredns"]),
        )
        runtime = oci_image.build(cache, list(RUNTIME_IMAGE_NAMES), *runtime_image(sys.prefix))
        operator = oci_image.build(cache, [OPERATOR_IMAGE], *operator_image(sys.prefix))
        return [pause, coredns, runtime, operator]

    def _base_runtime_spec(self) -> Path:
        """containerd's default container spec plus read-only mounts of the host's /usr and Python."""
        spec = json.loads(_run(self._bin("ctr"), "oci", "spec"))
        # What the CRI plugin strips from that default when no base spec is configured (it keeps
        # a base spec's): the 1024-file limit (containers get containerd's own), AppArmor, seccomp.
        spec["process"].pop("rlimits", None)
        spec["process"].pop("apparmorProfile", None)
        spec["linux"].pop("seccomp", None)
        for path in ["/usr", *python_prefixes()]:
            spec["mounts"].append(
                {
                    "destination": path,
                    "type": "bind",
                    "source": path,
                    "options": ["rbind", "ro", "nosuid", "nodev"],
                }
            )
        target = self.dir / "base-runtime-spec.json"
        target.write_text(json.dumps(spec, indent=1))
        return target

    def _write_containerd_config(self) -> None:
        slot = self._slot
        conflist = {
            "cniVersion": "1.0.0",
            "name": "eagle3-testbed",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,  # nothing leaves the node; the host routes the pod range back
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": slot.pod_cidr, "gateway": slot.pod_gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
            ],
        }
        (self.dir / "cni" / "net.d" / "10-eagle3-testbed.conflist").write_text(json.dumps(conflist, indent=1))
        cri_runtime = {
            "enable_selinux": False,
            # Sandboxes get oom_score_adj -998, critical pods -997; lowering it needs
            # CAP_SYS_RESOURCE, which the machines this runs on withhold from every process. Keep
            # each container's at least containerd's own (0) instead of failing to create it.
            "restrict_oom_score_adj": True,
            "tolerate_missing_hugetlb_controller": True,
            "disable_hugetlb_controller": True,
            "containerd": {
                "default_runtime_name": "runc",
                "runtimes": {
                    "runc": {
                        "runtime_type": "io.containerd.runc.v2",
                        "base_runtime_spec": str(self._base_runtime_spec()),
                        "options": {"SystemdCgroup": False, "BinaryName": shutil.which("runc")},
                    }
                },
            },
            "cni": {
                "bin_dirs": [str(self.bin_dir / "cni")],
                "conf_dir": str(self.dir / "cni" / "net.d"),
                "use_internal_loopback": True,
            },
        }
        config = {
            "version": 4,
            "root": str(self.dir / "containerd"),
            "state": "/run/containerd",
            "imports": [],
            "grpc": {"address": "/run/containerd/containerd.sock"},
            # Plugins a test bed does not use: each costs start time or probes the host.
            "disabled_plugins": [
                "io.containerd.snapshotter.v1.blockfile",
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.erofs",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.tracing.processor.v1.otlp",
                "io.containerd.internal.v1.tracing",
                "io.containerd.nri.v1.nri",
            ],
            "plugins": {
                "io.containerd.cri.v1.images": {
                    "snapshotter": "overlayfs",
                    "pinned_images": {"sandbox": PAUSE_IMAGE},
                },
                "io.containerd.cri.v1.runtime": cri_runtime,
                "io.containerd.grpc.v1.cri": {
                    "stream_server_address": "127.0.0.1",
                    "stream_server_port": "0",
                },
                "io.containerd.internal.v1.opt": {"path": str(self.dir / "containerd" / "opt")},
            },
        }
        (self.dir / "containerd.toml").write_text(_toml(config))

    def _write_kubelet_config(self, ca_cert: Path, serving: testbed_pki.KeyPair) -> None:
        (self.dir / "resolv.conf").write_text("")  # the host's resolver must not reach any pod
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 (hybrid) here; kubelet 1.35+ refuses it unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self._slot.cgroup}",
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "address": self._slot.node_ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": CLUSTER_DOMAIN,
            "clusterDNS": [CLUSTER_DNS_IP],
            "resolvConf": str(self.dir / "resolv.conf"),
            "registerWithTaints": [REAL_NODE_TAINT],
            "podLogsDir": str(self.dir / "pod-logs"),
            "evictionHard": EVICTION_HARD,
            # Never garbage-collect the imported images: nothing could pull them again.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "shutdownGracePeriod": "0s",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "oomScoreAdj": 0,  # not -999: see restrict_oom_score_adj
        }
        (self.dir / "kubelet.yaml").write_text(yaml.safe_dump(config))

    def _write_kube_proxy_config(self, kubeconfig: Path) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": self.name,
            "mode": "nftables",
            "clusterCIDR": self._slot.pod_cidr,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            "oomScoreAdj": 0,  # not -999: see restrict_oom_score_adj
            # Leave conntrack's table size and timeouts alone (the table size is machine-wide).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (self.dir / "kube-proxy.yaml").write_text(yaml.safe_dump(config))

    # ---- helpers for tests ----------------------------------------------------------------------------

    def host_path_claim(
        self, cluster: LocalCluster, namespace: str, claim: str, host_path: Path, *, read_only: bool = True
    ) -> None:
        """A claim bound to an existing host directory (a hostPath volume: no fsGroup ownership change,
        so shared data such as a cached model keeps its owner); the pod reads it as pvc://CLAIM/..."""
        mode = "ReadOnlyMany" if read_only else "ReadWriteOnce"
        name = f"host-{uuid.uuid4().hex[:10]}"
        cluster.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "storageClassName": "",
                    "capacity": {"storage": "1Gi"},
                    "accessModes": [mode],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(host_path), "type": "Directory"},
                    "nodeAffinity": _node_affinity(),
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            },
        )
        cluster.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/persistentvolumeclaims",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim},
                "spec": {
                    "storageClassName": "",
                    "volumeName": name,
                    "accessModes": [mode],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )

    def host_folder_claims(
        self, cluster: LocalCluster, namespace: str, root: Path, *, tiny_target: str | None = None
    ) -> None:
        """One read-only claim per folder under root, named as the folder and bound to it (a pod reads
        root/CLAIM/PATH as pvc://CLAIM/PATH), after copying the cached tiny target to root/TINY_TARGET
        when asked and letting the pods' user read everything under root."""
        if tiny_target:
            shutil.copytree(ensure_tiny_target(), root / tiny_target)
        readable_by_pods(root)
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            self.host_path_claim(cluster, namespace, folder.name, folder)

    def kill_container(self, container_id: str) -> None:
        """SIGKILL a container's main process as the kernel's OOM killer or a crash would end it: no
        SIGTERM, no preStop hook, no grace period. container_id is a pod status's `containerd://ID`."""
        runtime, _, task = container_id.partition("://")
        if runtime != "containerd" or not task:
            raise RealNodeError(f"not a containerd container: {container_id!r}")
        ctr = [self._bin("ctr"), "--namespace=k8s.io", "tasks", "kill", "--signal=SIGKILL", task]
        _run("nsenter", f"--target={self.holder_pid}", "--mount", "--pid", "--", *ctr)

    def describe(self) -> str:
        """How to reach the node (printed by `make cluster`)."""
        return (
            f"real node {self.name}: InternalIP {self.node_ip}, pods {self.pod_cidr} (routed from this host), "
            f"{GPUS} x {testbed_kwok.GPU_RESOURCE} (stand-in device plugin)\n"
            f"  schedule onto it with nodeSelector {REAL_NODE_LABEL}=true and a toleration of the taint "
            f"{REAL_NODE_LABEL}=true:NoSchedule; storage class {STORAGE_CLASS}\n"
            f"  images: {', '.join(RUNTIME_IMAGE_NAMES)} (test runtime image), {OPERATOR_IMAGE}\n"
            f"  node shell: nsenter --target={self.holder_pid} --mount --net --pid --uts --ipc -- sh\n"
            f"  containers: nsenter --target={self.holder_pid} --mount -- {self._bin('ctr')} -n k8s.io containers ls"
        )


def _toml(config: dict) -> str:
    """TOML for containerd's config: nested tables of strings, booleans, integers and string lists."""
    lines: list[str] = []

    def value(item: Any) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, int):
            return str(item)
        if isinstance(item, list):
            return "[" + ", ".join(value(v) for v in item) + "]"
        return json.dumps(str(item))

    def table(prefix: list[str], body: dict) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        if prefix:
            lines.append("[" + ".".join(json.dumps(p) for p in prefix) + "]")
        lines.extend(f"{json.dumps(k)} = {value(v)}" for k, v in scalars.items())
        for key, sub in body.items():
            if isinstance(sub, dict):
                table([*prefix, key], sub)

    table([], config)
    return "\n".join(lines) + "\n"
