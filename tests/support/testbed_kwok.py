"""What kwok plays in the local test bed: the fake nodes and the lifecycle stages of their pods.

Fake nodes look like an AMD Instinct MI355X cluster as the AMD GPU operator labels it (device
plugin resource `amd.com/gpu`, node-labeller labels, NFD label) plus CPU-only nodes. kwok keeps
their leases fresh, so the real node-lifecycle controller sees them Ready.

Pod lifecycle (kwok stands in for the kubelet; no container runs):
  * a pod bound to a fake node becomes Running (init containers Completed, pod IP assigned);
  * a Running pod owned by a Job becomes Succeeded after JOB_POD_RUN_MS, exit code 0, unless it is
    *manual*: labelled MANUAL_LABEL=true or in a namespace whose name starts with
    MANUAL_NAMESPACE_PREFIX. Manual pods stay Running until a test ends them with
    LocalCluster.complete_pod / fail_pod (so kwok can never race a test's termination message);
  * a pod being deleted is removed at once (what the kubelet does after its containers stop).
Pods that no Job owns stay Running until deleted or ended by a test.

Volumes: kwok also plays an external volume provisioner for the StorageClass STORAGE_CLASS (not
the default class, so claims without a class are untouched). Once the real PV controller marks a
claim of that class for provisioning, kwok creates a PersistentVolume for it, which the PV
controller binds; when a claim is deleted, kwok deletes its Released volume (reclaim policy
Delete). No data is stored anywhere: no container mounts the volumes.
"""

from __future__ import annotations

import yaml

FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
MANUAL_LABEL = "testbed.eagle3.dev/manual"
MANUAL_NAMESPACE_PREFIX = "manual-"
JOB_POD_RUN_MS = 1000

STORAGE_CLASS = "fake-local"
VOLUME_PROVISIONER = "testbed.eagle3.dev/fake-volume"

GPU_RESOURCE = "amd.com/gpu"
GPUS_PER_NODE = 8
GPU_PRODUCT = "AMD_Instinct_MI355X"
# What the AMD node labeller and NFD put on an MI355X node (values as the labeller formats them).
GPU_NODE_LABELS = {
    "amd.com/gpu.product-name": GPU_PRODUCT,
    "amd.com/gpu.family": "AI",
    "amd.com/gpu.device-id": "75a3",
    "amd.com/gpu.vram": "288G",
    "amd.com/gpu.cu-count": "256",
    "amd.com/gpu.driver-version": "6.14.14",
    "feature.node.kubernetes.io/amd-gpu": "true",
    "node.kubernetes.io/instance-type": "mi355x.8x",
}
GPU_NODE_CAPACITY = {
    "cpu": "192",
    "memory": "3Ti",
    "ephemeral-storage": "30Ti",
    "pods": "110",
    GPU_RESOURCE: str(GPUS_PER_NODE),
}
CPU_NODE_LABELS = {"node.kubernetes.io/instance-type": "cpu.32x"}
CPU_NODE_CAPACITY = {"cpu": "32", "memory": "128Gi", "ephemeral-storage": "1Ti", "pods": "110"}

# gojq expression that is true for pods a test ends itself.
_IS_MANUAL = (
    f'(.metadata.labels["{MANUAL_LABEL}"] == "true")'
    f' or ((.metadata.namespace // "") | startswith("{MANUAL_NAMESPACE_PREFIX}"))'
)


def node_manifest(name: str, *, gpu: bool) -> dict:
    """A Node object kwok manages; status capacity/allocatable are kept by kwok's stages."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        **(GPU_NODE_LABELS if gpu else CPU_NODE_LABELS),
    }
    capacity = GPU_NODE_CAPACITY if gpu else CPU_NODE_CAPACITY
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": dict([FAKE_NODE_ANNOTATION])},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def _stage(name: str, kind: str, match: list[dict], steps: list[dict], delay_ms: int | None = None) -> dict:
    spec: dict = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": match},
        "steps": steps,
    }
    if delay_ms is not None:
        spec["delay"] = {"durationMilliseconds": delay_ms}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _status_patch(template: str) -> dict:
    return {"patch": {"subresource": "status", "root": "status", "template": template}}


_NODE_READY = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ NodeName | Quote }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
conditions:
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}
{{ end }}
"""

