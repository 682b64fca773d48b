"""Pod statuses as kube-scheduler and the kubelet (v1.36) write them, for the planner unit tests.

The test bed's kwok nodes cannot pull images or restart containers, so image-pull and crash-loop
statuses are written here, field for field, from the kubelet's code (pkg/kubelet/images
image_manager.go: "Back-off pulling image %q" + ": " + the previous pull error;
kuberuntime_manager.go: "back-off %s restarting failed container=%s pod=%s", with
format.Pod = name_namespace(uid); kuberuntime_container.go: CreateContainerConfigError with the
secret manager's NotFound message). The unschedulable status is what the test bed's real
scheduler writes (tests/operator/test_stuck_cluster.py sees it live).
"""

from __future__ import annotations

import copy
from typing import Any

from tests.operator import fakes

STAMP = fakes.NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
SCHEDULER_MESSAGE = (
    "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling."
)


def _condition(type_: str, status: str, reason: str | None = None, message: str | None = None) -> dict:
    condition = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": STAMP}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _started_pod_conditions(container: str) -> list[dict]:
    unready = f"containers with unready status: [{container}]"
    return [
        _condition("PodReadyToStartContainers", "True"),
        _condition("Initialized", "True"),
        _condition("Ready", "False", "ContainersNotReady", unready),
        _condition("ContainersReady", "False", "ContainersNotReady", unready),
        _condition("PodScheduled", "True"),
    ]


def with_status(pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["status"] = status
    return out


def unschedulable() -> dict[str, Any]:
    return {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "conditions": [_condition("PodScheduled", "False", "Unschedulable", SCHEDULER_MESSAGE)],
    }


def _waiting(container: str, image: str, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "qosClass": "BestEffort",
        "hostIP": "10.0.0.5",
        "hostIPs": [{"ip": "10.0.0.5"}],
        "podIP": "10.244.1.7",
        "podIPs": [{"ip": "10.244.1.7"}],
        "startTime": STAMP,
        "conditions": _started_pod_conditions(container),
        "containerStatuses": [
            {
                "name": container,
                "image": image,
                "imageID": "",
                "lastState": {},
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
                "volumeMounts": [
                    {"name": "workspace", "mountPath": "/workspace"},
                    {
                        "name": "kube-api-access-x7k2p",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": True,
                        "recursiveReadOnly": "Disabled",
                    },
                ],
            }
        ],
    }


def _pull_error(image: str) -> str:
    return (
        f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
        f'reference "{image}": {image}: not found'
    )


def err_image_pull(container: str, image: str) -> dict[str, Any]:
    return _waiting(container, image, "ErrImagePull", _pull_error(image))


def image_pull_back_off(container: str, image: str) -> dict[str, Any]:
    message = f'Back-off pulling image "{image}": ErrImagePull: {_pull_error(image)}'
    return _waiting(container, image, "ImagePullBackOff", message)


def create_container_config_error(container: str, image: str, secret: str) -> dict[str, Any]:
    return _waiting(container, image, "CreateContainerConfigError", f'secret "{secret}" not found')


def crash_loop_back_off(pod: dict[str, Any], container: str, image: str, log_tail: str) -> dict[str, Any]:
    meta = pod["metadata"]
    status = _waiting(
        container,
        image,
        "CrashLoopBackOff",
        f"back-off 1m20s restarting failed container={container} "
        f"pod={meta['name']}_{meta['namespace']}({meta.get('uid', '0b6b7c1e-5d1f-4b7e-9a51-3f2d8c6a9e10')})",
    )
    (container_status,) = status["containerStatuses"]
    container_status |= {
        "containerID": "containerd://4f1c2b9e0d7a",
        "imageID": f"{image.split(':')[0]}@sha256:{'ab' * 32}",
        "restartCount": 4,
        "lastState": {
            "terminated": {
                "containerID": "containerd://4f1c2b9e0d7a",
                "exitCode": 1,
                "reason": "Error",
                "message": log_tail,  # terminationMessagePolicy FallbackToLogsOnError
                "startedAt": STAMP,
                "finishedAt": STAMP,
            }
        },
    }
    status["phase"] = "Running"
    return status