_POD_SUCCEEDED = """\
{{ $now := Now }}
phase: Succeeded
conditions:
- {type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
containerStatuses:
{{ range .status.containerStatuses }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ or $.status.startTime $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
"""


def storage_class_manifest() -> dict:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": VOLUME_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": True,
    }


_PROVISIONED_VOLUME = f"""\
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pvc-{{{{ .metadata.uid }}}}
  annotations:
    pv.kubernetes.io/provisioned-by: {VOLUME_PROVISIONER}
spec:
  storageClassName: {{{{ .spec.storageClassName | Quote }}}}
  accessModes: [{{{{ range $i, $mode := .spec.accessModes }}}}{{{{ if $i }}}}, {{{{ end }}}}{{{{ $mode | Quote }}}}{{{{ end }}}}]
  capacity: {{storage: {{{{ .spec.resources.requests.storage | Quote }}}}}}
  volumeMode: {{{{ or .spec.volumeMode "Filesystem" | Quote }}}}
  persistentVolumeReclaimPolicy: Delete
  claimRef:
    apiVersion: v1
    kind: PersistentVolumeClaim
    namespace: {{{{ .metadata.namespace | Quote }}}}
    name: {{{{ .metadata.name | Quote }}}}
    uid: {{{{ .metadata.uid | Quote }}}}
  hostPath: {{path: "/var/lib/eagle3-testbed/pvc-{{{{ .metadata.uid }}}}"}}
"""


def stages() -> list[dict]:
    not_deleting = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    return [
        _stage(
            "node-ready",
            "Node",
            [
                {
                    "key": '.status.conditions.[] | select(.type == "Ready") | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                }
            ],
            [_status_patch(_NODE_READY)],
        ),
        _stage(
            "pod-running",
            "Pod",
            [not_deleting, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
            [_status_patch(_POD_RUNNING)],
        ),
        _stage(
            "job-pod-succeeded",
            "Pod",
            [
                not_deleting,
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
                {"key": _IS_MANUAL, "operator": "NotIn", "values": ["true"]},
            ],
            [_status_patch(_POD_SUCCEEDED)],
            delay_ms=JOB_POD_RUN_MS,
        ),
        _stage(
            "pod-removed",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            [{"delete": True}],
        ),
        _stage(
            "volume-provisioned",
            "PersistentVolumeClaim",
            [
                not_deleting,
                {"key": ".spec.volumeName", "operator": "DoesNotExist"},
                # Set by the PV controller once it wants an external provisioner to act.
                {
                    "key": '.metadata.annotations["volume.kubernetes.io/storage-provisioner"]',
                    "operator": "In",
                    "values": [VOLUME_PROVISIONER],
                },
            ],
            [{"apply": {"template": _PROVISIONED_VOLUME}}],
        ),
        _stage(
            "volume-reclaimed",
            "PersistentVolume",
            [
                not_deleting,
                {"key": ".status.phase", "operator": "In", "values": ["Released"]},
                {"key": ".spec.persistentVolumeReclaimPolicy", "operator": "In", "values": ["Delete"]},
                {
                    "key": '.metadata.annotations["pv.kubernetes.io/provisioned-by"]',
                    "operator": "In",
                    "values": [VOLUME_PROVISIONER],
                },
            ],
            [{"delete": True}],
        ),
    ]


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the templates) as readable `|` blocks."""


_BlockDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def config_yaml() -> str:
    """The file given to `kwok --config`: every stage kwok plays (kwok has no built-in ones)."""
    return yaml.dump_all(stages(), Dumper=_BlockDumper, sort_keys=False)


def is_manual(pod: dict) -> bool:
    """Python twin of the _IS_MANUAL expression, for pods as the API returns them (dicts)."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return labels.get(MANUAL_LABEL) == "true" or (metadata.get("namespace") or "").startswith(
        MANUAL_NAMESPACE_PREFIX
    )
